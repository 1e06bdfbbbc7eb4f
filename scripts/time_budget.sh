#!/usr/bin/env bash
# "Which strategy to pick" (docs/results.md): full, unigram, rff per example, rff batch-shared, hsm and adaptive on
# WikiText-2 (33,278 types) and on the generated 10^6-type corpus, each for the same 7 minutes of training
# (experiment=time_budget), two streams side by side on the 2-core machine at one thread each, so that every run
# shares the machine with one other run. The streams hold about the same amount of work, so no run gets the
# machine alone. About 65 minutes. Afterwards:
#   python scripts/time_budget.py runs/time_budget/wt2 --out docs/study/time_wt2 --title "WikiText-2, 7 min"
#   python scripts/time_budget.py runs/time_budget/zipf1m --out docs/study/time_zipf1m --title "zipf 10^6, 7 min"
# Usage: LMTRAIN_DATA_DIR=../shared/data bash scripts/time_budget.sh [OUT=runs/time_budget]
set -euo pipefail
out=${1:-runs/time_budget}
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 LMTRAIN_CONCURRENT_JOBS=2
run() { python -m lmtrain experiment=time_budget progress_bar=false "$@"; }
wt2() { run data=wikitext2 "$@"; }
zipf() { run data=zipf data.vocab_size=1000000 trainer.limit_val_batches=20 "$@"; }

stream_a() {
    wt2 output=full hydra.run.dir="$out/wt2/full"
    wt2 output=unigram hydra.run.dir="$out/wt2/unigram"
    wt2 output=rff hydra.run.dir="$out/wt2/rff"
    wt2 output=rff output.shared_negatives=true hydra.run.dir="$out/wt2/rff_shared"
    wt2 output=hsm hydra.run.dir="$out/wt2/hsm"
    wt2 output=adaptive hydra.run.dir="$out/wt2/adaptive"
    zipf output=adaptive hydra.run.dir="$out/zipf1m/adaptive"
}
stream_b() {
    zipf output=full hydra.run.dir="$out/zipf1m/full"
    zipf output=unigram hydra.run.dir="$out/zipf1m/unigram"
    zipf output=rff hydra.run.dir="$out/zipf1m/rff"
    zipf output=rff output.shared_negatives=true hydra.run.dir="$out/zipf1m/rff_shared"
    zipf output=hsm hydra.run.dir="$out/zipf1m/hsm"
}
mkdir -p "$out"
stream_a > "$out/stream_a.log" 2>&1 &
stream_b > "$out/stream_b.log" 2>&1
wait

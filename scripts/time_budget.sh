#!/usr/bin/env bash
# "Which strategy to pick" (docs/results.md): full, unigram, rff per example, rff batch-shared, hsm and adaptive on
# WikiText-2 (33,278 types) and on the generated 10^6-type corpus, each for the same 7 minutes of training
# (experiment=time_budget), two streams side by side on the 2-core machine at one thread each, so that every run
# shares the machine with one other run. The streams hold about the same amount of work, so no run gets the
# machine alone. About 65 minutes. Afterwards:
#   python -m lmtrain.time_budget runs/time_budget/wt2 --out docs/study/time_wt2 --title "WikiText-2, 7 min"
#   python -m lmtrain.time_budget runs/time_budget/zipf1m --out docs/study/time_zipf1m --title "zipf 10^6, 7 min"
# Usage: LMTRAIN_DATA_DIR=../shared/data bash scripts/time_budget.sh [OUT=runs/time_budget]
set -euo pipefail
out=${1:-runs/time_budget}
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 LMTRAIN_CONCURRENT_JOBS=2
run() { python -m lmtrain experiment=time_budget progress_bar=false "$@"; }
wt2() { run data=wikitext2 "$@"; }
zipf() { run data=zipf data.vocab_size=1000000 trainer.limit_val_batches=20 "$@"; }

overrides() { if [ "$1" = rff_shared ]; then echo "output=rff output.shared_negatives=true"; else echo "output=$1"; fi; }
each() {  # each CORPUS FOLDER NAME...: one run of each named strategy on that corpus, into $out/FOLDER/NAME
    local corpus=$1 folder=$2 name
    shift 2
    for name in "$@"; do
        # shellcheck disable=SC2046  # the overrides are words
        $corpus $(overrides "$name") hydra.run.dir="$out/$folder/$name"
    done
}
stream_a() { each wt2 wt2 full unigram rff rff_shared hsm adaptive; each zipf zipf1m adaptive; }
stream_b() { each zipf zipf1m full unigram rff rff_shared hsm; }
mkdir -p "$out"
stream_a > "$out/stream_a.log" 2>&1 &
stream_b > "$out/stream_b.log" 2>&1
wait

#!/usr/bin/env bash
# The strategy study of docs/results.md (issue 7): every run is `experiment=ptb_study` (2x200 LSTM, 1,000 SGD
# steps of 20 x 20 tokens, validated every 250 steps), one thread per run, two streams side by side on the
# 2-core development machine, then a small learning-rate check for the strategies that diverged at lr 1.
# Tables and PNGs afterwards (see docs/results.md):
#   python scripts/summarize.py runs/study/ptb --num-samples 100 --out docs/study/ptb_m100
#   python scripts/summarize.py runs/study/ptb --outputs full,uniform,unigram,quadratic,rff --out docs/study/ptb_samples
#   python scripts/summarize.py runs/study/wt2 --out docs/study/wt2
#   python scripts/summarize.py runs/study/bias_init --out docs/study/bias_init
#   python scripts/summarize.py runs/study/ptb_3ep --out docs/study/ptb_3ep     (with THREE_EPOCHS=1)
# Usage: LMTRAIN_DATA_DIR=../shared/data [THREE_EPOCHS=1] bash scripts/study.sh [OUT=runs/study]
set -euo pipefail
out=${1:-runs/study}
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
study() { python -m lmtrain -m experiment=ptb_study progress_bar=false "$@"; }

stream_a() {
    study output=quadratic ++output.num_samples=10,30,100,300 hydra.sweep.dir="$out/ptb/quadratic"
    study output=uniform,unigram ++output.num_samples=10,30,300 hydra.sweep.dir="$out/ptb/sample_sizes"
}
stream_b() {
    study output=full,exp,uniform,unigram,nce,negative,hsm,adaptive hydra.sweep.dir="$out/ptb/m100"
    study output=rff ++output.num_samples=10,30,100,300 hydra.sweep.dir="$out/ptb/rff"
    study data=wikitext2 output=full,unigram,rff,hsm,adaptive hydra.sweep.dir="$out/wt2"
}
controls() {  # the rff and quadratic models (tau cos, |o| logits) trained with their exact softmax proposal
    study output=rff,quadratic sampler=softmax hydra.sweep.dir="$out/controls/exact_proposal"
    study output=rff optim.lr=0.1,0.3 hydra.sweep.dir="$out/controls/rff_lower_lr"  # the LSTM saturated at lr 1
}
bias_init() {  # output biases from zero or from the log unigram (the default of nce and negative)
    study output=full,unigram,nce,negative ++output.bias_init=zero,log_unigram hydra.sweep.dir="$out/bias_init"
}
lower_lr() {  # not part of the main tables: does a smaller step size rescue the strategies that diverged?
    study output=uniform optim.lr=0.1,0.3 hydra.sweep.dir="$out/controls/lower_lr"
    study output=nce,negative ++output.bias_init=zero optim.lr=0.1,0.3 hydra.sweep.dir="$out/controls/lower_lr_zero_bias"
    study output=uniform optim.clip=null hydra.sweep.dir="$out/controls/uniform_no_clip"  # is clipping the cause?
}
three_epochs() {  # the m = 100 table again for 3 epochs (rff at lr 0.3: at lr 1 its LSTM saturates); about 2 hours
    study3() { python -m lmtrain -m experiment=ptb_study_3ep progress_bar=false "$@"; }
    study3 output=quadratic,exp hydra.sweep.dir="$out/ptb_3ep/a" > "$out.3a.log" 2>&1 &
    { study3 output=full,uniform,unigram,nce,negative,hsm,adaptive hydra.sweep.dir="$out/ptb_3ep/b"
      study3 output=rff optim.lr=0.3 hydra.sweep.dir="$out/ptb_3ep/c"; } > "$out.3b.log" 2>&1
    wait
}
stream_a > "$out.a.log" 2>&1 &
stream_b > "$out.b.log" 2>&1 &
{ lower_lr; controls; bias_init; } > "$out.c.log" 2>&1 &
wait
if [ "${THREE_EPOCHS:-0}" = 1 ]; then three_epochs; fi

"""Exact resume for every strategy family, through the command line: a run SIGKILLed after a checkpoint and resumed
with ckpt_path=last ends with the metrics of the same run left uninterrupted."""

from __future__ import annotations

import math
import signal
import subprocess

import pytest

from tests.cli_runs import TINY, cli_env, lmtrain, run_cli, run_info

STEPS, EVERY, KILL_AT = 40, 10, 25  # the kill comes 5 steps after the checkpoint of step 20
# a vocabulary of 500 gives the kernel trees 32-64 buckets, so the sparse steps refresh them by deltas
COMMON = [*TINY, "data.vocab_size=500", f"trainer.max_steps={STEPS}", f"checkpoint_every_n_steps={EVERY}",
          "trainer.val_check_interval=15", "model.dropout=0.3", "optim.lr=0.5", "logger=csv"]  # fmt: skip
# one case per family of derived state: kernel trees (per position and batch-shared), a bigram table, the model's
# own softmax, an alias table (batch-shared), a noise distribution, a class tree, cluster heads, the full softmax and
# the differentiated softmax's list of block matrices
STRATEGIES = {
    "rff": ["output=rff", "sampler.D=64", "output.num_samples=16"],
    "quadratic": ["output=quadratic", "output.num_samples=16"],
    "quadratic-shared": ["output=quadratic", "output.num_samples=16", "++output.shared_negatives=true"],
    "bigram": ["output=bigram", "output.num_samples=16"],
    "exp": ["output=exp", "output.num_samples=16"],
    "unigram-shared": ["output=unigram", "output.num_samples=16", "++output.shared_negatives=true"],
    "nce": ["output=nce", "output.num_samples=16"],
    "hsm": ["output=hsm"],
    "adaptive": ["output=adaptive", "output.cutoffs=[50,200]"],
    "full": ["output=full"],
    "mos": ["output=mos", "output.components=4", "output.latent_dropout=0.3"],  # a dropout draw in the output too
    "dsoftmax": ["output=dsoftmax"],
    "charcnn": ["output=charcnn", "output.num_samples=16"],  # class vectors kept through an evaluation
    # a sampler's own learned state (mixture logits and their pending step, buffers in the checkpoint)
    "adaptive_ngram": ["output=sampled", "sampler=adaptive_ngram", "output.num_samples=16"],
    "target": ["output=sampled", "sampler=target", "output.num_samples=16"],  # one set a batch, from a key per class
}
KILL = ["+callbacks.kill._target_=tests.helpers.SignalAtStep", f"+callbacks.kill.step={KILL_AT}",
        "+callbacks.kill.signal=SIGKILL"]  # fmt: skip


@pytest.mark.slow  # three CLI runs each, ~15-30 s
@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_sigkill_after_a_checkpoint_then_resume_ends_as_the_uninterrupted_run(tmp_path, strategy):
    args = [*COMMON, *STRATEGIES[strategy]]
    straight, split = tmp_path / "straight", tmp_path / "split"
    env = cli_env(tmp_path)
    reference = subprocess.Popen(lmtrain(*args, f"hydra.run.dir={straight}"), cwd=tmp_path, env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        killed = run_cli([*args, *KILL, f"hydra.run.dir={split}"], tmp_path, check=False)
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
        assert not (split / "run.json").is_file() or not run_info(split)["metrics"]  # it never finished
        run_cli([*args, "ckpt_path=last", f"hydra.run.dir={split}"], tmp_path)
        _, errors = reference.communicate(timeout=400)
    finally:
        reference.kill()
    assert reference.returncode == 0, errors[-3000:]
    expected, resumed = run_info(straight)["metrics"], run_info(split)["metrics"]
    compared = [key for key in expected if "ppl" in key or "loss" in key]
    assert "val/ppl" in compared and "test/ppl" in compared, expected
    for key in compared:
        assert math.isfinite(expected[key]), (key, expected[key])
        assert resumed[key] == pytest.approx(expected[key], rel=1e-6, abs=0), key

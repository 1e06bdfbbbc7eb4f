"""The command line: one clear line on bad input, never a traceback, and nothing written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.cli_runs import TINY, cli_env, run_cli

NEEDS_NO_GPU = pytest.mark.skipif(torch.cuda.is_available() or torch.backends.mps.is_available(), reason="a GPU")
PROC = pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="no procfs here")  # a folder no one can make


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["output=bogus"], "unknown output 'bogus'"),
        (["sampler.D=1024"], "sampler.D is not an option of output=full"),
        (["optim.lr=abc", "data=synthetic"], "optim.lr must be a number, got 'abc'"),
        (["trainer.max_epochs=abc"], "trainer.max_epochs must be an integer or null, got 'abc'"),
        (["++foo=1"], "unknown key foo (the top level takes callbacks, checkpoint_every_minutes, "),
        (["trainer.max_epoch=1"], "unknown key trainer.max_epoch: did you mean trainer.max_epochs?"),
        (["data=text", "data.path=DOES/NOT/EXIST", "logger=csv"], "DOES/NOT/EXIST does not exist: set it to a folder"),
        (["ckpt_path=missing.ckpt", "data=synthetic", "logger=csv"], "missing.ckpt does not exist"),
        (["output=rffx"], "unknown output 'rffx': did you mean output=rff? (choose one of"),
        pytest.param(
            ["trainer.accelerator=gpu"], "trainer.accelerator=gpu: this machine has no GPU", marks=NEEDS_NO_GPU
        ),
        (["trainer.accelerator=cpu", "trainer.devices=4096"], "trainer.devices=4096: this machine has "),
        pytest.param(["hydra.run.dir=/proc/nope"], "hydra.run.dir=/proc/nope cannot be created in /proc", marks=PROC),
        (["trainer.accelerator=cpu", "trainer.precision=16-mixed"], "use trainer.precision=bf16-mixed or 32-true"),
    ],
)
def test_bad_input_gives_one_clear_line_exit_2_and_leaves_no_folder(tmp_path, args, expected):
    result = run_cli(args, tmp_path, check=False)  # Hydra's default run folder: outputs/DATE/TIME
    assert result.returncode == 2, result.stderr[-3000:]
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("lmtrain: error: ") and expected in line
    assert not (tmp_path / "outputs").exists()  # a failed call leaves no empty run folder behind


# the CLI run in a process that reports, at exit, whether Lightning was imported
IMPORTS_LIGHTNING = (
    "import atexit, runpy, sys\n"
    "atexit.register(lambda: print('lightning imported:', 'lightning' in sys.modules))\n"
    "sys.argv = ['lmtrain', *sys.argv[1:]]\n"
    "runpy.run_module('lmtrain', run_name='__main__', alter_sys=True)\n"
)


@pytest.mark.parametrize("args", [["output=bogus"], ["sampler.D=1024"], ["data=synthetic", "optim.lr=abc"]])
def test_a_refused_command_line_does_not_wait_for_lightning(tmp_path, args):
    """The config layer names every part, data modules included, without importing Lightning (a plain class behind
    ``lmtrain.run.lightning_data``): a typo is answered in the time torch and Hydra take to import."""
    result = subprocess.run(
        [sys.executable, "-c", IMPORTS_LIGHTNING, *args],
        cwd=tmp_path, env=cli_env(tmp_path), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2 and result.stderr.startswith("lmtrain: error: "), result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "lightning imported: False"


def test_short_training_run_from_the_command_line(tmp_path):
    run = tmp_path / "run"
    result = run_cli([*TINY, "logger=csv", "trainer.max_steps=5", f"hydra.run.dir={run}"], tmp_path)
    assert (run / "metrics.csv").is_file() and (run / "checkpoints" / "last.ckpt").is_file()
    assert (run / ".hydra" / "config.yaml").is_file()
    assert (run / "vocab.tsv").read_text().startswith("word\tcount\nw0\t")
    assert (run / "checkpoints" / "best-00.ckpt").is_file()  # validated at the end of the short run
    last = result.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"lmtrain: val ppl \d+\.\d\d, test ppl \d+\.\d\d — run", last), last
    for noise in ("litlogger", "LeafSpec", "GPU available", "TPU available", "`Trainer.fit` stopped"):
        assert noise not in result.stdout + result.stderr, noise
    assert "GPU available" in (run / "__main__.log").read_text()  # kept in the run's log file


@pytest.mark.slow  # two CLI processes, ~18 s; tests/test_generate.py and tests/test_score.py call them in process
def test_generate_and_score_from_the_command_line(trained_run, tmp_path):
    run, _ = trained_run("full", "text")
    generate = [f"ckpt_path={run}", "prompt=w1 w2", "num_tokens=5", "seed=1"]
    generated = run_cli(generate, tmp_path, module="lmtrain.generate", check=False)
    assert generated.returncode == 0 and generated.stdout.startswith("w1 w2"), generated.stderr[-3000:]
    text = run.parent / "corpus" / "test.txt"
    scored = run_cli([f"ckpt_path={run}", f"file={text}"], tmp_path, module="lmtrain.score", check=False)
    assert scored.returncode == 0 and "perplexity" in scored.stdout, scored.stderr[-3000:]
    assert (run / "score" / "test.csv").is_file()
    bad = run_cli([f"ckpt_path={run}", "temperature=-1"], tmp_path, module="lmtrain.generate", check=False)
    assert bad.returncode == 2 and bad.stderr.strip().startswith("lmtrain: error: temperature=-1")

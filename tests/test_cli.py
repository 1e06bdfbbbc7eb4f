"""The command line: one clear line on bad input, never a traceback, and nothing written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args: str, cwd: Path, module: str = "lmtrain") -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "WANDB_MODE": "disabled",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
        "LMTRAIN_CACHE_DIR": str(cwd / "cache"),
    }
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["output=bogus"], "unknown output 'bogus'"),
        (["sampler.D=1024"], "sampler.D is not an option of output=full"),
        (["data=text", "data.path=DOES/NOT/EXIST", "logger=csv"], "DOES/NOT/EXIST"),
        (["ckpt_path=missing.ckpt", "data=synthetic", "logger=csv"], "missing.ckpt does not exist"),
    ],
)
def test_bad_input_gives_one_clear_line(tmp_path, args, expected):
    result = run_cli(*args, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert result.returncode != 0
    assert expected in result.stderr
    assert "Traceback" not in result.stderr


def test_short_training_run_from_the_command_line(tmp_path):
    run = tmp_path / "run"
    result = run_cli(
        "data=synthetic",
        "logger=csv",
        "trainer.max_steps=5",
        "model.hidden_dim=16",
        "model.emb_dim=16",
        "progress_bar=false",
        f"hydra.run.dir={run}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (run / "metrics.csv").is_file() and (run / "checkpoints" / "last.ckpt").is_file()
    assert (run / ".hydra" / "config.yaml").is_file()
    assert (run / "vocab.tsv").read_text().startswith("word\tcount\nw0\t")


def test_generate_and_score_from_the_command_line(trained_run, tmp_path):
    run, _ = trained_run("full", "text")
    generated = run_cli(
        f"ckpt_path={run}", "prompt=w1 w2", "num_tokens=5", "seed=1", cwd=tmp_path, module="lmtrain.generate"
    )
    assert generated.returncode == 0 and generated.stdout.startswith("w1 w2"), generated.stderr[-3000:]
    text = run.parent / "corpus" / "test.txt"
    scored = run_cli(f"ckpt_path={run}", f"file={text}", cwd=tmp_path, module="lmtrain.score")
    assert scored.returncode == 0 and "perplexity" in scored.stdout, scored.stderr[-3000:]
    assert (run / "score" / "test.csv").is_file()
    bad = run_cli(f"ckpt_path={run}", "temperature=-1", cwd=tmp_path, module="lmtrain.generate")
    assert bad.returncode == 2 and bad.stderr.strip().startswith("lmtrain: error: temperature=-1")

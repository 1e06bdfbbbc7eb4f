"""The oldest torch and Lightning that pyproject.toml declares (``torch>=X``, ``lightning>=Y``) install in a fresh
virtual environment and train: the floors are what the code needs (``torch.nn.utils.get_total_norm`` came with
torch 2.6, ``Trainer.fit(..., weights_only=...)`` with Lightning 2.6), not older versions a user would meet as a
TypeError. PyPI's torch wheel of that version (the CPU build is on PyTorch's own index only) brings NVIDIA's
libraries, some 6 GB: the install runs only where ``LMTRAIN_TEST_DECLARED_MINIMUM=1`` asks for it (it would double
CI's time on a slow link); docs/testing.md says when to run it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli_runs import ROOT, TINY, cli_env

FLOORED = ("torch", "lightning")


def declared() -> list[str]:
    """pyproject.toml's ``dependencies``, as written."""
    text = (ROOT / "pyproject.toml").read_text()
    block = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M)
    assert block, "pyproject.toml has no dependencies list"
    return re.findall(r'"([^"]+)"', block.group(1))


def floors() -> dict[str, str]:
    """The declared minimum of torch and Lightning: {"torch": "2.6", ...}."""
    found = {m.group(1): m.group(2) for d in declared() if (m := re.fullmatch(r"(\w[\w-]*)>=([\d.]+)", d))}
    return {name: found[name] for name in FLOORED}


def release(version: str) -> tuple[int, int]:
    """'2.6.0+cu124' -> (2, 6)."""
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def test_the_floors_are_declared_where_the_code_needs_them():
    assert {name: release(version) >= (2, 6) for name, version in floors().items()} == dict.fromkeys(FLOORED, True)


@pytest.fixture
def venv(tmp_path: Path) -> Iterator[Path]:
    """A fresh virtual environment's folder, removed afterwards (pytest keeps its temporary folders: 6 GB each)."""
    folder = tmp_path / "venv"
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("LMTRAIN_TEST_DECLARED_MINIMUM") != "1", reason="a 6 GB install: LMTRAIN_TEST_DECLARED_MINIMUM=1"
)
def test_the_declared_minimum_of_torch_and_lightning_installs_and_trains(tmp_path, venv):
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    minimum = floors()
    names = [d.split(">=")[0] for d in declared()]
    pins = [f"{name}=={minimum[name]}" if name in minimum else d for name, d in zip(names, declared(), strict=True)]
    install = subprocess.run(
        [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", *pins],
        capture_output=True,
        text=True,
        timeout=3000,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    shown = subprocess.run(
        [python, "-c", "import torch, lightning; print(torch.__version__, lightning.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert [release(v) for v in shown] == [release(minimum[name]) for name in FLOORED]
    for output in (["output=full"], ["output=rff", "sampler.D=32"]):  # the dense step, and the kernel tree's
        run = tmp_path / output[0].removeprefix("output=")
        args = [*TINY, *output, "trainer.max_steps=5", "logger=csv", f"hydra.run.dir={run}"]
        result = subprocess.run(
            [python, "-m", "lmtrain", *args], cwd=tmp_path, env=cli_env(tmp_path), capture_output=True, text=True
        )
        assert result.returncode == 0, result.stderr[-3000:]
        assert result.stdout.strip().splitlines()[-1].startswith("lmtrain: val ppl ")

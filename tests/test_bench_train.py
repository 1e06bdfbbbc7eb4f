"""scripts/bench_train.py: a record carries the command that reproduces it, beside its medians and ratios."""

from __future__ import annotations

import importlib
import json
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = ["model.num_layers=1", "model.hidden_dim=8", "model.emb_dim=8", "data.batch_size=4", "data.bptt=5"]


def test_a_record_names_its_command_and_compares_with_the_plain_loop(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    bench_train = importlib.import_module("bench_train")
    record = tmp_path / "record.json"
    argv = ["--experiment", "none", "--data", "synthetic:200", "--outputs", "full", "--threads", "1"]
    argv += [arg for override in TINY for arg in ("--override", override)]
    argv += ["--steps", "12", "--warmup", "2", "--interval", "2", "--rounds", "1", "--json", str(record)]
    result = bench_train.main(argv)
    written = json.loads(record.read_text())
    assert shlex.split(written["command"]) == ["python", "scripts/bench_train.py", *argv]
    cells = written["corpora"]["synthetic:200"]
    assert cells["tokens_per_sec"] == pytest.approx(result["corpora"]["synthetic:200"]["tokens_per_sec"])
    assert cells["tokens_per_sec"]["full"] > 0 and cells["tokens_per_sec"]["plain_full"] > 0
    assert cells["lmtrain_full_over_plain"] == pytest.approx(
        cells["tokens_per_sec"]["full"] / cells["tokens_per_sec"]["plain_full"]
    )

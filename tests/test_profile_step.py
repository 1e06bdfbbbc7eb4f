"""scripts/profile_step.py: the operators of a profiled step, by self time, add up to the step's profiled time."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_cpu_profile_names_the_step_s_operators_and_their_shares_add_up(monkeypatch, tmp_path, capsys):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    profile_step = importlib.import_module("profile_step")
    out = tmp_path / "profile.json"
    args = ["--output", "full", "--output", "unigram:model.hidden_dim=16", "--n", "300", "--batch", "4x5"]
    assert profile_step.main([*args, "--device", "cpu", "--warmup", "1", "--steps", "2", "--json", str(out)]) == 0
    records = json.loads(out.read_text())["records"]
    assert [r["output"] for r in records] == ["full", "unigram:model.hidden_dim=16"]
    for record in records:
        ops = {op["op"]: op for op in record["ops"]}
        assert {"aten::mm", "aten::addmm", "aten::bmm"} & set(ops)  # the output layer's product is there
        assert sum(op["share"] for op in record["ops"]) == pytest.approx(1.0)
        assert sum(op["ms_per_step"] for op in record["ops"]) == pytest.approx(record["profiled_ms_per_step"])
        assert all(op["calls_per_step"] > 0 for op in record["ops"])
        assert record["wall_ms_per_step"] > 0
    assert "unigram:model.hidden_dim=16 at n = 300, batch 4 x 5, cpu" in capsys.readouterr().out

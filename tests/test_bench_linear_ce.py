"""scripts/bench_linear_ce.py: the smoke path times every variant in its own child and finds each one's loss and
gradients close to a float64 dense reference; the check catches a variant that is off."""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
# the largest error allowed per precision: float32 and float64 sums in another order; bfloat16 products (8 bits)
GRAD_REL = {"32": 1e-4, "64": 1e-10, "bf16-mixed": 5e-2, "bf16-hidden": 5e-2}
LOSS_ABS = {"32": 1e-4, "64": 1e-10, "bf16-mixed": 1e-2, "bf16-hidden": 1e-2}


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    return importlib.import_module("bench_linear_ce")


def test_smoke_times_the_variants_and_each_is_exact(bench, tmp_path):
    record = tmp_path / "linear_ce.json"
    small = ["--positions", "60", "--dim", "16", "--check-classes", "3000"]
    timed = ["dense", "lmtrain", "torch_auto"]  # a child each (an interpreter start): the test times three
    argv = ["--sizes", "5000", "--repeats", "1", "--variants", ",".join(timed), *small, "--support"]
    argv += ["--json", str(record)]
    result = bench.main(argv)
    assert json.loads(record.read_text())["command"] == "python scripts/bench_linear_ce.py " + " ".join(argv)
    found = result["sizes"]["5000"]
    if not bench.HAS_TORCH_LCE:
        timed.remove("torch_auto")
        assert "no F.linear_cross_entropy" in found["left_out"]["torch_auto"]
    assert set(found["seconds"]) == set(timed) and all(s > 0 for s in found["seconds"].values())
    assert set(found["peak_mib"]) == {*timed, "inputs"} and all(m > 0 for m in found["peak_mib"].values())
    assert found["over_lmtrain"]["lmtrain"] == 1.0
    expected = {v for v in bench.BASE_VARIANTS if bench.HAS_TORCH_LCE or not v.startswith("torch")}
    exact = result["exactness"]
    assert set(exact["by_precision"]) == set(bench.PRECISIONS)
    for precision, variants in exact["by_precision"].items():
        # every variant is checked, whatever is timed, or left out with its reason (one resolving as another)
        assert set(variants) | set(exact["left_out"]) == expected and {"dense", "lmtrain"} <= set(variants)
        for variant, errors in variants.items():
            for name in ("hidden", "weight", "bias"):
                assert errors[name]["rel"] < GRAD_REL[precision], (precision, variant, name, errors[name])
            if not (precision == "bf16-hidden" and variant.startswith("torch")):
                # torch's chunked op sums a bfloat16 input's loss in bfloat16 over its row chunks (the record shows
                # how far off it lands); lmtrain's and the dense loss are summed in float32
                assert errors["loss"]["abs"] < LOSS_ABS[precision], (precision, variant, errors["loss"])
    if bench.HAS_TORCH_LCE:
        assert result["support"]["reduction=sum (bias, float64, scaled upstream grad)"].startswith("ok")


def test_exactness_catches_a_variant_that_is_off(bench, monkeypatch):
    real = bench.chunked_softmax_nll
    chunks = []

    def bias_counted_twice(hidden, weight, bias, target, chunk):  # the same loss, twice the bias gradient
        chunks.append(chunk)
        return real(hidden, weight, bias + (bias - bias.detach()), target, chunk)

    def shifted(hidden, weight, bias, target, chunk):  # a normalizer off by a little: the loss off, the gradients not
        return real(hidden, weight, bias, target, chunk) + 1e-3

    exact = bench.exactness("lmtrain", "32", 500, 8, 40)
    assert exact["bias"]["rel"] < 1e-5 and exact["loss"]["abs"] < 1e-5
    monkeypatch.setattr(bench, "chunked_softmax_nll", bias_counted_twice)
    off = bench.exactness("lmtrain", "32", 500, 8, 40)
    assert off["bias"]["rel"] > 0.5 and off["weight"]["rel"] < 1e-5
    assert chunks == [167]  # the check walks at least three chunks: ceil(500 / 3) classes each
    monkeypatch.setattr(bench, "chunked_softmax_nll", shifted)
    assert bench.exactness("lmtrain", "32", 500, 8, 40)["loss"]["abs"] > 5e-4


def test_torch_variants_left_out_without_the_op(bench, monkeypatch):
    args = argparse.Namespace(positions=700, dim=200, dense_max_mib=4096.0)
    monkeypatch.setattr(bench, "HAS_TORCH_LCE", False)
    kept, skipped = bench.variants_at(bench.BASE_VARIANTS, 1_000_000, args)
    assert kept == ["dense", "lmtrain"]
    assert all("no F.linear_cross_entropy" in skipped[v] for v in bench.BASE_VARIANTS if v.startswith("torch"))
    kept, skipped = bench.variants_at(
        bench.BASE_VARIANTS, 1_000_000, argparse.Namespace(**{**vars(args), "dense_max_mib": 100.0})
    )
    assert kept == ["lmtrain"] and "--dense-max-mib" in skipped["dense"]

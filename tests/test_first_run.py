"""The README's first run (``python -m lmtrain experiment=quick``) gives the numbers the README shows: one thread, so
the float sums do not depend on how many cores ``threads=auto`` finds free."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import SHARED_DATA, make_config

ROOT = Path(__file__).resolve().parents[1]
RESULT = re.compile(r"lmtrain: val ppl (\d+\.\d\d), test ppl (\d+\.\d\d) — ")


def shown(doc: str) -> tuple[float, float]:
    """The val and test perplexity of the first run's result line in ``doc``."""
    found = RESULT.search((ROOT / doc).read_text())
    assert found, f"{doc} lost the first run's result line"
    return float(found.group(1)), float(found.group(2))


def test_the_first_run_takes_one_thread_and_both_docs_show_its_numbers():
    assert make_config(["experiment=quick"]).threads == 1
    assert shown("README.md") == shown("docs/usage.md")


@pytest.mark.slow  # the first run itself: 300 steps of the default model on Penn Treebank, a few minutes
@pytest.mark.skipif(not (SHARED_DATA / "ptb").is_dir(), reason="needs Penn Treebank in LMTRAIN_DATA_DIR")
def test_the_first_run_gives_the_readmes_numbers(tmp_path, monkeypatch):
    from lmtrain.run.run import train

    monkeypatch.setenv("LMTRAIN_DATA_DIR", str(SHARED_DATA))
    monkeypatch.setenv("LMTRAIN_CACHE_DIR", str(tmp_path / "cache"))
    metrics = train(make_config(["experiment=quick", "logger=csv", "progress_bar=false", f"run_dir={tmp_path}"]))
    val, test = shown("README.md")
    # equal here to the digit; another CPU's vector width rounds float32 sums differently over 300 steps, so the
    # check allows half a percent (a stale README differs by whole percents)
    assert (metrics["val/ppl_best"], metrics["test/ppl"]) == pytest.approx((val, test), rel=5e-3)

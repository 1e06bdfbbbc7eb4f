"""docs/usage.md's list of strategies names every proposal a user can choose, so that each is found where the
strategies are listed (in-batch negatives were only in docs/strategies.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmtrain.config import choices

USAGE = Path(__file__).resolve().parents[1] / "docs" / "usage.md"


def strategy_section() -> str:
    """The text of docs/usage.md's "Output strategies" section, up to the next section."""
    text = USAGE.read_text()
    start = text.index("## Output strategies")
    return text[start : text.index("\n## ", start + 1)]


@pytest.mark.parametrize("sampler", choices("sampler"))
def test_every_sampler_choice_is_in_the_strategy_list(sampler):
    assert f"`{sampler}`" in strategy_section() or f"sampler={sampler}`" in strategy_section()


def test_in_batch_negatives_are_found_by_their_name():
    section = strategy_section()
    assert "in-batch negatives" in section and "`sampled sampler=inbatch`" in section

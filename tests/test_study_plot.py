"""A study's plot.png: one line per combination of the keys other than x, with plain tick labels."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lmtrain.study.render import render_plot
from lmtrain.study.spec import parse_spec
from tests.test_study import fake_record


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The figures render_plot makes, kept open instead of written."""
    import lmtrain.tools.figures as figures

    figures_made: list[Any] = []
    monkeypatch.setattr(figures, "save_figure", lambda fig, path, plt: figures_made.append(fig) or Path(path))
    return figures_made


def test_a_grid_of_the_x_key_alone_is_one_line_named_by_the_study(drawn: list[Any], tmp_path: Path) -> None:
    spec = parse_spec("dims", {"overrides": ["output=rff"], "grid": [{"sampler.D": [64, 256, 1024]}], "x": "sampler.D"})
    records = [
        fake_record("dims", f"sampler.D={d},seed={s}", 300.0 - d / 10 + s) for d in (64, 256, 1024) for s in (1, 2)
    ]
    render_plot(spec, records, tmp_path / "plot.png")
    [ax] = drawn[0].axes
    assert [text.get_text() for text in ax.get_legend().get_texts()] == ["dims"]  # not one series per D
    assert len(ax.containers) == 1 and list(ax.lines[0].get_xdata()) == [64.0, 256.0, 1024.0]
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert labels and not any("times" in label or "^" in label for label in labels)  # 264, not 2.64x10^2


def test_cells_that_differ_beside_x_are_one_line_each(drawn: list[Any], tmp_path: Path) -> None:
    grid = [{"output": ["unigram", "rff"], "output.num_samples": [10, 100]}]
    spec = parse_spec("m", {"overrides": [], "grid": grid, "x": "output.num_samples"})
    records = [
        fake_record("m", f"output={o},output.num_samples={m},seed=1", 200.0 + m)
        for o in ("unigram", "rff")
        for m in (10, 100)
    ]
    render_plot(spec, records, tmp_path / "plot.png")
    [ax] = drawn[0].axes
    assert sorted(t.get_text() for t in ax.get_legend().get_texts()) == ["output=rff", "output=unigram"]

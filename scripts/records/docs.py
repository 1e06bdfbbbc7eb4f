"""Study tables inside a markdown page: a block ``<!-- study:NAME -->`` ... ``<!-- /study:NAME -->`` holds the
rendered ``table.md`` of study NAME (``bench:NAME``: the rendered docs/bench/NAME.md of a benchmark record;
``summary:answer``: the answer table of ``records.summary``; ``survey:NAME``: study NAME's survey.md), so that
the prose of docs/results.md quotes rendered tables, never copies."""

from __future__ import annotations

import re
from pathlib import Path

from records.summary import render_summary

BLOCK = re.compile(
    r"(<!-- (?P<kind>study|bench|summary|survey):(?P<name>[\w.-]+) -->\n)(?P<body>.*?)(<!-- /(?P=kind):(?P=name) -->)",
    re.DOTALL,
)


def filled(text: str, root: Path) -> str:
    """``text`` with every study block replaced by that study's rendered table (left as is when it has none)."""

    def table(match: re.Match[str]) -> str:
        if match["kind"] == "summary":
            return f"{match.group(1)}{render_summary(root)}{match.group(5)}" if match["name"] == "answer" else match[0]
        bench = root.parent / "bench" / f"{match['name']}.md"  # a benchmark's rendered table, beside its JSON
        own = "survey.md" if match["kind"] == "survey" else "table.md"
        path = bench if match["kind"] == "bench" else root / match["name"] / own
        if not path.is_file():
            return match.group(0)
        body = path.read_text().split("\n", 1)[1]  # without the "rendered by ... do not edit" comment
        return f"{match.group(1)}{body}{match.group(5)}"

    return BLOCK.sub(table, text)


def fill_page(page: Path, root: Path) -> bool:
    """Rewrite the study blocks of ``page``; True when something changed."""
    text = page.read_text()
    new = filled(text, root)
    if new != text:
        page.write_text(new)
    return new != text


def stale_page(page: Path, root: Path) -> str | None:
    """None when every study block of ``page`` holds its current table, else what to run."""
    if page.is_file() and filled(page.read_text(), root) != page.read_text():
        return f"{page} quotes study tables that differ from their rendering: run python scripts/render_docs.py"
    return None

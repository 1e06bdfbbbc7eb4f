"""scripts/render_docs.py and its renderers (scripts/records/): benchmark tables rendered beside their records, the
blocks of a page that quote rendered tables, the check of what docs/ publishes, and the numbers and words the pages
write by hand beside those tables."""

from __future__ import annotations

import json
from pathlib import Path

from records.docs import fill_page, stale_page
from render_docs import main as render_docs

ROOT = Path(__file__).resolve().parents[1]


def test_docs_blocks_quote_the_rendered_table_and_go_stale_when_it_changes(tmp_path):
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "table.md").write_text("<!-- rendered -->\n| a | 1 |\n")
    page = tmp_path / "results.md"
    page.write_text("intro\n<!-- study:s -->\nold\n<!-- /study:s -->\nmore\n")
    assert stale_page(page, tmp_path) is not None
    assert fill_page(page, tmp_path)
    assert page.read_text() == "intro\n<!-- study:s -->\n| a | 1 |\n<!-- /study:s -->\nmore\n"
    assert stale_page(page, tmp_path) is None


def test_the_command_renders_a_new_record_then_the_page_and_the_check_finds_a_hand_edit(tmp_path, capsys):
    """``--bench`` writes a first table beside a new record, the page's block quotes it; ``--check`` passes, then
    fails on a hand-edited number; a plain run renders the table again and the check passes."""
    root, bench = tmp_path / "docs" / "study", tmp_path / "docs" / "bench"
    root.mkdir(parents=True), bench.mkdir()
    record = {
        "rounds": 3,
        "steps": 10,
        "threads": 1,
        "device": "cpu",
        "experiment": "e",
        "data": "ptb",  # one corpus, written flat
        "tokens_per_sec": {"full": 1000.0, "rff": 2500.4},
        "ratio_to_full": {"full": 1.0, "rff": 2.5004},
        "samples": {"full": [990.0, 1000.0, 1010.0], "rff": [2500.4, 2400.0, 2600.0]},
    }
    (bench / "x.json").write_text(json.dumps(record))
    page = tmp_path / "docs" / "results.md"
    page.write_text("intro\n<!-- bench:x -->\nold\n<!-- /bench:x -->\n")
    where = ["--root", str(root), "--pages", str(page)]
    assert render_docs(["--bench", str(bench / "x.json"), *where]) == 0
    table = (bench / "x.md").read_text()
    assert table.startswith("<!-- rendered by `python scripts/render_docs.py --bench docs/bench/x.json`")
    rows = ["| ptb: output | tokens/s (median) | rounds | x full (same run) |", "|---|---|---|---|"]
    rows += ["| full | 1,000 | 3 | 1.00 |", "| rff | 2,500 | 3 | 2.50 |"]
    assert "\n".join(rows) in table
    assert page.read_text() == "intro\n<!-- bench:x -->\n" + table.split("\n", 1)[1] + "<!-- /bench:x -->\n"
    assert render_docs(["--check", *where]) == 0
    (bench / "x.md").write_text(table.replace("2,500", "2,600"))
    assert render_docs(["--check", *where]) == 1
    assert "x.md differs from its record" in capsys.readouterr().err
    assert render_docs(where) == 0  # every table that has a record is rendered again
    assert (bench / "x.md").read_text() == table and render_docs(["--check", *where]) == 0


def test_committed_tables_and_results_page_match_their_records():
    """What docs/ publishes is what the committed records render to (python scripts/render_docs.py --check)."""
    assert render_docs(["--check"]) == 0


def test_readme_which_one_to_pick_quotes_only_rendered_tables():
    """Every decimal number of README's "Which one to pick" appears in a rendered study, benchmark or answer table, so
    the advice cannot drift from the records (a typo, or a number left over from older defaults, fails here)."""
    import re

    root = ROOT
    readme = (root / "README.md").read_text()
    section = readme.split("**Which one to pick**", 1)[1].split("\n\n", 1)[0]
    rendered = _rendered(root)
    numbers = re.findall(r"\d[\d,]*\.\d+", section)
    assert len(numbers) >= 10  # the section does quote measurements
    missing = [n for n in numbers if not re.search(rf"(?<![\d.,]){re.escape(n)}(?![\d])", rendered)]
    assert not missing, f"README quotes numbers no rendered table holds: {missing}"


# ---
VERDICT_WORDS = {"tied": "tied", "behind": "behind", "beats": "beats", "ahead": "beats"}


def _prose(text: str) -> str:
    """A page without its code blocks and rendered table blocks: the sentences written by hand."""
    import re

    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    text = re.sub(r"<!-- (study|bench|summary|survey):([\w.-]+) -->.*?<!-- /\1:\2 -->", "", text, flags=re.DOTALL)
    return "\n".join(line for line in text.splitlines() if not line.startswith("    "))  # indented commands


def _rendered(root: Path) -> str:
    from records.summary import render_summary

    tables = [*(root / "docs" / "study").glob("*/table.md"), *(root / "docs" / "study").glob("*/survey.md")]
    tables += [*(root / "docs" / "bench").glob("*.md")]
    return "\n".join(path.read_text() for path in tables) + render_summary(root / "docs" / "study")


def _pages(root: Path) -> dict[str, str]:
    readme = (root / "README.md").read_text().split("**Which one to pick**", 1)[1].split("\n\n", 1)[0]
    pages = {"README.md (Which one to pick)": readme}
    pages.update(
        {name: _prose((root / "docs" / name).read_text()) for name in ("results.md", "strategies.md", "usage.md")}
    )
    return pages


def test_docs_quote_only_numbers_that_a_rendered_table_holds():
    """Every measurement written by hand in README's advice, docs/results.md, docs/strategies.md and docs/usage.md
    (a mean ± sd, a relative difference, a speed ratio) appears in a rendered study, benchmark or answer table."""
    import re

    root = ROOT
    rendered = _rendered(root)
    missing = []
    for page, text in _pages(root).items():
        figures = re.findall(r"(?<![\d.])(\d[\d,]*\.\d+) ± (\d[\d,]*\.\d+)", text)
        numbers = [n for pair in figures for n in pair] + re.findall(r"(?<![\d.])([+-]\d[\d,]*\.\d+)%", text)
        numbers += re.findall(r"(?<![\d.])(\d+\.\d+)x\b", text)
        missing += [(page, n) for n in numbers if not re.search(rf"(?<![\d.,]){re.escape(n)}(?![\d])", rendered)]
    assert not missing, f"numbers no rendered table holds: {missing}"


def _clauses(text: str) -> list[str]:
    import re

    return [c for c in re.split(r"(?<=[.;:])\s+|(?<=\)),\s+|\n\s*[-|]\s*|\n\n|\|", text) if c.strip()]


def test_comparison_words_beside_numbers_agree_with_the_verdict_rule():
    """A "tied" / "behind" / "beats" (or "ahead") written after a relative difference must be the verdict its
    rendered cell gives it ("+3.0% behind"), and one written in a clause comparing two figures "A ± a ... B ± b" must
    be the rule's verdict for A against B (3 seeds each: beyond twice the pooled sd, else tied)."""
    import math
    import re

    root = ROOT
    rendered = _rendered(root)
    pairs = {(pct, word) for pct, word in re.findall(r"([+-]\d[\d,]*\.\d+%)[^|\d%]{0,3}?(tied|behind|beats)", rendered)}
    wrong, checked = [], 0
    words = "|".join(VERDICT_WORDS)
    for page, text in _pages(root).items():
        for clause in _clauses(text.replace("\n", " ")):
            for pct, word in re.findall(rf"([+-]\d[\d,]*\.\d+%)(?:[^%]*?)\b({words})\b", clause):
                checked += 1
                if (pct, VERDICT_WORDS[word]) not in pairs:
                    wrong.append((page, f"{pct} {word}", clause))
            figures = re.findall(r"(?<![\d.])(\d[\d,]*\.\d+) ± (\d[\d,]*\.\d+)", clause)
            said = re.findall(rf"\b({words})\b", clause)
            if len(figures) == 2 and len(said) == 1 and not re.search(r"[+-]\d[\d,]*\.\d+%", clause):
                (a, sa), (b, sb) = [(float(m.replace(",", "")), float(s.replace(",", ""))) for m, s in figures]
                rule = "tied" if abs(a - b) <= 2 * math.sqrt((sa**2 + sb**2) / 2) else ("beats" if a < b else "behind")
                checked += 1
                if rule != VERDICT_WORDS[said[0]]:
                    wrong.append((page, f"{a} vs {b}: written {said[0]}, the rule says {rule}", clause))
    assert checked >= 20  # the pages do make comparisons
    assert not wrong, "comparison words that disagree with the verdict rule:\n" + "\n".join(map(str, wrong))

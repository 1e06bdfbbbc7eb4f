"""Every repository path that the docs and the configs name exists: a file that moves or goes takes its mentions
with it. Placeholders (``docs/bench/NAME.json``, ``tests/test_x.py``) and the files a documented command writes
(``docs/bench/gpu_h100.json``) are told apart from named files by the rules below."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CONFIGS = sorted((ROOT / "conf").rglob("*.yaml"))
SOURCE = re.compile(r"\b(?:lmtrain|scripts|tests|hydra_plugins)/[\w/]+\.py\b")  # a source file by its path
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")  # a markdown link's target
PLACEHOLDER = re.compile(r"(?:^|/)(?:[A-Z_]+|test_x)(?:\.\w+)?$|[A-Z]{2,}")  # NAME, FILE, test_x.py


def named_paths(text: str) -> set[str]:
    return {p for p in SOURCE.findall(text) if not PLACEHOLDER.search(p) and "*" not in p}


def test_every_source_file_the_docs_and_configs_name_exists():
    missing = {
        f"{page.relative_to(ROOT)}: {path}"
        for page in [*PAGES, *CONFIGS]
        for path in named_paths(page.read_text())
        if not (ROOT / path).exists()
    }
    assert not missing, sorted(missing)


def test_every_link_of_the_docs_leads_to_a_file():
    missing = set()
    for page in PAGES:
        for target in LINK.findall(page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                missing.add(f"{page.relative_to(ROOT)}: {target}")
    assert not missing, sorted(missing)


def test_the_rule_catches_a_stale_name():
    assert named_paths("see lmtrain/config/parts.py and `tests/test_x.py`") == {"lmtrain/config/parts.py"}

"""The import graph runs one way (docs/architecture.md): entries -> cli -> (config, run); run -> training ->
run_folder -> (model, output -> sampler); process below run, tools and study; data apart, tools above config, study
above tools, common below everything."""

from __future__ import annotations

import ast
from pathlib import Path

import lmtrain

ROOT = Path(lmtrain.__file__).parent
# the layers each layer may import (besides itself)
ALLOWED = {
    "entry": {"cli", "config", "run", "run_folder", "tools"},
    "cli": {"config", "run", "training", "data"},
    "tools": {"cli", "config", "training", "run_folder", "process", "output", "sampler", "model", "data"},
    "config": {"model", "output", "sampler", "data"},  # the schemas subclass the parts' options
    "study": {"tools", "process", "config", "data"},  # studies run `python -m lmtrain` and score its runs' text
    "run": {"training", "run_folder", "process", "model", "output", "sampler", "data"},  # train(cfg): the run
    "training": {"run_folder", "model", "output", "sampler", "data"},  # the step and the module
    "run_folder": {"model", "data"},  # every file a run writes and reads
    "process": set(),  # threads, allocator, library logs, signals
    "output": {"sampler"},
    "sampler": set(),
    "model": set(),
    "data": set(),
    "common": set(),  # what every layer may use
}


def layer(path: Path) -> str:
    parts = path.relative_to(ROOT).parts
    return parts[0] if len(parts) > 1 else "entry"


def imported_layers(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {name.split(".")[1] for name in names if name.startswith("lmtrain.") and name.count(".") >= 1}


def test_imports_run_one_way():
    wrong = []
    for path in sorted(ROOT.rglob("*.py")):
        own = layer(path)
        for target in imported_layers(path) - {own, "common"} - ALLOWED[own]:
            wrong.append(f"{path.relative_to(ROOT)} ({own}) imports lmtrain.{target}")
    assert not wrong, "\n".join(wrong)


MAX_LINES = 400  # one concern per file: a cohesive one may be this long before it is split


def test_no_file_is_over_the_line_limit():
    lines = {p: len(p.read_text().splitlines()) for p in ROOT.rglob("*.py")}
    assert not [f"{p.relative_to(ROOT)}: {n}" for p, n in lines.items() if n > MAX_LINES]


def test_config_modules_import_one_way():
    """No two modules of lmtrain/config import each other, directly or around a cycle (the package's __init__
    gathers them and none imports it)."""
    modules = {p.stem: p for p in (ROOT / "config").glob("*.py") if p.stem != "__init__"}
    graph = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "lmtrain.config":
                assert {a.name for a in node.names} <= modules.keys(), f"{name} imports the package lmtrain.config"
                graph[name] |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lmtrain.config."):
                graph[name].add(node.module.split(".")[2])
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, f"import cycle: {' -> '.join((*path, name))}"
        if name not in done:
            for target in graph[name]:
                visit(target, (*path, name))
            done.add(name)

    for name in graph:
        visit(name, ())

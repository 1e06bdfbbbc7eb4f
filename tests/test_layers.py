"""The import graph runs one way (docs/architecture.md): entries -> cli -> (config, run); run -> training ->
run_folder -> (model, output -> sampler); process below run, tools and study; data apart, tools above config and run
(run/build.py loads a trained run), study above tools, common below everything."""

from __future__ import annotations

import ast
from pathlib import Path

import lmtrain

ROOT = Path(lmtrain.__file__).parent
# the layers each layer may import (besides itself)
ALLOWED = {
    "entry": {"cli", "config", "run", "run_folder", "tools"},
    "cli": {"config", "run", "training", "data"},
    "tools": {"cli", "config", "run", "training", "run_folder", "process", "output", "sampler", "model", "data"},
    "config": {"model", "output", "sampler", "data"},  # the schemas subclass the parts' options
    "study": {"tools", "process", "config", "data"},  # studies run `python -m lmtrain` and score its runs' text
    # train(cfg): the run, and the build of its parts from the config (build.py)
    "run": {"training", "run_folder", "process", "model", "output", "sampler", "data"},
    "training": {"run_folder", "model", "output", "sampler", "data"},  # the step and the module
    "run_folder": {"model", "data"},  # every file a run writes and reads
    "process": set(),  # threads, allocator, library logs, signals
    "output": {"sampler"},
    "sampler": set(),
    "model": set(),
    "data": set(),
    "common": set(),  # what every layer may use
}


def layer(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).parts
    return parts[0] if len(parts) > 1 else "entry"


def imported_layers(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {name.split(".")[1] for name in names if name.startswith("lmtrain.") and name.count(".") >= 1}


def wrong_imports(root: Path = ROOT) -> list[str]:
    """The imports of the package at ``root`` that its layer may not make (ALLOWED)."""
    wrong = []
    for path in sorted(root.rglob("*.py")):
        own = layer(path, root)
        for target in imported_layers(path) - {own, "common"} - ALLOWED[own]:
            wrong.append(f"{path.relative_to(root)} ({own}) imports lmtrain.{target}")
    return wrong


def test_imports_run_one_way():
    wrong = wrong_imports()
    assert not wrong, "\n".join(wrong)


def test_the_rule_catches_an_import_against_the_layers(tmp_path: Path):
    """The step and the module import nothing of the run (its build included); the parts nothing of training."""
    files = {
        "run/build.py": "from lmtrain.training.module import LanguageModel\n",  # allowed: run -> training
        "tools/trained.py": "from lmtrain.run.build import build_model\n",  # allowed: tools -> run
        "training/module.py": "from lmtrain.run.build import build\n",  # refused: training -> run
        "output/full.py": "import lmtrain.training.step\n",  # refused: output -> training
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert wrong_imports(tmp_path) == [
        "output/full.py (output) imports lmtrain.training",
        "training/module.py (training) imports lmtrain.run",
    ]


def test_the_layers_form_no_cycle():
    """ALLOWED itself runs one way: a layer may not reach itself through the others (so training may not import run,
    which imports training)."""
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, f"layer cycle: {' -> '.join((*path, name))}"
        if name not in done:
            for target in ALLOWED[name]:
                visit(target, (*path, name))
            done.add(name)

    for name in ALLOWED:
        visit(name, ())


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

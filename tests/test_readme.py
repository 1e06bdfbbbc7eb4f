"""docs/usage.md's own-config example, run as a reader would copy it: every ```yaml block that names its file
(``# DIR/GROUP/NAME.yaml``) is written to a folder, and every ``python -m lmtrain --config-dir DIR ...`` line of
docs/usage.md is run on it (tiny model, a few steps)."""

from __future__ import annotations

import re
import shlex

from omegaconf import OmegaConf

from tests.cli_runs import ROOT, TINY, run_cli

BLOCK = re.compile(r"```yaml\n(.*?)```", re.S)
FILE_LINE = re.compile(r"^# DIR/(\w+)/(\w+)\.yaml\b", re.M)
COMMAND = re.compile(r"python -m lmtrain (--config-dir DIR [^`#\n]*)")


def readme_files(text: str) -> dict[tuple[str, str], str]:
    """(group, name) -> the text of each yaml block of ``text`` that names its file."""
    files = {}
    for block in BLOCK.findall(text):
        found = FILE_LINE.search(block)
        if found is not None:
            files[(found.group(1), found.group(2))] = block
    return files


def leaves(node: object, prefix: str = "") -> dict[str, object]:
    """Every leaf of a plain nested dict as dotted key -> value."""
    if not isinstance(node, dict):
        return {prefix.rstrip("."): node}
    return {k: v for key, child in node.items() for k, v in leaves(child, f"{prefix}{key}.").items()}


def test_readme_config_examples_run_as_written(tmp_path):
    text = (ROOT / "docs" / "usage.md").read_text()
    placeholder = re.compile(r"\b[A-Z]{2,}\b")  # NAME in prose: not a command to copy
    commands = sorted({c for c in COMMAND.findall(text) if not placeholder.search(c.replace("DIR", ""))})
    files = readme_files(text)
    assert files and commands, "docs/usage.md lost its own-config example"
    folder = tmp_path / "DIR"
    for (group, name), block in files.items():
        (folder / group).mkdir(parents=True, exist_ok=True)
        (folder / group / f"{name}.yaml").write_text(block)
    for number, command in enumerate(commands):
        args = [a.replace("DIR", str(folder)) for a in shlex.split(command)]
        run = tmp_path / f"run{number}"
        fast = [*TINY, "trainer.max_steps=2", "logger=csv", f"hydra.run.dir={run}"]
        run_cli([*args, *fast], tmp_path)
        resolved = OmegaConf.load(run / "config.yaml")
        choices = OmegaConf.load(run / ".hydra" / "hydra.yaml").hydra.runtime.choices
        set_here = {a.split("=", 1)[0] for a in fast}
        for (group, name), block in files.items():
            if choices.get(group) != name:
                continue
            written = OmegaConf.to_container(OmegaConf.create(block))
            written.pop("defaults", None)
            package = "" if block.startswith("# @package _global_") else f"{group}."
            for key, value in leaves(written, package).items():
                if key not in set_here:  # the file's values reached the run
                    assert OmegaConf.select(resolved, key) == value, (group, name, key)


def test_readme_says_what_its_own_output_option_gives(tmp_path):
    """The comment of docs/usage.md's own output option names the proposal's power that option alone gives."""
    from lmtrain.config import compose_config

    files = readme_files((ROOT / "docs" / "usage.md").read_text())
    [(name, block)] = [(name, block) for (group, name), block in files.items() if group == "output"]
    claimed = re.search(r"unigram proposal \(power ([\d.]+)", block)
    assert claimed, "docs/usage.md's output example no longer names its proposal's power"
    (tmp_path / "output").mkdir()
    (tmp_path / "output" / f"{name}.yaml").write_text(block)
    cfg = compose_config([f"output={name}", "run_dir=/tmp/unused"], config_dir=tmp_path)
    assert cfg.sampler.power == float(claimed.group(1))

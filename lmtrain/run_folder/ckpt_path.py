"""``ckpt_path``: the checkpoint a run resumes (none, ``last``, ``auto`` or a file), the folder it goes on in, and the
command that resumes a run (its folder as lines show it: ``shown_path``). ``ckpt_path=last`` from the command line
goes on in the run folder it resumes (``resume_in_place``): results, metrics.csv, checkpoints and the W&B run stay
in one folder.

Nothing here imports Lightning: ``python -m lmtrain`` calls ``resume_in_place`` before Hydra composes the config, and a
bad command line answers without waiting for Lightning's import."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import yaml
from omegaconf import DictConfig

RUNS_ROOT = Path("outputs")  # where Hydra's default run folders (outputs/DATE/TIME) lie, relative to the cwd
VALUED_FLAGS = ("-cd", "--config-dir", "-cp", "--config-path", "-cn", "--config-name")


class CheckpointError(ValueError):
    """A checkpoint that is missing, unreadable, or from an incompatible run."""


def resolve_ckpt(cfg: DictConfig, run_dir: Path, overrides: list[str]) -> Path | None:
    """The checkpoint a run resumes: none, ``last`` (``find_last``), ``auto`` (this folder's last.ckpt when there is
    one, else a fresh start: a requeued job's command) or a file."""
    own = run_dir / "checkpoints" / "last.ckpt"
    if cfg.ckpt_path == "auto" and own.is_file():
        return own
    if cfg.ckpt_path in (None, "", "auto"):
        if (run_dir / "checkpoints").is_dir() and any((run_dir / "checkpoints").glob("*.ckpt")):
            raise CheckpointError(
                f"run folder {run_dir} already holds checkpoints; pass ckpt_path=last to resume it, "
                "or choose another hydra.run.dir (nothing was overwritten)"
            )
        return None
    if cfg.ckpt_path == "last":
        return find_last(run_dir, run_dir.parent.parent, overrides)
    return Path(str(cfg.ckpt_path)).expanduser().resolve()


def find_last(run_dir: Path, search_root: Path, overrides: list[str]) -> Path:
    """`ckpt_path=last`: this run folder's last.ckpt, else the newest earlier run with the same overrides."""
    own = run_dir / "checkpoints" / "last.ckpt"
    if own.is_file():
        return own
    found = newest_last(search_root, overrides)
    if found is None:
        wanted = run_overrides(overrides)
        raise CheckpointError(
            f"ckpt_path=last: no last.ckpt in {run_dir} nor in any run under {search_root} with the overrides "
            f"{wanted}; pass ckpt_path=PATH/TO/last.ckpt"
        )
    return found


def run_overrides(overrides: list[str]) -> list[str]:
    """The overrides that define a run (sorted): neither ``ckpt_path`` nor Hydra's own."""
    return sorted(o for o in overrides if not o.lstrip("+~").startswith(("ckpt_path=", "hydra.")))


def newest_last(search_root: Path, overrides: list[str]) -> Path | None:
    """The newest last.ckpt under ``search_root`` whose run had the same ``overrides`` (its .hydra/overrides.yaml)."""
    wanted, candidates = run_overrides(overrides), []
    for ckpt in search_root.glob("**/checkpoints/last.ckpt"):
        saved = ckpt.parent.parent / ".hydra" / "overrides.yaml"
        if saved.is_file() and run_overrides(yaml.safe_load(saved.read_text()) or []) == wanted:
            candidates.append(ckpt)
    return max(candidates, key=lambda p: p.stat().st_mtime) if candidates else None


def resume_in_place(args: list[str], root: Path = RUNS_ROOT) -> list[str]:
    """``args`` with ``hydra.run.dir`` set to the earlier run that ``ckpt_path=last`` resumes: the newest run folder
    under ``root`` with the same overrides. Unchanged when the command names its folder, is a sweep (each job has
    its own folder) or has no earlier run (the run then says what it did not find)."""
    if "ckpt_path=last" not in args or any(a.lstrip("+").startswith("hydra.run.dir=") for a in args):
        return args
    overrides, rest = [], iter(args)
    for arg in rest:
        if arg in VALUED_FLAGS:
            next(rest, None)
        elif arg.startswith("-"):
            if arg.split("=", 1)[0] not in VALUED_FLAGS:
                return args  # -m, --help, --cfg, ...: not a single run
        else:
            overrides.append(arg)
    if any(o.replace(" ", "") == "hydra.mode=MULTIRUN" for o in overrides):
        return args
    found = newest_last(root, overrides)
    return args if found is None else [*args, f"hydra.run.dir={found.parent.parent}"]


def resume_command(run_dir: Path, overrides: list[str]) -> str:
    """The command that resumes this run in its folder from its last.ckpt."""
    kept = [o for o in overrides if not o.lstrip("+").startswith(("ckpt_path=", "hydra.run.dir="))]
    return shlex.join(["python", "-m", "lmtrain", *kept, f"hydra.run.dir={shown_path(run_dir)}", "ckpt_path=last"])


def shown_path(path: Path) -> str:
    """``path`` relative to the working directory when it lies below it."""
    return os.path.relpath(path) if path.is_relative_to(Path.cwd()) else str(path)

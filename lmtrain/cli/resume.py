"""``ckpt_path=last`` from the command line goes on in the run folder it resumes: results, metrics.csv, checkpoints
and the W&B run stay in one folder."""

from __future__ import annotations

from pathlib import Path

RUNS_ROOT = Path("outputs")  # where Hydra's default run folders (outputs/DATE/TIME) lie, relative to the cwd
VALUED_FLAGS = ("-cd", "--config-dir", "-cp", "--config-path", "-cn", "--config-name")


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
    from lmtrain.training.checkpoints import newest_last  # needs Lightning: only when a run is resumed

    found = newest_last(root, overrides)
    return args if found is None else [*args, f"hydra.run.dir={found.parent.parent}"]

"""`python -m lmtrain [overrides]`: the Hydra entry point; all work happens in `lmtrain.run.run.train`."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import hydra
from omegaconf import DictConfig

from lmtrain.cli.app import run_app
from lmtrain.cli.failures import RunFolder, run_guarded
from lmtrain.config import CONF_DIR
from lmtrain.run_folder.ckpt_path import resume_in_place


def claimed_folder(args: list[str]) -> RunFolder:
    """What a failed call may remove: its run folder only if this call creates it (Hydra's dated default is new
    for every call; a hydra.run.dir from the command line must not exist yet), and with the default
    outputs/DATE/TIME layout also the DATE and outputs folders it leaves empty."""
    given = [a.split("=", 1)[1] for a in args if a.lstrip("+").startswith("hydra.run.dir=")]
    return RunFolder(started=time.time(), own=not given or not Path(given[-1]).exists(), parents=0 if given else 2)


FOLDER = claimed_folder(sys.argv[1:])  # before Hydra creates the folder


@hydra.main(config_path=str(CONF_DIR), config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    from lmtrain.run.run import train

    metrics = run_guarded(train, cfg, FOLDER)
    return None if metrics is None else metrics.get("val/ppl_best", metrics.get("val/ppl"))


if __name__ == "__main__":
    sys.argv[1:] = resume_in_place(sys.argv[1:])  # ckpt_path=last goes on in the folder it resumes
    FOLDER = claimed_folder(sys.argv[1:])
    run_app(main)  # Hydra's errors and lmtrain.config's checks (before any folder exists): one line, exit 2

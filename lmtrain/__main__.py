"""`python -m lmtrain [overrides]`: the Hydra entry point; all work happens in `lmtrain.run.train`."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from lmtrain.errors import fail, run_guarded
from lmtrain.overrides import CONF_DIR, OverrideError, check_overrides


@hydra.main(config_path=str(CONF_DIR), config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    from lmtrain.run import train

    metrics = run_guarded(train, cfg)
    return None if metrics is None else metrics.get("val/ppl_best", metrics.get("val/ppl"))


if __name__ == "__main__":
    try:
        check_overrides(sys.argv[1:])
    except OverrideError as err:
        fail(str(err))
    main()

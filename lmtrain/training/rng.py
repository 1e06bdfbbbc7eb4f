"""The random number generators: the run's one seed, and their states, saved in checkpoints so that a resumed run
draws the same numbers."""

from __future__ import annotations

import random
from typing import Any

import lightning as L
import numpy as np
import torch


def get_rng_states() -> dict[str, Any]:
    """torch, numpy and python RNG states as tensors and ints (loadable with torch.load(weights_only=True))."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, extra = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss)),
        "python": (version, torch.tensor(internal, dtype=torch.int64), extra),
    }


def set_rng_states(states: dict[str, Any]) -> None:
    """Restore the states ``get_rng_states`` returned."""
    torch.set_rng_state(states["torch"])
    kind, keys, pos, has_gauss, gauss = states["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, internal, extra = states["python"]
    random.setstate((version, tuple(internal.tolist()), extra))


def seed_run(seed: int) -> dict[str, Any]:
    """Seed every generator once (torch's, CUDA's, NumPy's, Python's, and the data loader workers' through
    Lightning) and return the states this leaves. The model is built from them; ``train`` restores them
    (``set_rng_states``) just before the fit, so that a single process starts training from the seeded state, as
    each DDP process does (Lightning re-seeds those when they start). Building happens on the CPU, so the CUDA
    generators are still as seeded then."""
    L.seed_everything(seed, workers=True, verbose=False)
    return get_rng_states()

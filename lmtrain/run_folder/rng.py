"""The random number generators: the run's one seed, and their states, saved in checkpoints so that a resumed run
draws the same numbers."""

from __future__ import annotations

import random
from typing import Any

import lightning as L
import numpy as np
import torch


def get_rng_states() -> dict[str, Any]:
    """torch's (the CPU's, and every CUDA device's once CUDA is in use: dropout masks and negatives drawn on a GPU come
    from its generator), numpy's and python's RNG states as tensors and ints (loadable with
    torch.load(weights_only=True))."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, extra = random.getstate()
    states = {
        "torch": torch.get_rng_state(),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss)),
        "python": (version, torch.tensor(internal, dtype=torch.int64), extra),
    }
    if cuda_in_use():  # never initializes CUDA (a CPU run on a GPU machine stays off it)
        states["cuda"] = {"states": torch.cuda.get_rng_state_all(), "device": torch.cuda.current_device()}
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    """Restore the states ``get_rng_states`` returned. A checkpoint without CUDA states (older, or of a CPU run) leaves
    the CUDA generators as they are; one with them, read where CUDA is not in use, too."""
    torch.set_rng_state(states["torch"])
    kind, keys, pos, has_gauss, gauss = states["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, internal, extra = states["python"]
    random.setstate((version, tuple(internal.tolist()), extra))
    if "cuda" in states and cuda_in_use():
        set_cuda_states(states["cuda"]["states"], int(states["cuda"]["device"]))


def cuda_in_use() -> bool:
    """Whether this process uses CUDA (its generators exist): available and initialized."""
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def set_cuda_states(saved: list[torch.Tensor], device: int) -> None:
    """Every device's generator from ``saved`` (one state per device of the writer, in order), as far as both have
    devices; and this process's device from the writer's own (``device``): a DDP rank trains on its own GPU, whose
    draws follow the ones rank 0 drew on its GPU (all ranks start from one seed), and rank 0 writes the checkpoint."""
    for index, state in enumerate(saved[: torch.cuda.device_count()]):
        torch.cuda.set_rng_state(state, index)
    if device < len(saved):
        torch.cuda.set_rng_state(saved[device], torch.cuda.current_device())


def seed_run(seed: int) -> dict[str, Any]:
    """Seed every generator once (torch's, CUDA's, NumPy's, Python's, and the data loader workers' through
    Lightning) and return the states this leaves. The model is built from them; ``train`` restores them
    (``set_rng_states``) just before the fit, so that a single process starts training from the seeded state, as
    each DDP process does (Lightning re-seeds those when they start). Building happens on the CPU, so the CUDA
    generators are still as seeded then."""
    L.seed_everything(seed, workers=True, verbose=False)
    return get_rng_states()

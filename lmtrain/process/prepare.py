"""The settings a training process makes once, before it builds anything: its compute threads (how many:
``threads.py``), float32 matmul precision, subnormal floats flushed, and glibc's allocator (``memory.py``)."""

from __future__ import annotations

import torch
from omegaconf import DictConfig

from lmtrain.process.memory import reuse_freed_memory
from lmtrain.process.threads import apply_threads


def prepare_process(cfg: DictConfig) -> None:
    """Threads (parallel jobs share the cores instead of fighting over them), matmul precision, subnormal floats
    flushed, and glibc malloc kept from faulting each step's big buffers in again (``reuse_freed_memory``). The seed:
    ``lmtrain.run_folder.rng.seed_run``."""
    apply_threads(cfg.get("threads", "auto"))
    torch.set_float32_matmul_precision("high")
    torch.set_flush_denormal(True)  # tiny LSTM gradients as subnormal floats are very slow on CPUs
    if cfg.get("reuse_freed_memory", True):
        reuse_freed_memory()  # no page faults for each step's big buffers (lmtrain.process.memory)

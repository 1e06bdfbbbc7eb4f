"""Which code paths the device-dependent parts take: ``execution: auto | cpu | gpu`` (one switch for the run).

The same algorithm can be written for a CPU or for a GPU, and the two want different code. On a CPU, work is cut
into cache-sized blocks, the distinct rows of a batch are found (``torch.unique``) so that each is computed once,
and a cost rule picks a dense product or a gather from measured CPU speeds. On a GPU every operator is a kernel
launch with microseconds of host time and every data-dependent size (``unique``, ``nonzero``, ``.item()``) is a
host sync that stalls the queue, so the GPU paths use fixed shapes: whole-level products and gathers, duplicates
masked instead of removed, no Python loop whose length grows with the batch, the samples or the vocabulary.

Both paths compute the same distributions and the same losses (the GPU paths may differ in float rounding);
``execution=gpu`` on a CPU runs the GPU paths, which is how the tests check them and count their launches here.
A part with two paths derives from ``DeviceAware``; ``set_execution`` switches every such part of a module tree.
"""

from __future__ import annotations

from enum import Enum

import torch
from torch import nn


class Execution(str, Enum):
    """The ``execution`` setting: ``auto`` follows the device the run trains on."""

    auto = "auto"
    cpu = "cpu"
    gpu = "gpu"


class DeviceAware:
    """A part with CPU and GPU code paths; ``gpu_paths`` is which it takes (set by ``set_execution``)."""

    gpu_paths: bool = False

    def use_gpu_paths(self, on: bool) -> None:
        self.gpu_paths = bool(on)


def resolve_execution(setting: str | Execution, accelerator: str = "auto") -> Execution:
    """``auto`` -> ``gpu`` when the run trains on a CUDA device (``trainer.accelerator`` gpu/cuda, or auto with
    one available), else ``cpu``; ``cpu`` and ``gpu`` stay as they are."""
    choice = Execution(setting)
    if choice is not Execution.auto:
        return choice
    on_gpu = accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())
    return Execution.gpu if on_gpu else Execution.cpu


def set_execution(module: nn.Module, execution: str | Execution) -> None:
    """Switch every ``DeviceAware`` part of ``module`` (itself included) to the paths of ``execution``."""
    gpu = Execution(execution) is Execution.gpu
    for part in module.modules():
        if isinstance(part, DeviceAware):
            part.use_gpu_paths(gpu)

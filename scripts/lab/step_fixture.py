"""One training step ready to run on its own: the model a config describes, its optimizer and random batches.

What ``lab.launches`` counts, ``lab.traffic`` models and ``scripts/profile_step.py`` profiles:
``step_fixture`` builds the default model (or any ``output=`` / ``sampler=`` choice) for a vocabulary of Zipf counts,
without a corpus, and ``StepFixture.step`` takes one ``lmtrain.training.step.train_step``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor


def synthetic_counts(num_classes: int) -> torch.Tensor:
    """Zipf training counts (c_i ∝ 1 / (i + 1)) of a vocabulary of ``num_classes``: what unigram-based parts read."""
    return (1e7 / torch.arange(1, num_classes + 1, dtype=torch.float64)).round().clamp_min(1).long()


@dataclass
class StepFixture:
    """What one ``train_step`` needs: a built module, its optimizer, the config and random batches."""

    module: Any
    optimizer: torch.optim.Optimizer
    cfg: Any
    batches: list[tuple[Tensor, Tensor]]  # (inputs, targets), (B, T) token ids each, made before any step

    def step(self, batch: tuple[Tensor, Tensor], state: Any) -> Any:
        """One ``train_step`` on ``batch`` from ``state``; its ``Window``."""
        from lmtrain.training.step import train_step

        module, cfg = self.module, self.cfg
        return train_step(
            module.encoder, module.output, batch, state, self.optimizer, cfg.optim.clip, cfg.loss_reduction
        )


def step_fixture(
    overrides: list[str],
    num_classes: int,
    steps: int,
    batch: tuple[int, int] = (20, 35),
    seed: int = 0,
    device: str = "cpu",
) -> StepFixture:
    """The model ``overrides`` describe (the default model otherwise) for a vocabulary of ``num_classes`` with Zipf
    counts, on ``device`` (``trainer.accelerator=cpu`` on a CPU, else ``gpu``), and ``steps`` random windows of
    ``batch`` (B, T) drawn beforehand: the data is not the step's work. The override ``execution=gpu`` (this
    apparatus's own) takes the forms a GPU takes on any device (``as_on_a_gpu``), ``execution=cpu`` a CPU's."""
    from lmtrain.config import compose_config
    from lmtrain.training.build import build_module

    accelerator = "cpu" if torch.device(device).type == "cpu" else "gpu"
    overrides, gpu_forms = forms(overrides, torch.device(device).type == "cuda")
    cfg = compose_config(
        ["data=synthetic", f"data.vocab_size={num_classes}", f"trainer.accelerator={accelerator}", *overrides]
    )
    torch.manual_seed(seed)
    counts = synthetic_counts(num_classes)
    stream = torch.multinomial(counts.double(), 20_000, replacement=True)  # a token stream for bigram-type parts
    module = build_module(cfg, num_classes, counts, stream).to(device)
    module.train()
    if gpu_forms:
        as_on_a_gpu(module)
    optimizer = module.configure_optimizers()["optimizer"]
    if gpu_forms:  # torch's optimizers default to their multi-tensor (foreach) kernels on CUDA tensors
        sparse = {id(p) for p in module.sparse_parameters()}
        for group in getattr(optimizer, "param_groups", []):
            if not any(id(p) in sparse for p in group["params"]):  # sparse gradients take the per-tensor path
                group["foreach"] = True
    rows, cols = batch
    windows = torch.multinomial(counts.double(), steps * rows * (cols + 1), replacement=True)
    windows = windows.view(steps, rows, cols + 1).to(device)
    batches = [(w[:, :-1].contiguous(), w[:, 1:].contiguous()) for w in windows]  # inputs, targets (B, T)
    return StepFixture(module, optimizer, cfg, batches)


def forms(overrides: list[str], on_gpu: bool) -> tuple[list[str], bool]:
    """``overrides`` without this apparatus's ``execution=cpu|gpu``, and whether the step takes a GPU's forms (by
    ``execution``, else by the device)."""
    rest = [o for o in overrides if not o.startswith("execution=")]
    named = [o.split("=", 1)[1] for o in overrides if o.startswith("execution=")]
    return rest, (named[-1] == "gpu") if named else on_gpu


def as_on_a_gpu(module: torch.nn.Module) -> None:
    """Make ``module`` take, on any device, the forms it takes on a GPU: a kernel tree's fixed backend and the
    adaptive softmax's fixed-shape loss (the only device choices; so a CPU counts what a GPU step launches)."""
    take_forms(module, gpu=True)


def as_on_a_cpu(module: torch.nn.Module) -> None:
    """Make ``module`` take, on any device, the forms it takes on a CPU (``as_on_a_gpu``'s counterpart)."""
    take_forms(module, gpu=False)


def take_forms(module: torch.nn.Module, gpu: bool) -> None:
    """The device choices of ``module``'s parts, forced to a GPU's forms or a CPU's."""
    from lmtrain.output.adaptive import AdaptiveSoftmax
    from lmtrain.sampler.kernel import KernelSampler

    for part in module.modules():
        if isinstance(part, KernelSampler):
            part.backend = "fixed" if gpu else "walk"
            part.tree.use_fixed_backend(gpu)
        elif isinstance(part, AdaptiveSoftmax):
            part.fixed_shapes = gpu

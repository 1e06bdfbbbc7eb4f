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
    ``batch`` (B, T) drawn beforehand: the data is not the step's work. The step takes the forms of the device
    (``step_forms=auto``); ``step_forms=gpu`` takes the forms a GPU takes on any device, ``step_forms=cpu`` a
    CPU's."""
    from lmtrain.config import compose_config
    from lmtrain.run.build import build_module, step_forms

    accelerator = "cpu" if torch.device(device).type == "cpu" else "gpu"
    cfg = compose_config(
        ["data=synthetic", f"data.vocab_size={num_classes}", f"trainer.accelerator={accelerator}", *overrides]
    )
    torch.manual_seed(seed)
    counts = synthetic_counts(num_classes)
    stream = torch.multinomial(counts.double(), 20_000, replacement=True)  # a token stream for bigram-type parts
    module = build_module(cfg, num_classes, counts, stream, device=device).to(device)
    module.train()
    optimizer = module.configure_optimizers()["optimizer"]
    # a GPU's forms: the optimizer's multi-tensor (foreach) kernels, which torch takes by default for CUDA tensors
    if step_forms(cfg, device).fixed_shapes:
        sparse = {id(p) for p in module.sparse_parameters()}
        for group in getattr(optimizer, "param_groups", []):
            if not any(id(p) in sparse for p in group["params"]):  # sparse gradients take the per-tensor path
                group["foreach"] = True
    rows, cols = batch
    windows = torch.multinomial(counts.double(), steps * rows * (cols + 1), replacement=True)
    windows = windows.view(steps, rows, cols + 1).to(device)
    batches = [(w[:, :-1].contiguous(), w[:, 1:].contiguous()) for w in windows]  # inputs, targets (B, T)
    return StepFixture(module, optimizer, cfg, batches)

"""Test helpers: Lightning callbacks referenced from configs by `_target_`, and the proposal protocol in short."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning as L
import torch

from lmtrain.sampler.base import Sampler
from lmtrain.sampler.proposal import Draws, Proposal


class SimulatedCrash(RuntimeError):
    """The failure CrashAtStep raises."""


class CrashAtStep(L.Callback):
    """Raises after optimizer step `step` (its periodic checkpoint written), like a process killed mid-epoch."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step >= self.step:
            raise SimulatedCrash(f"simulated crash after step {self.step}")


class SaveTreeSums(L.Callback):
    """At the end of training, saves this rank's kernel-tree node sums and output weights to `folder`."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def on_train_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        from pathlib import Path

        import torch

        from lmtrain.sampler.kernel.tree import KernelTree

        trees = [m.nodes.detach().cpu().clone() for m in module.modules() if isinstance(m, KernelTree)]
        weights = {n: p.detach().cpu().clone() for n, p in module.output.named_parameters()}
        Path(self.folder).mkdir(parents=True, exist_ok=True)
        torch.save({"trees": trees, "weights": weights}, Path(self.folder) / f"rank{trainer.global_rank}.pt")


class PoisonAtStep(L.Callback):
    """Fills one weight with NaN after optimizer step `step`, as a diverging update would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: L.Trainer, module: L.LightningModule, *args: Any) -> None:
        if trainer.global_step == self.step:
            with torch.no_grad():
                next(module.parameters()).fill_(float("nan"))


class RecordProgressBar(L.Callback):
    """Writes the training progress bar's description, total and position after the first batch to `path`."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.done = False

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if self.done:
            return
        import json
        from pathlib import Path

        bar = trainer.progress_bar_callback.train_progress_bar
        Path(self.path).write_text(json.dumps({"desc": bar.desc, "total": bar.total, "n": bar.n}))
        self.done = True


class SignalAtStep(L.Callback):
    """Sends this process ``signal`` (a name: SIGTERM, SIGINT, ...) when the batch after optimizer step ``step``
    starts, so that it arrives while that step is under way; ``again``: a second one while checkpoints are written;
    ``rank``: only that rank's process gets it (under DDP; default: every rank's)."""

    def __init__(self, step: int, signal: str = "SIGTERM", again: str | None = None, rank: int | None = None) -> None:
        self.step, self.signal, self.again, self.rank = step, signal, again, rank

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        import os
        import signal

        if trainer.global_step == self.step and self.rank in (None, trainer.global_rank):
            os.kill(os.getpid(), getattr(signal, self.signal))

    def on_save_checkpoint(self, trainer: L.Trainer, *args: Any) -> None:
        import os
        import signal

        if self.again and trainer.global_step > self.step:
            os.kill(os.getpid(), getattr(signal, self.again))


class CountStepSyncs(L.Callback):
    """Counts the host syncs (``lab.launches.DispatchCounter``) of each training step of a real fit, from
    one batch start to the next, Lightning's own hooks, logging and callbacks included; a step during which the run
    validated or saved a checkpoint is marked busy. The last instance is ``CountStepSyncs.last``."""

    last: CountStepSyncs | None = None

    def __init__(self) -> None:
        from lab.launches import DispatchCounter

        self.counter = DispatchCounter()
        self.marks: list[int] = []  # the sync count at each batch start, then at the end of training
        self.busy: set[int] = set()  # steps (indices into marks) that validated or checkpointed
        CountStepSyncs.last = self

    def on_train_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self.counter.__enter__()

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        self.marks.append(self.counter.counts.syncs)

    def on_validation_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self.busy.add(len(self.marks) - 1)

    def on_save_checkpoint(self, trainer: L.Trainer, *args: Any) -> None:
        self.busy.add(len(self.marks) - 1)

    def on_train_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self.marks.append(self.counter.counts.syncs)
        self.counter.__exit__(None, None, None)

    def per_step(self) -> dict[int, int]:
        """Syncs of every step that neither validated nor checkpointed, by step index."""
        counts = [b - a for a, b in zip(self.marks, self.marks[1:], strict=False)]
        return {step: n for step, n in enumerate(counts) if step not in self.busy}


def draw_negatives(
    layer: Any, hidden: torch.Tensor, inputs: torch.Tensor | None = None, target: torch.Tensor | None = None
):
    """(ids, log q, tries) of a sampled output's draw for ``hidden`` (N, d), as a training step draws them."""
    drawn = layer.draw(layer.propose(layer.query(hidden), inputs, target))
    return drawn.ids, drawn.log_q, drawn.tries


def sample_from(sampler: Any, query: torch.Tensor | None, num_samples: int, inputs: torch.Tensor | None = None):
    """(ids, log q) of ``num_samples`` draws from ``sampler``'s proposal for this context."""
    drawn = sampler.propose(query, inputs).draw(num_samples)
    return drawn.ids, drawn.log_q


def log_q_from(sampler: Any, query: torch.Tensor | None, ids: torch.Tensor, inputs: torch.Tensor | None = None):
    """log q of ``ids`` under ``sampler``'s proposal for this context."""
    return sampler.propose(query, inputs).log_q(ids)


def log_q_all_from(sampler: Any, query: torch.Tensor, num_classes: int, inputs: torch.Tensor | None = None):
    """log q of every class at every position, (N, n), under ``sampler``'s proposal for this context."""
    return sampler.propose(query, inputs).log_q_all(num_classes)


class RelabeledLogQ(Sampler):
    """``inner``'s draws with their log q (and the targets') passed through ``relabel(ids, log_q)``: a deliberately
    wrong correction, for tests that must detect one."""

    def __init__(self, inner: Sampler, relabel: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.inner, self.relabel = inner, relabel
        self.shared = inner.shared

    def share_negatives(self, shared: bool) -> None:
        self.inner.share_negatives(shared)
        self.shared = self.inner.shared

    def propose(self, query: Any, inputs: Any = None, targets: Any = None) -> Proposal:
        return RelabeledProposal(self.inner.propose(query, inputs, targets), self.relabel, targets)


class RelabeledProposal(Proposal):
    """``RelabeledLogQ``'s proposal of one step."""

    def __init__(self, inner: Proposal, relabel: Callable, targets: torch.Tensor | None) -> None:
        self.inner, self.relabel, self.targets = inner, relabel, targets
        self.shared, self.positions = inner.shared, inner.positions

    def draw(self, num_samples: int) -> Draws:
        ids, log_q, target_log_q, joint_ids = self.inner.draw(num_samples)
        if target_log_q is not None:
            target_log_q = self.relabel(self.targets.view(-1, 1), target_log_q)
        return Draws(ids, self.relabel(ids, log_q), target_log_q, joint_ids)

    def log_q(self, ids: torch.Tensor) -> torch.Tensor:
        return self.relabel(ids, self.inner.log_q(ids))

"""Small Lightning callbacks: a one-line summary per epoch."""

from __future__ import annotations

import logging

import lightning as L

log = logging.getLogger("lmtrain")


class EpochSummary(L.Callback):
    """Logs one readable line per validation: epoch, exact val perplexity, lr and throughput."""

    def on_validation_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        m = trainer.callback_metrics
        parts = [f"epoch {trainer.current_epoch + 1}", f"step {trainer.global_step}"]
        for key, fmt in (
            ("val/ppl", "{:.2f}"),
            ("train/loss_epoch", "{:.4f}"),
            ("lr", "{:.4g}"),
            ("tokens_per_sec", "{:,.0f}"),
        ):
            if key in m:
                parts.append(f"{key.replace('_epoch', '')} " + fmt.format(float(m[key])))
        log.info(" | ".join(parts))

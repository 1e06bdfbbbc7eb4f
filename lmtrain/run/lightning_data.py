"""The data module as Lightning's Trainer takes it: a ``LightningDataModule`` around a ``lmtrain.data`` module."""

from __future__ import annotations

import lightning as L
from torch.utils.data import DataLoader

from lmtrain.data.datamodule import LMDataModule


class LightningData(L.LightningDataModule):
    """Lightning's hooks over ``data``: its loaders, with the trainer's epoch (``variable_bptt`` lays out the
    training windows per epoch) and this process's rank and world size under DDP (each rank reads its rows)."""

    def __init__(self, data: LMDataModule) -> None:
        super().__init__()
        self.data = data

    def setup(self, stage: str | None = None) -> None:
        self.data.setup()

    def _placed(self) -> LMDataModule:
        trainer = self.trainer
        if trainer is not None and trainer.world_size > 1:
            self.data.shard = (trainer.global_rank, trainer.world_size)
        return self.data

    def train_dataloader(self) -> DataLoader:
        epoch = self.trainer.current_epoch if self.trainer is not None else None
        return self._placed().train_dataloader(epoch)

    def val_dataloader(self) -> DataLoader:
        return self._placed().val_dataloader()

    def test_dataloader(self) -> DataLoader:
        return self._placed().test_dataloader()

"""BPTT batching: windows in order, mid-epoch resume of the train loader, the positions each DDP rank sees."""

from __future__ import annotations

import math
import types

import pytest
import torch

from lmtrain.data import (
    DataError,
    StreamSampler,
    SyntheticDataModule,
    WindowDataset,
    batchify,
)
from lmtrain.run.lightning_data import LightningData


def test_batchify_and_windows_cover_the_stream_in_order() -> None:
    ids = torch.arange(103)
    data = batchify(ids, 4)  # (4, 25), 3 tokens dropped
    assert data.shape == (4, 25) and torch.equal(data[1], torch.arange(25, 50))
    windows = WindowDataset(data, bptt=7)
    assert len(windows) == math.ceil(24 / 7) == 4
    inputs = torch.cat([windows[i][0] for i in range(len(windows))], 1)
    targets = torch.cat([windows[i][1] for i in range(len(windows))], 1)
    assert torch.equal(inputs, data[:, :-1]) and torch.equal(targets, data[:, 1:])
    assert windows[3][0].shape == (4, 3)  # the last window is shorter
    for i in range(len(windows) - 1):  # continuity: the next window starts where this one's targets end
        assert torch.equal(windows[i][1][:, -1], windows[i + 1][0][:, 0])
    with pytest.raises(DataError, match="too few"):
        batchify(torch.arange(5), 4)


def test_train_loader_resume_mid_epoch() -> None:
    dm = SyntheticDataModule(
        vocab_size=30, train_tokens=4_000, valid_tokens=500, test_tokens=500, batch_size=4, bptt=10
    )
    dm.setup()
    full = list(dm.train_dataloader())
    assert len(full) == dm.num_train_windows == math.ceil((4_000 // 4 - 1) / 10)
    dm.train_sampler.set_start(37)
    loader = dm.train_dataloader()
    assert len(loader) == dm.num_train_windows  # the epoch length Lightning plans with stays the same
    resumed = list(loader)
    assert len(resumed) == dm.num_train_windows - 37
    for (x, y), (x_ref, y_ref) in zip(resumed, full[37:], strict=True):
        assert torch.equal(x, x_ref) and torch.equal(y, y_ref)
    assert dm.train_sampler.start == 0 and len(list(dm.train_dataloader())) == dm.num_train_windows
    assert next(iter(StreamSampler(dm.num_train_windows, start=12))) == 12
    with pytest.raises(DataError, match="same data"):
        StreamSampler(5, start=12)


def test_ddp_ranks_see_the_single_process_positions() -> None:
    kw = dict(vocab_size=30, train_tokens=3_000, valid_tokens=800, test_tokens=800, batch_size=4, bptt=9)
    single = SyntheticDataModule(**kw)
    single.setup()
    ranks = []
    for rank in range(2):  # through the Lightning adapter, which gives each rank its place from the trainer
        dm = LightningData(SyntheticDataModule(**kw))
        dm.trainer = types.SimpleNamespace(world_size=2, global_rank=rank, current_epoch=0)
        dm.setup()
        ranks.append(dm)
    for make in ("train_dataloader", "val_dataloader", "test_dataloader"):
        one = list(getattr(single, make)())
        parts = [list(getattr(dm, make)()) for dm in ranks]
        assert len(parts[0]) == len(parts[1]) == len(one)
        for (x, y), (x0, y0), (x1, y1) in zip(one, *parts, strict=True):
            assert torch.equal(x, torch.cat([x0, x1])) and torch.equal(y, torch.cat([y0, y1]))
    odd = SyntheticDataModule(**{**kw, "batch_size": 3})
    odd.shard = (0, 2)  # rank 0 of 2
    odd.setup()
    with pytest.raises(DataError, match="not divisible"):
        odd.train_dataloader()

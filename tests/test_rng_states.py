"""The RNG states a checkpoint carries (``lmtrain.run_folder.rng``): the CPU's, numpy's, python's and, once CUDA is in
use, every CUDA device's, so that a resumed GPU run does not draw its dropout masks and negatives again. They load
with ``torch.load(weights_only=True)``; a checkpoint without the CUDA states (older, or of a CPU run) still loads."""

from __future__ import annotations

import io
import random

import numpy as np
import pytest
import torch

from lmtrain.run_folder import rng
from lmtrain.run_folder.rng import get_rng_states, set_rng_states
from tests.conftest import DEVICES


def through_a_file(states: dict) -> dict:
    """``states`` saved and read back as a checkpoint is."""
    buffer = io.BytesIO()
    torch.save({"lmtrain": {"rng": states}}, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)["lmtrain"]["rng"]


def draws(device: str) -> list:
    return [torch.rand(4, device=device).cpu(), np.random.rand(2), random.random()]


@pytest.mark.parametrize("device", DEVICES)
def test_the_states_read_back_draw_the_same_numbers_again(device):
    torch.zeros(1, device=device)  # CUDA in use, where the device is a GPU
    states = through_a_file(get_rng_states())
    assert ("cuda" in states) == (device == "cuda")
    first = draws(device)
    set_rng_states(states)
    again = draws(device)
    assert torch.equal(again[0], first[0]) and np.array_equal(again[1], first[1]) and again[2] == first[2]


class FakeCuda:
    """Two CUDA devices whose generator states are byte tensors; records what is set."""

    def __init__(self, current: int) -> None:
        self.states = [torch.tensor([1, 2], dtype=torch.uint8), torch.tensor([3, 4], dtype=torch.uint8)]
        self.current, self.set_calls = current, []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        cuda = rng.torch.cuda
        monkeypatch.setattr(cuda, "is_available", lambda: True)
        monkeypatch.setattr(cuda, "is_initialized", lambda: True)
        monkeypatch.setattr(cuda, "device_count", lambda: 2)
        monkeypatch.setattr(cuda, "current_device", lambda: self.current)
        monkeypatch.setattr(cuda, "get_rng_state_all", lambda: [s.clone() for s in self.states])
        monkeypatch.setattr(cuda, "set_rng_state", lambda state, index: self.set_calls.append((state.tolist(), index)))


def test_every_cuda_devices_state_is_saved_and_restored_and_a_rank_takes_the_writers_device(monkeypatch):
    """Written by rank 0 (device 0); read back by a process on device 1 (DDP rank 1): devices 0 and 1 take their
    own states, then device 1, where this process draws, the writer's device 0 state."""
    writer = FakeCuda(current=0)
    writer.install(monkeypatch)
    states = through_a_file(get_rng_states())
    assert [s.tolist() for s in states["cuda"]["states"]] == [[1, 2], [3, 4]] and states["cuda"]["device"] == 0
    reader = FakeCuda(current=1)
    reader.install(monkeypatch)
    set_rng_states(states)
    assert reader.set_calls == [([1, 2], 0), ([3, 4], 1), ([1, 2], 1)]


def test_a_checkpoint_without_cuda_states_loads_where_cuda_is_in_use(monkeypatch):
    older = {key: value for key, value in get_rng_states().items() if key != "cuda"}  # as checkpoints were written
    reader = FakeCuda(current=0)
    reader.install(monkeypatch)
    set_rng_states(through_a_file(older))
    assert reader.set_calls == []  # the CUDA generators left as they are


def test_no_cuda_states_where_cuda_is_not_in_use(monkeypatch):
    monkeypatch.setattr(rng.torch.cuda, "is_initialized", lambda: False)  # a CPU run on a GPU machine
    assert "cuda" not in get_rng_states()


@pytest.mark.cuda
def test_a_resumed_gpu_run_with_dropout_ends_as_the_straight_run(tiny_config, tmp_path, monkeypatch):
    """Dropout masks come from the CUDA generator: a run crashed after step 40 (its last checkpoint at step 30) and
    resumed draws the masks the straight run drew, so it ends with its perplexity (deterministic kernels)."""
    from lmtrain.run.run import train
    from tests.helpers import SimulatedCrash

    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    common = ["trainer.accelerator=gpu", "+trainer.deterministic=true", "model.dropout=0.3", "trainer.max_epochs=2"]
    common += ["checkpoint_every_n_steps=30", "test_after_fit=false", "data.train_tokens=10000"]
    expected = train(tiny_config(*common, run_dir=tmp_path / "straight"))
    crash = ["+callbacks.c._target_=tests.helpers.CrashAtStep", "+callbacks.c.step=40"]
    with pytest.raises(SimulatedCrash):
        train(tiny_config(*common, *crash, run_dir=tmp_path / "split"))
    resumed = train(tiny_config(*common, "ckpt_path=last", run_dir=tmp_path / "split"))
    assert resumed["val/ppl"] == pytest.approx(expected["val/ppl"], rel=1e-6)

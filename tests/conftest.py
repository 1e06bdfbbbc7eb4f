"""Shared fixtures: compose the real config tree with small, fast settings."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from omegaconf import DictConfig

from lmtrain.overrides import compose_config

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

SHARED_DATA = Path(os.environ.get("LMTRAIN_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data"))

TINY = [
    "data=synthetic",
    "model.emb_dim=32",
    "model.hidden_dim=32",
    "model.num_layers=1",
    "logger=csv",
    "progress_bar=false",
    "trainer.accelerator=cpu",
    "data.train_tokens=60000",
    "data.valid_tokens=8000",
    "data.test_tokens=8000",
    "data.batch_size=16",
    "data.bptt=20",
]


def make_config(overrides: list[str] | None = None) -> DictConfig:
    return compose_config(list(overrides or []))


@pytest.fixture
def tiny_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., DictConfig]:
    """tiny_config(*overrides) -> a config for a seconds-long run on the synthetic corpus under tmp_path."""
    monkeypatch.setenv("LMTRAIN_CACHE_DIR", str(tmp_path / "cache"))

    def build(*overrides: str, run_dir: Path | None = None) -> DictConfig:
        run = run_dir or tmp_path / "run"
        return make_config([*TINY, f"run_dir={run}", *overrides])

    return build

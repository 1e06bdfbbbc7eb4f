"""Shared fixtures: compose the real config tree with small, fast settings."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig

from lmtrain.config import compose_config

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

SHARED_DATA = Path(os.environ.get("LMTRAIN_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data"))

# in-process runs (``train(cfg)``, ``tiny_config``); command-line runs take the smaller ``tests.cli_runs.TINY``.
# The seeded metrics (tests/test_seeded_metrics.py) are fixed for these model sizes: change them with that file.
TINY = [
    "data=synthetic",
    "model.emb_dim=32",
    "model.hidden_dim=32",
    "model.num_layers=1",
    "logger=csv",
    "progress_bar=false",
    "trainer.val_check_interval=1.0",  # at epoch ends and max_steps only, not ~10 times (tests say when)
    "trainer.accelerator=cpu",
    "data.train_tokens=60000",
    "data.valid_tokens=8000",
    "data.test_tokens=8000",
    "data.batch_size=16",
    "data.bptt=20",
]

# a test parametrized over DEVICES runs on the CPU and, marked `cuda`, on a GPU; skipped where there is none
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (``-n N``, README's fast suite) the N workers share the machine's cores: each takes its share
    as torch threads, and lmtrain's own runs (``threads=auto``, command-line runs) are told that N processes share
    them (``LMTRAIN_CONCURRENT_JOBS``), so no worker's threads wait on another's."""
    from lmtrain.process.threads import JOBS_ENV, usable_cores

    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    if workers > 1:
        os.environ.setdefault(JOBS_ENV, str(workers))
        torch.set_num_threads(max(1, usable_cores() // workers))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``cuda`` are skipped without a CUDA GPU (``pytest -m cuda`` selects them)."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


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


def write_text_corpus(folder: Path, words: int = 60, seed: int = 0) -> Path:
    """train.txt, valid.txt and test.txt of lines of 1 to 12 words drawn from a Zipf-Markov source over w0, w1, ...;
    valid and test end with a line holding the word "oov", which train lacks (read as <unk>). Returns the folder."""
    import torch

    from lmtrain.data.synthetic import ZipfMarkovSource

    source = ZipfMarkovSource(words, seed=seed)
    folder.mkdir(parents=True, exist_ok=True)
    for index, (split, length) in enumerate((("train", 6000), ("valid", 600), ("test", 600))):
        gen = torch.Generator().manual_seed(seed + index)
        ids = source.sample(length, gen).tolist()
        cuts = torch.randint(1, 13, (length,), generator=gen).cumsum(0).tolist()
        lines = [" ".join(f"w{i}" for i in ids[a:b]) for a, b in zip([0, *cuts], cuts, strict=False) if a < length]
        lines += [] if split == "train" else ["w1 oov w2"]
        (folder / f"{split}.txt").write_text("\n".join(lines) + "\n")
    return folder


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., tuple[Path, dict[str, float]]]:
    """trained_run(output, corpus, *overrides) -> (run folder, final metrics) of a tiny run trained for 8 steps and
    tested with data.eval_batch_size=1, one per (output, corpus, overrides) in the session. corpus "synthetic": no
    <eos>, no <unk>; "text": write_text_corpus, lines end in <eos> and the vocabulary has <unk>."""
    from lmtrain.run.run import train

    runs: dict[tuple[str, ...], tuple[Path, dict[str, float]]] = {}

    def get(output: str = "full", corpus: str = "synthetic", *more: str) -> tuple[Path, dict[str, float]]:
        key = (output, corpus, *more)
        if key not in runs:
            root = tmp_path_factory.mktemp(f"{output}-{corpus}")
            common = [o for o in TINY if not o.startswith(("data=", "data.train_", "data.valid_", "data.test_"))]
            if corpus == "synthetic":
                data = ["data=synthetic", "data.train_tokens=6000", "data.valid_tokens=600", "data.test_tokens=600"]
            else:
                data = ["data=text", f"data.path={write_text_corpus(root / 'corpus')}", f"data.cache_dir={root}/cache"]
            steps = ["trainer.max_steps=8", "data.eval_batch_size=1", f"run_dir={root / 'run'}"]
            runs[key] = root / "run", train(make_config([*common, *data, f"output={output}", *more, *steps]))
        return runs[key]

    return get


@pytest.fixture
def one_thread():
    """Single-threaded: on a shared 2-core machine, OpenMP hand-offs cost more than they save in small kernels."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

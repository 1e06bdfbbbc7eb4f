"""Loading a trained run for the tools (diagnose, generate, score): checkpoint, config, vocabulary, model, device.

``ckpt_path`` is a ``.ckpt`` file inside a run folder (``RUN/checkpoints/*.ckpt``) or the run folder itself, which
means its best checkpoint, else ``last.ckpt``. The model is rebuilt from the run's resolved ``RUN/config.yaml`` and
gets the checkpoint's weights. The tools' arguments are ``key=value`` like the trainer's, and ``data.KEY=VALUE``
overrides the run's data config where the data is read (e.g. a corpus that moved).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from lmtrain.data.errors import DataError
from lmtrain.data.tokenizer import Words
from lmtrain.data.vocab import VOCAB_FILE, Vocabulary
from lmtrain.run.build import build_model, build_module, needs_train_ids
from lmtrain.run_folder.checkpoints import check_compatible, read_checkpoint
from lmtrain.run_folder.ckpt_path import CheckpointError
from lmtrain.training.module import LanguageModel


def parse_options(
    argv: list[str], defaults: dict[str, str], prefixes: tuple[str, ...] = ("data.",)
) -> tuple[dict[str, str], dict[str, list[str]]]:
    """``key=value`` arguments -> (options: ``defaults`` updated, overrides per prefix: ``{"data.": [...]}``).

    Raises ValueError for an argument without ``=`` or an unknown key; a tool checks the values itself."""
    options, overrides = dict(defaults), {prefix: [] for prefix in prefixes}
    keys = ", ".join([*defaults, *(f"{prefix}KEY" for prefix in prefixes)])
    for arg in argv:
        key, sep, value = arg.partition("=")
        prefix = next((p for p in prefixes if key.startswith(p)), None)
        if not sep:
            raise ValueError(f"arguments are key=value, got {arg!r}; keys: {keys}")
        if prefix is not None:
            overrides[prefix].append(arg)
        elif key in defaults:
            options[key] = value
        else:
            raise ValueError(f"unknown argument {key!r}; keys: {keys}")
    if "ckpt_path" in options and not options["ckpt_path"]:
        raise ValueError("pass ckpt_path=PATH/TO/checkpoint.ckpt (or a run folder)")
    return options, overrides


def resolve_checkpoint(path: Path) -> Path:
    """A .ckpt file, or a run folder: its best checkpoint, else last.ckpt."""
    if path.is_dir():
        found = sorted((path / "checkpoints").glob("best-*.ckpt")) or sorted((path / "checkpoints").glob("last.ckpt"))
        if not found:
            raise CheckpointError(f"ckpt_path {path} is a folder without checkpoints/best-*.ckpt or last.ckpt")
        return found[-1]
    if not path.is_file():
        raise CheckpointError(f"ckpt_path {path} does not exist; pass a run folder or a .ckpt file in one")
    return path


def run_config(ckpt: Path, data_overrides: list[str]) -> DictConfig:
    """The run's resolved config (RUN/config.yaml beside RUN/checkpoints/) with ``data.*`` overrides applied."""
    config = ckpt.parent.parent / "config.yaml"
    if not config.is_file():
        raise CheckpointError(f"no config.yaml in {config.parent}: the tools read the run's config beside checkpoints/")
    return OmegaConf.merge(OmegaConf.load(config), OmegaConf.from_dotlist(data_overrides))


def load_weights(module: LanguageModel, saved: dict[str, Any], ckpt: Path) -> LanguageModel:
    """``module`` with the checkpoint's weights, in eval mode (no dropout)."""
    check_compatible(saved, module.signature, ckpt)
    try:
        module.load_state_dict(saved["state_dict"])
    except RuntimeError as exc:
        reason = str(exc).splitlines()[0]
        raise CheckpointError(f"ckpt_path {ckpt} does not fit the model of its run's config.yaml ({reason})") from exc
    return module.eval()


def load_model(ckpt: Path, data_overrides: list[str]) -> tuple[Any, LanguageModel]:
    """The run's data module (set up) and model with the checkpoint's weights, on the CPU (diagnose reads the held-out
    data)."""
    saved = read_checkpoint(ckpt)
    datamodule, module = build_model(run_config(ckpt, data_overrides), device="cpu")
    return datamodule, load_weights(module, saved, ckpt)


def pick_device(name: str) -> torch.device:
    """``auto`` (a CUDA GPU when there is one, else the CPU), ``cpu``, ``cuda`` or ``cuda:N``."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ValueError(f"device={name!r} is not a device; use auto, cpu, cuda or cuda:N") from exc
    if device.type == "cuda" and (not torch.cuda.is_available() or (device.index or 0) >= torch.cuda.device_count()):
        raise ValueError(f"device={name} is not available here ({torch.cuda.device_count()} CUDA GPUs); use device=cpu")
    return device


@dataclass
class TrainedModel:
    """A trained LanguageModel in eval mode on ``device``, with the vocabulary its run was trained on."""

    module: LanguageModel
    vocab: Vocabulary
    checkpoint: Path
    device: torch.device

    @property
    def run_dir(self) -> Path:
        """The run folder (parent of checkpoints/)."""
        return self.checkpoint.parent.parent


def load_trained(ckpt_path: str, data_overrides: list[str], device: str = "auto") -> TrainedModel:
    """The model of a run (``ckpt_path``: a checkpoint or a run folder) with its weights and vocabulary.

    The vocabulary and the training counts come from ``RUN/vocab.tsv``, so the training data is not read; a run that
    predates that file, or whose strategy is built from the training stream (``sampler=bigram``), rebuilds its data
    from the run's config (``data.*`` overrides apply) and must then find the same vocabulary.
    """
    target = pick_device(device)
    ckpt = resolve_checkpoint(Path(ckpt_path).expanduser())
    saved = read_checkpoint(ckpt)
    cfg = run_config(ckpt, data_overrides)
    words = Words(str(cfg.data.get("tokenizer") or Words.whitespace))  # how the run cut its text into words
    vocab, train_ids = Vocabulary.read(ckpt.parent.parent, words.split), None
    if vocab is None or needs_train_ids(cfg):
        datamodule = instantiate(cfg.data)
        datamodule.setup()
        rebuilt, train_ids = Vocabulary(datamodule.vocab, datamodule.counts, words.split), datamodule.train_ids
        if vocab is not None and (vocab.words != rebuilt.words or not torch.equal(vocab.counts, rebuilt.counts)):
            raise DataError(f"the data of {ckpt.parent.parent} no longer gives the vocabulary in its {VOCAB_FILE}")
        vocab = vocab or rebuilt
    module = build_module(cfg, len(vocab), vocab.counts, train_ids, vocab.words, target)  # words: a spelling output's
    return TrainedModel(load_weights(module, saved, ckpt).to(target), vocab, ckpt, target)

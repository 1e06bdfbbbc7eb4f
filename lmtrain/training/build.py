"""Building from the config: a part is ``instantiate(cfg)`` plus the run-time values its class declares, and the
model is the data module and the LanguageModel (encoder + output strategy), for training (``lmtrain.training.run``)
and for the tools that load a trained run (``lmtrain.tools.trained``).

Every part class names the values it takes from the data and the model in ``runtime_args`` (``num_classes``,
``dim``, ``counts``, ``train_ids``, ``sampler``, ``words``); the config holds everything else (``lmtrain/config/``).
"""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import lightning as L
from hydra.utils import get_class, instantiate
from lightning.pytorch.plugins.precision import DoublePrecision
from omegaconf import DictConfig, OmegaConf
from torch import Tensor

from lmtrain.common.precision import PRECISION_ALIASES
from lmtrain.common.runtime import Runtime
from lmtrain.training.module import LanguageModel
from lmtrain.training.optim import sparse_rows_allowed, sparse_rows_match_dense

log = logging.getLogger("lmtrain")


def runtime_args(target: str) -> tuple[str, ...]:
    """The run-time values the class ``target`` declares (``runtime_args``; none when it declares nothing)."""
    return tuple(getattr(get_class(target), "runtime_args", ()))


def build(cfg: DictConfig, runtime: Runtime, **resolved: Any) -> Any:
    """The part ``cfg`` describes: its ``_target_`` built from the config (with the ``resolved`` values in place of
    the config's, e.g. a ``sparse_embedding: auto``) and the run-time values its class declares."""
    values = {name: getattr(runtime, name) for name in runtime_args(str(cfg._target_))}
    spec = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)  # plain strings: nothing a checkpoint refuses
    return instantiate(spec, **values, **resolved, _convert_="all")


def build_output(
    cfg: DictConfig,
    num_classes: int,
    dim: int,
    counts: Tensor,
    train_ids: Tensor | None = None,
    words: list[str] | None = None,
) -> Any:
    """The sampler (if the config has one) and then the output strategy that uses it; ``words``: the vocabulary's
    strings in id order, for a strategy that reads them (None where the caller has only a size)."""
    runtime = Runtime(num_classes, dim, counts, train_ids, words=words)
    optim = OmegaConf.to_container(cfg.optim, resolve=True, enum_to_str=True)
    resolved = {"sparse": sparse_rows_allowed(optim)} if cfg.output.get("sparse") == "auto" else {}
    if cfg.get("sampler") is not None:
        if "sampler" not in runtime_args(str(cfg.output._target_)):
            raise ValueError(
                f"output {cfg.output._target_.rsplit('.', 1)[-1]} takes no sampler; drop the sampler=... override"
            )
        runtime.sampler = build(cfg.sampler, runtime)
    return build(cfg.output, runtime, **resolved)


def needs_train_ids(cfg: DictConfig) -> bool:
    """Whether the output strategy or its sampler is built from the training token stream (``train_ids``)."""
    parts = [part for part in (cfg.output, cfg.get("sampler")) if part is not None]
    return any("train_ids" in runtime_args(str(part._target_)) for part in parts)


def build_model(cfg: DictConfig) -> tuple[L.LightningDataModule, LanguageModel]:
    """The data module (set up) and the LanguageModel (encoder + output strategy) that ``cfg`` describes."""
    datamodule = instantiate(cfg.data)
    datamodule.setup()
    with parameters_of(str(cfg.trainer.get("precision", "32-true"))):
        return datamodule, build_module(
            cfg, datamodule.num_classes, datamodule.counts, datamodule.train_ids, datamodule.vocab
        )


def parameters_of(precision: str) -> AbstractContextManager:
    """Under ``trainer.precision=64-true`` the model is made in float64 from the start, in Lightning's own
    ``module_init_context``: its initial values and a kernel tree's first sums are then float64's, not float32's
    converted afterwards. Any other precision keeps float32 weights (mixed precision casts the products)."""
    double = PRECISION_ALIASES.get(precision, precision) == "64-true"
    return DoublePrecision().module_init_context() if double else nullcontext()


def build_module(
    cfg: DictConfig, num_classes: int, counts: Tensor, train_ids: Tensor | None, words: list[str] | None = None
) -> LanguageModel:
    """The LanguageModel of ``cfg`` for a vocabulary of ``num_classes`` with these training ``counts`` (and training
    stream, for strategies built from it, and the vocabulary's ``words``, for those that read them);
    ``module.signature`` is what a checkpoint must match to be loaded."""
    optim = OmegaConf.to_container(cfg.optim, resolve=True, enum_to_str=True)
    sparse = cfg.model.get("sparse_embedding")
    resolved = {"sparse_embedding": sparse_rows_match_dense(optim)} if sparse == "auto" else {}
    encoder = build(cfg.model, Runtime(num_classes), **resolved)
    output = build_output(cfg, num_classes, encoder.output_dim, counts, train_ids, words)
    tied = bool(cfg.model.get("tie_weights"))
    if tied:  # one matrix, registered in the output (one copy in a checkpoint)
        encoder.tie(output.embed)  # the encoder reads its rows through the output
    lr_window = int(cfg.data.bptt) if cfg.data.get("variable_bptt") else None  # lr scaled by each window's length
    module = LanguageModel(encoder, output, optim, str(cfg.loss_reduction), lr_window)
    if cfg.get("execution") is not None:
        note = "execution=%s is deprecated and ignored: the device decides (a kernel tree's backend: sampler.backend)"
        log.warning(note, cfg.execution)
    model = OmegaConf.to_container(cfg.model, resolve=True)
    model.pop("sparse_embedding", None)  # how gradients are stored, not what the weights are: any checkpoint fits
    model.pop("tie_weights", None)  # its own entry, "tied": a signature without one is untied
    module.signature = {"num_classes": num_classes, "output": cfg.output._target_, "model": model, "tied": tied}
    return module

"""Building from the config: a part is ``instantiate(cfg)`` plus the run-time values its class declares, and the
model is the data module and the LanguageModel (encoder + output strategy), for training (``lmtrain.run.run``)
and for the tools that load a trained run (``lmtrain.tools.trained``).

Every part class names the values it takes from the data and the model in ``runtime_args`` (``num_classes``,
``dim``, ``counts``, ``train_ids``, ``sampler``, ``words``, ``forms``); the config holds everything else
(``lmtrain/config/``). The training step's forms (a CPU's or a GPU's: ``StepForms``) are decided here, once, when the
model is built (``step_forms``); the parts that have two read that decision, never a tensor's device.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from hydra.utils import get_class, instantiate
from lightning.pytorch.plugins.precision import DoublePrecision
from omegaconf import DictConfig, OmegaConf
from torch import Tensor

from lmtrain.common.precision import PRECISION_ALIASES
from lmtrain.common.runtime import Runtime, StepForms
from lmtrain.data.datamodule import LMDataModule
from lmtrain.training.module import LanguageModel
from lmtrain.training.optim import sparse_rows_allowed, sparse_rows_match_dense


def runtime_args(target: str) -> tuple[str, ...]:
    """The run-time values the class ``target`` declares (``runtime_args``; none when it declares nothing)."""
    return tuple(getattr(get_class(target), "runtime_args", ()))


def build(cfg: DictConfig, runtime: Runtime, **resolved: Any) -> Any:
    """The part ``cfg`` describes: its ``_target_`` built from the config (with the ``resolved`` values in place of
    the config's, e.g. a ``sparse_embedding: auto``) and the run-time values its class declares."""
    values = {name: getattr(runtime, name) for name in runtime_args(str(cfg._target_))}
    spec = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)  # plain strings: nothing a checkpoint refuses
    return instantiate(spec, **values, **resolved, _convert_="all")


# the accelerators under which Lightning trains on a CUDA GPU when this machine has one
CUDA_ACCELERATORS = ("auto", "gpu", "cuda")


def step_forms(cfg: DictConfig, device: torch.device | str | None = None) -> StepForms:
    """The forms the training step takes: as ``step_forms`` forces them (``cpu``, ``gpu``), else (``auto``) a GPU's
    where the model trains on a CUDA GPU: on ``device`` where the caller names it (the tools, which run a trained
    model where they are told), else where ``trainer.accelerator`` puts it (``auto`` and ``gpu`` take a CUDA GPU
    when this machine has one, as Lightning does); a CPU's elsewhere (an MPS GPU included)."""
    chosen = str(cfg.get("step_forms") or "auto")
    if chosen != "auto":
        return StepForms(fixed_shapes=chosen == "gpu")
    if device is not None:
        return StepForms(fixed_shapes=torch.device(device).type == "cuda")
    accelerator = str(OmegaConf.select(cfg, "trainer.accelerator", default=None) or "auto").lower()
    return StepForms(fixed_shapes=accelerator in CUDA_ACCELERATORS and torch.cuda.is_available())


def build_output(
    cfg: DictConfig,
    num_classes: int,
    dim: int,
    counts: Tensor,
    train_ids: Tensor | None = None,
    words: list[str] | None = None,
    forms: StepForms | None = None,
) -> Any:
    """The sampler (if the config has one) and then the output strategy that uses it; ``words``: the vocabulary's
    strings in id order, for a strategy that reads them (None where the caller has only a size); ``forms``: the
    training step's (None: ``step_forms(cfg)``)."""
    forms = step_forms(cfg) if forms is None else forms
    runtime = Runtime(num_classes, dim, counts, train_ids, words=words, forms=forms)
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


def build_model(cfg: DictConfig, device: torch.device | str | None = None) -> tuple[LMDataModule, LanguageModel]:
    """The data module (set up) and the LanguageModel (encoder + output strategy) that ``cfg`` describes; ``device``:
    where the model will run, where the caller knows it (``step_forms``)."""
    datamodule = instantiate(cfg.data)
    datamodule.setup()
    with parameters_of(str(cfg.trainer.get("precision", "32-true"))):
        return datamodule, build_module(
            cfg, datamodule.num_classes, datamodule.counts, datamodule.train_ids, datamodule.vocab, device
        )


def parameters_of(precision: str) -> AbstractContextManager:
    """Under ``trainer.precision=64-true`` the model is made in float64 from the start, in Lightning's own
    ``module_init_context``: its initial values and a kernel tree's first sums are then float64's, not float32's
    converted afterwards. Any other precision keeps float32 weights (mixed precision casts the products)."""
    double = PRECISION_ALIASES.get(precision, precision) == "64-true"
    return DoublePrecision().module_init_context() if double else nullcontext()


def build_module(
    cfg: DictConfig,
    num_classes: int,
    counts: Tensor,
    train_ids: Tensor | None,
    words: list[str] | None = None,
    device: torch.device | str | None = None,
) -> LanguageModel:
    """The LanguageModel of ``cfg`` for a vocabulary of ``num_classes`` with these training ``counts`` (and training
    stream, for strategies built from it, and the vocabulary's ``words``, for those that read them), in the training
    step's forms (``step_forms``; ``device``: where the model will run, where the caller knows it);
    ``module.signature`` is what a checkpoint must match to be loaded."""
    optim = OmegaConf.to_container(cfg.optim, resolve=True, enum_to_str=True)
    sparse = cfg.model.get("sparse_embedding")
    resolved = {"sparse_embedding": sparse_rows_match_dense(optim)} if sparse == "auto" else {}
    encoder = build(cfg.model, Runtime(num_classes), **resolved)
    output = build_output(cfg, num_classes, encoder.output_dim, counts, train_ids, words, step_forms(cfg, device))
    tied = bool(cfg.model.get("tie_weights"))
    if tied:  # one matrix, registered in the output (one copy in a checkpoint)
        encoder.tie(output.embed)  # the encoder reads its rows through the output
    lr_window = int(cfg.data.bptt) if cfg.data.get("variable_bptt") else None  # lr scaled by each window's length
    module = LanguageModel(encoder, output, optim, str(cfg.loss_reduction), lr_window)
    model = OmegaConf.to_container(cfg.model, resolve=True)
    model.pop("sparse_embedding", None)  # how gradients are stored, not what the weights are: any checkpoint fits
    model.pop("tie_weights", None)  # its own entry, "tied": a signature without one is untied
    module.signature = {"num_classes": num_classes, "output": cfg.output._target_, "model": model, "tied": tied}
    return module

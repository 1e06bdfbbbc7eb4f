"""The model a config describes: the data module and the LanguageModel (encoder + output strategy).

Shared by training (``lmtrain.training.run``) and the tools that load a trained run (``lmtrain.tools.trained``).
"""

from __future__ import annotations

import lightning as L
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from lmtrain.training.build import Runtime, build, build_output
from lmtrain.training.module import LanguageModel
from lmtrain.training.optim import sparse_rows_match_dense


def build_model(cfg: DictConfig) -> tuple[L.LightningDataModule, LanguageModel]:
    """The data module (set up) and the LanguageModel (encoder + output strategy) that ``cfg`` describes."""
    datamodule = instantiate(cfg.data)
    datamodule.setup()
    return datamodule, build_module(cfg, datamodule.num_classes, datamodule.counts, datamodule.train_ids)


def build_module(
    cfg: DictConfig, num_classes: int, counts: torch.Tensor, train_ids: torch.Tensor | None
) -> LanguageModel:
    """The LanguageModel of ``cfg`` for a vocabulary of ``num_classes`` with these training ``counts`` (and training
    stream, for strategies built from it); ``module.signature`` is what a checkpoint must match to be loaded."""
    optim = OmegaConf.to_container(cfg.optim, resolve=True)
    sparse = cfg.model.get("sparse_embedding")
    resolved = {"sparse_embedding": sparse_rows_match_dense(optim)} if sparse == "auto" else {}
    encoder = build(cfg.model, Runtime(num_classes), **resolved)
    output = build_output(cfg, num_classes, encoder.output_dim, counts, train_ids)
    module = LanguageModel(encoder, output, optim, cfg.loss_reduction)
    model = OmegaConf.to_container(cfg.model, resolve=True)
    model.pop("sparse_embedding", None)  # how gradients are stored, not what the weights are: any checkpoint fits
    module.signature = {"num_classes": num_classes, "output": cfg.output._target_, "model": model}
    return module

"""Output strategies: one file each, all behind ``OutputLayer`` (docs/architecture.md); the sampled family in
``sampled/``. Configs name a class by its own module (``lmtrain.output.sampled.cosine.CosineSampledSoftmax``);
checkpoints written before them by its export here, which still loads."""

from lmtrain.output.adaptive import AdaptiveSoftmax
from lmtrain.output.base import OutputLayer
from lmtrain.output.full import FullSoftmax
from lmtrain.output.hsm import HierarchicalSoftmax
from lmtrain.output.sampled import (
    NCE,
    AbsoluteSampledSoftmax,
    CosineSampledSoftmax,
    NegativeSampling,
    SampledOutput,
    SampledSoftmax,
)

__all__ = [
    "AbsoluteSampledSoftmax",
    "AdaptiveSoftmax",
    "CosineSampledSoftmax",
    "FullSoftmax",
    "HierarchicalSoftmax",
    "NCE",
    "NegativeSampling",
    "OutputLayer",
    "SampledOutput",
    "SampledSoftmax",
]

"""Output strategies: one file each, all behind ``OutputLayer`` (docs/architecture.md); the sampled family in
``sampled/``. Configs and checkpoints name the classes here (``lmtrain.output.CosineSampledSoftmax``)."""

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

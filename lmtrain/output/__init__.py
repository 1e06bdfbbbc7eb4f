"""Output strategies: one file each, all behind ``OutputLayer`` (docs/architecture.md)."""

from lmtrain.output.adaptive import AdaptiveSoftmax
from lmtrain.output.base import OutputLayer
from lmtrain.output.full import FullSoftmax
from lmtrain.output.hsm import HierarchicalSoftmax
from lmtrain.output.nce import NCE
from lmtrain.output.negative import NegativeSampling
from lmtrain.output.quadratic import AbsoluteSampledSoftmax
from lmtrain.output.rff import CosineSampledSoftmax
from lmtrain.output.sampled import SampledSoftmax

__all__ = [
    "AbsoluteSampledSoftmax",
    "AdaptiveSoftmax",
    "CosineSampledSoftmax",
    "FullSoftmax",
    "HierarchicalSoftmax",
    "NCE",
    "NegativeSampling",
    "OutputLayer",
    "SampledSoftmax",
]

"""The sampled family: one base (``SampledOutput``) and leaves that add their loss (docs/architecture.md)."""

from lmtrain.output.sampled.absolute import AbsoluteSampledSoftmax
from lmtrain.output.sampled.base import SampledOutput
from lmtrain.output.sampled.cosine import CosineSampledSoftmax
from lmtrain.output.sampled.nce import NCE
from lmtrain.output.sampled.negative import NegativeSampling
from lmtrain.output.sampled.softmax import SampledSoftmax

__all__ = [
    "NCE",
    "AbsoluteSampledSoftmax",
    "CosineSampledSoftmax",
    "NegativeSampling",
    "SampledOutput",
    "SampledSoftmax",
]

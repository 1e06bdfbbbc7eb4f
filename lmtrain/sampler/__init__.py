"""Proposal distributions behind ``Sampler`` (docs/architecture.md)."""

from lmtrain.sampler.base import Sampler
from lmtrain.sampler.bigram import BigramSampler
from lmtrain.sampler.kernel import KernelSampler, QuadraticSampler, RFFSampler
from lmtrain.sampler.softmax import SoftmaxSampler
from lmtrain.sampler.uniform import UniformSampler
from lmtrain.sampler.unigram import UnigramSampler

__all__ = [
    "BigramSampler",
    "KernelSampler",
    "QuadraticSampler",
    "RFFSampler",
    "Sampler",
    "SoftmaxSampler",
    "UniformSampler",
    "UnigramSampler",
]

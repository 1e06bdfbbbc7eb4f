"""Kernel proposals (quadratic, random Fourier features) sampled through a divide-and-conquer tree."""

from lmtrain.sampler.kernel.features import FeatureMap, RandomFourierFeatures
from lmtrain.sampler.kernel.quadratic_features import QuadraticFeatures
from lmtrain.sampler.kernel.sampler import KernelSampler, QuadraticSampler, RFFSampler
from lmtrain.sampler.kernel.tree import KernelTree

__all__ = [
    "FeatureMap",
    "KernelSampler",
    "KernelTree",
    "QuadraticFeatures",
    "QuadraticSampler",
    "RFFSampler",
    "RandomFourierFeatures",
]

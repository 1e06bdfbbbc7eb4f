"""The config schemas of the output strategies and their samplers (``output=...``, ``sampler=...``).

Each schema is its class's options dataclass (``lmtrain.output.options``, ``lmtrain.output.sampled.options``,
``lmtrain.sampler.options``: the one place of every key's default, range and meaning) with the class to build, and
the defaults that only a config can have: links to another part (``init_range`` follows ``model.init_range``, the
RFF frequencies' ``seed`` the run's ``seed``) and the training mode a config fixes (``shared_negatives``, None for a
class built directly: the sampler's own mode). The YAML files of ``conf/output`` and ``conf/sampler`` name a schema
and set only what differs between the options that share it. A new strategy or sampler is a class, its options, a
schema here (or an existing one it shares) and a YAML file whose first default names the schema.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import II

from lmtrain.output.options import AdaptiveOptions, FullOptions, HSMOptions
from lmtrain.output.sampled.options import CosineOptions, NCEOptions, NegativeOptions, SoftmaxOptions
from lmtrain.sampler.options import BigramOptions, QuadraticOptions, RFFOptions, UnigramOptions


@dataclass
class ModelInitRange:
    """An output's ``init_range`` follows the model's (``model.init_range``). A schema lists it before its options
    (``class FullConfig(ModelInitRange, FullOptions)``), so it sets the default and the key keeps its place."""

    init_range: float = field(default=II("model.init_range"), metadata={"above": 0})


@dataclass
class FullConfig(ModelInitRange, FullOptions):
    """``output=full``: the full softmax."""

    _target_: str = "lmtrain.output.FullSoftmax"


@dataclass
class AdaptiveConfig(AdaptiveOptions):
    """``output=adaptive``: the adaptive softmax."""

    _target_: str = "lmtrain.output.AdaptiveSoftmax"


@dataclass
class HSMConfig(ModelInitRange, HSMOptions):
    """``output=hsm``: the hierarchical softmax."""

    _target_: str = "lmtrain.output.HierarchicalSoftmax"


@dataclass
class SampledConfig(ModelInitRange, SoftmaxOptions):
    """``output=sampled|uniform|unigram|bigram|exp``: the sampled softmax with any proposal (``sampler=...``);
    m negatives per position (N x m), which trains far better than one set per batch (docs/strategies.md)."""

    _target_: str = "lmtrain.output.SampledSoftmax"


@dataclass
class AbsoluteConfig(ModelInitRange, SoftmaxOptions):
    """``output=quadratic``: the absolute softmax p ∝ exp(|o|) trained as sampled softmax (with the quadratic-kernel
    proposal); exact evaluation normalizes exp(|o|) over all classes."""

    _target_: str = "lmtrain.output.AbsoluteSampledSoftmax"


@dataclass
class CosineConfig(ModelInitRange, CosineOptions):
    """``output=rff``: the softmax over tau * cos(h, w) (normalized embeddings, no bias) trained as sampled softmax
    (with the random-Fourier-feature proposal); exact evaluation is the full softmax over tau * cos."""

    _target_: str = "lmtrain.output.CosineSampledSoftmax"


@dataclass
class NCEConfig(ModelInitRange, NCEOptions):
    """``output=nce``: noise-contrastive estimation, self-normalized (ln Z = 0, or learned); exact full-softmax
    evaluation. Its biases start at the log training unigram, a normalized start (Labeau & Allauzen 2018)."""

    _target_: str = "lmtrain.output.NCE"


@dataclass
class NegativeConfig(ModelInitRange, NegativeOptions):
    """``output=negative``: negative sampling (word2vec), one noise set per batch; exact full-softmax evaluation of
    the same scores. Its biases start at the log training unigram, a normalized start (Labeau & Allauzen 2018)."""

    _target_: str = "lmtrain.output.NegativeSampling"


@dataclass
class UniformSamplerConfig:
    """``sampler=uniform``: q_i = 1/n (context-free: one set of negatives shared by the batch)."""

    _target_: str = "lmtrain.sampler.UniformSampler"


@dataclass
class SoftmaxSamplerConfig:
    """``sampler=softmax``: the model's own softmax (per example, O(nd) per draw), the unbiased reference."""

    _target_: str = "lmtrain.sampler.SoftmaxSampler"


@dataclass
class UnigramSamplerConfig(UnigramOptions):
    """``sampler=unigram|noise``: unigram^power or log-uniform."""

    _target_: str = "lmtrain.sampler.UnigramSampler"


@dataclass
class BigramSamplerConfig(BigramOptions):
    """``sampler=bigram``: conditioned on the previous word."""

    _target_: str = "lmtrain.sampler.BigramSampler"


@dataclass
class QuadraticSamplerConfig(QuadraticOptions):
    """``sampler=quadratic``: the quadratic kernel (Blanc & Rendle 2018)."""

    _target_: str = "lmtrain.sampler.QuadraticSampler"


@dataclass
class RFFSamplerConfig(RFFOptions):
    """``sampler=rff``: random Fourier features (Rawat et al. 2019), the frequencies drawn from the run's seed."""

    _target_: str = "lmtrain.sampler.RFFSampler"
    seed: int = II("seed")

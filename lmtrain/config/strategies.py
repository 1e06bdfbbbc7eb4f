"""The config schemas of the output strategies and their samplers (``output=...``, ``sampler=...``).

The sampled strategies' schemas are their options dataclasses (``lmtrain.output.sampled.options``) with the class
to build; the others list their constructor's config keys here. A new strategy or sampler is a class, a schema
here (or an existing one it shares) and a YAML file whose first default names the schema.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lmtrain.output.sampled.options import BiasOptions, CosineOptions, NCEOptions, SoftmaxOptions

BIAS_INIT = {"choices": ("zero", "log_unigram")}


@dataclass
class FullConfig:
    """``output=full``: the full softmax."""

    _target_: str = "lmtrain.output.FullSoftmax"
    init_range: float = field(default=0.1, metadata={"above": 0})
    eval_chunk: int = field(default=65536, metadata={"at_least": 1})
    # training loss: dense (N, n) logits when they fit in logits_mib MiB (float32), else vocabulary chunks of the
    # most classes whose (N, chunk) logits fit; train_chunk fixes the chunk (0: always dense)
    train_chunk: int | None = field(default=None, metadata={"at_least": 0})
    logits_mib: float = field(default=128.0, metadata={"above": 0})
    bias_init: str = field(default="zero", metadata=BIAS_INIT)


@dataclass
class AdaptiveConfig:
    """``output=adaptive``: the adaptive softmax."""

    _target_: str = "lmtrain.output.AdaptiveSoftmax"
    cutoffs: list[int] | None = None
    div_value: float = field(default=4.0, metadata={"above": 0})
    head_bias: bool = True
    # GPU paths: a tail cluster's logits at every position are dense up to logits_mib MiB (float32), else chunked
    logits_mib: float = field(default=128.0, metadata={"above": 0})


@dataclass
class HSMConfig:
    """``output=hsm``: the hierarchical softmax."""

    _target_: str = "lmtrain.output.HierarchicalSoftmax"
    tree: str = field(default="huffman", metadata={"choices": ("huffman", "balanced", "two_level")})
    num_bins: int | None = field(default=None, metadata={"at_least": 1})
    sparse: bool = True
    init_range: float = field(default=0.1, metadata={"above": 0})


@dataclass
class SampledConfig(SoftmaxOptions):
    """``output=sampled|uniform|unigram|bigram|exp``: the sampled softmax with any proposal."""

    _target_: str = "lmtrain.output.SampledSoftmax"


@dataclass
class AbsoluteConfig(SoftmaxOptions):
    """``output=quadratic``: the absolute softmax trained with sampled negatives."""

    _target_: str = "lmtrain.output.AbsoluteSampledSoftmax"


@dataclass
class CosineConfig(CosineOptions):
    """``output=rff``: the cosine softmax with a temperature, trained with sampled negatives."""

    _target_: str = "lmtrain.output.CosineSampledSoftmax"


@dataclass
class NCEConfig(NCEOptions):
    """``output=nce``: noise-contrastive estimation."""

    _target_: str = "lmtrain.output.NCE"


@dataclass
class NegativeConfig(BiasOptions):
    """``output=negative``: negative sampling."""

    _target_: str = "lmtrain.output.NegativeSampling"


@dataclass
class UniformSamplerConfig:
    """``sampler=uniform``."""

    _target_: str = "lmtrain.sampler.UniformSampler"


@dataclass
class SoftmaxSamplerConfig:
    """``sampler=softmax``: the model's own softmax."""

    _target_: str = "lmtrain.sampler.SoftmaxSampler"


@dataclass
class UnigramSamplerConfig:
    """``sampler=unigram|noise``: unigram^power or log-uniform."""

    _target_: str = "lmtrain.sampler.UnigramSampler"
    power: float = field(default=1.0, metadata={"at_least": 0})
    distribution: str = field(default="unigram", metadata={"choices": ("unigram", "log_uniform")})
    smoothing: float = field(default=1.0, metadata={"at_least": 0})


@dataclass
class BigramSamplerConfig:
    """``sampler=bigram``: conditioned on the previous word."""

    _target_: str = "lmtrain.sampler.BigramSampler"
    unigram_weight: float = field(default=0.25, metadata={"above": 0})
    smoothing: float = field(default=1.0, metadata={"at_least": 0})


@dataclass
class KernelSamplerConfig:
    """What every kernel proposal's tree takes."""

    leaf_size: int | None = field(default=None, metadata={"at_least": 1})
    eps: float = field(default=1e-6, metadata={"above": 0})
    unigram_share: float = field(default=0.0, metadata={"at_least": 0, "below": 1})
    refresh: int = field(default=64, metadata={"at_least": 0})
    feature_cache: str | bool | None = field(
        default="auto", metadata={"choices": ("auto", "full", "bfloat16", "off", True, False, None)}
    )


@dataclass
class QuadraticSamplerConfig(KernelSamplerConfig):
    """``sampler=quadratic``: the quadratic kernel (Blanc & Rendle 2018)."""

    _target_: str = "lmtrain.sampler.QuadraticSampler"
    alpha: float = field(default=100.0, metadata={"above": 0})


@dataclass
class RFFSamplerConfig(KernelSamplerConfig):
    """``sampler=rff``: random Fourier features (Rawat et al. 2019)."""

    _target_: str = "lmtrain.sampler.RFFSampler"
    D: int = field(default=1024, metadata={"at_least": 1})
    nu: float = field(default=4.0, metadata={"above": 0})
    temperature: float | None = field(default=None, metadata={"above": 0})
    seed: int = 0
    projection: str = field(default="float32", metadata={"choices": ("float32", "bfloat16")})

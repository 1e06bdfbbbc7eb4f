"""The options of the sampled family, one dataclass per strategy: the keys of its ``output=...`` config.

A strategy's constructor takes them as keywords (``SampledSoftmax(n, d, sampler, num_samples=10)``), so the
config keys users override stay flat (``output.num_samples``); the strategy keeps them as ``self.options``.
They are also the typed config schemas of these strategies (``lmtrain/config/``): a field's ``metadata`` holds
what its type cannot say (``choices``, ``at_least``), which the config check reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SampledOptions:
    """What every sampled strategy takes.

    ``num_samples`` negatives m; ``shared_negatives`` one set of m for the whole batch, or m per position (None:
    the sampler's own mode); ``sparse`` row gradients; ``init_range`` of the uniform initialization;
    ``eval_chunk`` classes per chunk of the exact normalization.
    """

    num_samples: int = field(default=100, metadata={"at_least": 1})
    shared_negatives: bool | None = None
    sparse: bool = True
    init_range: float = 0.1
    eval_chunk: int = 65536

    def __post_init__(self) -> None:
        if self.num_samples < 1:
            raise ValueError(f"output.num_samples must be a positive number of negatives, got {self.num_samples}")


@dataclass
class BiasOptions(SampledOptions):
    """A bias per class (``bias``), starting at zero or at the log training unigram (``bias_init``)."""

    bias: bool = True
    bias_init: str = field(default="zero", metadata={"choices": ("zero", "log_unigram")})


@dataclass
class EstimatorOptions(SampledOptions):
    """The sampled-softmax estimator: ``correction`` exact (docs/strategies.md) or classic ln(m q);
    ``remove_accidental_hits`` masks negatives equal to the target; ``unique`` draws distinct negatives."""

    remove_accidental_hits: bool = True
    correction: str = field(default="exact", metadata={"choices": ("exact", "classic")})
    unique: bool = False

    def __post_init__(self) -> None:
        if self.correction not in ("exact", "classic"):
            raise ValueError(f"output.correction must be 'exact' or 'classic', got {self.correction!r}")
        super().__post_init__()


@dataclass
class SoftmaxOptions(EstimatorOptions, BiasOptions):
    """``SampledSoftmax`` and ``AbsoluteSampledSoftmax``: the estimator and the biases."""


@dataclass
class CosineOptions(EstimatorOptions):
    """``CosineSampledSoftmax``: logits ``tau`` * cos, the hidden state normalized softly with ``norm_eps``."""

    tau: float = 1 / 0.3**2
    norm_eps: float = 2.0

    def __post_init__(self) -> None:
        if not self.tau > 0:
            raise ValueError(f"output.tau must be positive (logits are tau * cosine similarity), got {self.tau}")
        if not self.norm_eps >= 0:
            raise ValueError(f"output.norm_eps must be >= 0 (0 = exact normalization of h), got {self.norm_eps}")
        super().__post_init__()


@dataclass
class NCEOptions(BiasOptions):
    """``NCE``: ln Z is 0 (self-normalized) or, with ``learn_log_z``, one learned scalar."""

    learn_log_z: bool = False

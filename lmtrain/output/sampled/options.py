"""The options of the sampled family, one dataclass per strategy: the keys of its ``output=...`` config.

A strategy's constructor takes them as keywords (``SampledSoftmax(n, d, sampler, num_samples=10)``), so the
config keys users override stay flat (``output.num_samples``); the strategy keeps them as ``self.options``.
They are also the typed config schemas of these strategies (derived by ``lmtrain.config.schema``) and the one place
of each key's default, also where it differs between strategies (``NCEOptions.bias_init``); a field's ``metadata``
holds what its type cannot say (``at_least``, ``follows``), checked once (``lmtrain.common.ranges``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lmtrain.common.ranges import AT_LEAST_1, Checked, Choice
from lmtrain.output.options import INIT_RANGE, BiasInit


class Correction(Choice):
    """The sampled-softmax correction: ``exact`` (docs/strategies.md) or ``classic`` (o - ln(m q), Bengio &
    Senecal)."""

    exact = "exact"
    classic = "classic"


@dataclass
class SampledOptions(Checked):
    """What every sampled strategy takes.

    ``num_samples`` negatives m; ``shared_negatives`` one set of m for the whole batch, or m per position (None:
    the sampler's own mode); ``sparse`` row gradients; ``init_range`` of the uniform initialization;
    ``eval_chunk`` classes per chunk of the exact normalization.
    """

    num_samples: int = field(default=100, metadata=AT_LEAST_1)
    # true: one set of m for the whole batch (kernel samplers: from the mixture of the batch's proposals, by one
    # tree walk, every position corrected with it); false: m per position (N x m), which trains far better than one
    # set per batch (docs/strategies.md); None: the sampler's own mode
    shared_negatives: bool | None = False
    # sparse row gradients: only the touched rows (and tree buckets) are read and updated. auto: on unless the
    # optimizer has weight decay or momentum, which move every row at every step (then dense); built directly: on
    sparse: bool | str = field(default="auto", metadata={"choices": (True, False, "auto")})
    init_range: float = field(default=0.1, metadata=INIT_RANGE)
    eval_chunk: int = field(default=65536, metadata=AT_LEAST_1)


@dataclass
class BiasOptions(SampledOptions):
    """A bias per class (``bias``), starting at zero or at the log training unigram (``bias_init``)."""

    bias: bool = True
    bias_init: BiasInit = BiasInit.zero


@dataclass
class EstimatorOptions(SampledOptions):
    """The sampled-softmax estimator: ``correction`` exact (docs/strategies.md) or classic ln(m q);
    ``remove_accidental_hits`` masks negatives equal to the target; ``unique`` draws distinct negatives."""

    remove_accidental_hits: bool = True
    correction: Correction = Correction.exact
    unique: bool = False  # draw distinct negatives, corrected with expected counts (context-free samplers)


@dataclass
class SoftmaxOptions(EstimatorOptions, BiasOptions):
    """``SampledSoftmax`` and ``AbsoluteSampledSoftmax``: the estimator and the biases."""


@dataclass
class CosineOptions(EstimatorOptions):
    """``CosineSampledSoftmax``: logits ``tau`` * cos, the hidden state normalized softly with ``norm_eps``."""

    tau: float = field(default=1 / 0.3**2, metadata={"above": 0})  # inverse temperature of the logits, 1 / 0.3^2
    # h / sqrt(|h|^2 + eps^2): the gradient into the LSTM is <= tau / eps; 0: exact h / |h| (saturates at lr 1)
    norm_eps: float = field(default=2.0, metadata={"at_least": 0})


@dataclass
class NCEOptions(BiasOptions):
    """``NCE``: ln Z is 0 (self-normalized) or, with ``learn_log_z``, one learned scalar. Its biases start at the
    log training unigram, a normalized start (Labeau & Allauzen 2018)."""

    bias_init: BiasInit = BiasInit.log_unigram
    learn_log_z: bool = False


@dataclass
class NegativeOptions(BiasOptions):
    """``NegativeSampling``: one noise set per batch, the biases starting at the log training unigram (a normalized
    start, Labeau & Allauzen 2018)."""

    shared_negatives: bool | None = True
    bias_init: BiasInit = BiasInit.log_unigram

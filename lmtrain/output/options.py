"""The options of the output strategies outside the sampled family (``output=full|adaptive|hsm``): the keys of
their configs with their defaults, ranges (``metadata``, read by the config check) and meaning. A strategy's
constructor takes them as keywords and fills the ones left out from here; the config schemas (derived by
``lmtrain.config.schema``) add the class to build, so a default is written once, here. The sampled strategies'
options are in ``lmtrain.output.sampled.options``."""

from __future__ import annotations

from dataclasses import dataclass, field

from lmtrain.common.ranges import AT_LEAST_1, Checked, Choice
from lmtrain.output.infrequent_normalization import InfrequentNormalizationOptions

GPU_FRACTION = 1 / 16  # the share of a GPU's memory that a step's dense logits may take (chunked_softmax)
FRACTION = {"at_least": 0, "below": 1}
# a config's output follows its model's initialization (``${model.init_range}``); a class built in Python its default
INIT_RANGE = {"above": 0, "follows": "model.init_range"}


class BiasInit(Choice):
    """Where the biases start: at zero, or at the log training unigram (a normalized start)."""

    zero = "zero"
    log_unigram = "log_unigram"


class TreeShape(Choice):
    """The class tree of the hierarchical softmax (``HSMOptions.tree``)."""

    huffman = "huffman"
    balanced = "balanced"
    two_level = "two_level"


@dataclass
class FullOptions(InfrequentNormalizationOptions):
    """``output=full``: the full softmax over all classes (exact, O(nd) per position).

    The training loss uses dense (N, n) logits when they fit in the budget (float32: ``logits_mib`` MiB on a CPU,
    ``gpu_logits_fraction`` of the device's memory on a GPU), else vocabulary chunks of the most classes whose
    (N, chunk) logits fit; ``train_chunk`` fixes the chunk (0: always dense). ``self_normalize`` and
    ``normalize_fraction`` (inherited) add the self-normalization penalty, on every position or on a drawn fraction.
    """

    init_range: float = field(default=0.1, metadata=INIT_RANGE)  # uniform(-init_range, init_range) weights
    eval_chunk: int = field(default=65536, metadata=AT_LEAST_1)  # classes per chunk of exact evaluation
    train_chunk: int | None = field(default=None, metadata={"at_least": 0})
    logits_mib: float = field(default=128.0, metadata={"above": 0})  # the budget on a CPU
    gpu_logits_fraction: float = field(default=GPU_FRACTION, metadata=FRACTION)  # on a GPU; 0: logits_mib there too
    bias_init: BiasInit = BiasInit.zero


@dataclass
class AdaptiveOptions(Checked):
    """``output=adaptive``: the adaptive softmax (Grave et al. 2017) through torch's AdaptiveLogSoftmaxWithLoss,
    exact evaluation; relies on the frequency-ordered vocabulary (id 0 = most frequent)."""

    # e.g. [2000, 6000]; None: derived from n (PTB [2000, 6000], 10^6 [2000, 20000, 200000])
    cutoffs: list[int] | None = None
    # tail cluster k projects the hidden state to dim / div_value^k dimensions
    div_value: float = field(default=4.0, metadata={"above": 0})
    head_bias: bool = True
    # fixed shapes (a GPU): a tail cluster's (N, size) logits at every position are dense up to this many MiB
    # (float32), else computed in vocabulary chunks: as ``FullOptions``, whose budgets they share
    logits_mib: float = field(default=128.0, metadata={"above": 0})
    gpu_logits_fraction: float = field(default=GPU_FRACTION, metadata=FRACTION)


@dataclass
class HSMOptions(Checked):
    """``output=hsm``: the hierarchical softmax over a class tree built from the training counts (exact tree
    probabilities)."""

    # huffman | balanced (binary trees) | two_level (softmax over ~sqrt(n) frequency bins, then within the bin)
    tree: TreeShape = TreeShape.huffman
    num_bins: int | None = field(default=None, metadata=AT_LEAST_1)  # two_level only; None: round(sqrt(n))
    # sparse row gradients: a step reads and updates only the nodes on the target paths. auto: on unless the
    # optimizer has weight decay or momentum, which move every row at every step (then dense); built directly: on
    sparse: bool | str = field(default="auto", metadata={"choices": (True, False, "auto")})
    init_range: float = field(default=0.1, metadata=INIT_RANGE)

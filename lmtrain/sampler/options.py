"""The options of the samplers that take any, one dataclass per sampler: the keys of its ``sampler=...`` config and
their defaults, ranges (``metadata``, read by the config check) and meaning. A sampler's constructor takes them as
keywords and fills the ones left out from here; the config schemas (derived by ``lmtrain.config.schema``) add the
class to build, so a default is written once, here."""

from __future__ import annotations

from dataclasses import dataclass, field

from lmtrain.common.ranges import AT_LEAST_1, Checked, Choice


class Distribution(Choice):
    """``UnigramOptions.distribution``: the training unigram, or log-uniform (Zipf over the frequency ranks)."""

    unigram = "unigram"
    log_uniform = "log_uniform"


class Backend(Choice):
    """``KernelOptions.backend``: the kernel tree's algorithm; auto: the fixed one in a GPU's step forms, else the
    walk."""

    auto = "auto"
    walk = "walk"
    fixed = "fixed"


class TreeUpdate(Choice):
    """``KernelOptions.tree_update``: how the fixed backend brings the tree up to date after a step."""

    auto = "auto"
    paths = "paths"
    resum = "resum"


class Projection(Choice):
    """``RFFOptions.projection``: the precision of the random projection's inputs."""

    float32 = "float32"
    bfloat16 = "bfloat16"


@dataclass
class UnigramOptions(Checked):
    """``sampler=unigram|noise``: unigram^power from the training-split counts, or log-uniform (Zipf over the
    frequency-ordered vocabulary, no counts needed); drawn in O(1) from an alias table."""

    power: float = field(default=1.0, metadata={"at_least": 0})  # 0.75 in sampler=noise (word2vec's distortion)
    distribution: Distribution = Distribution.unigram
    smoothing: float = field(default=1.0, metadata={"above": 0})  # added to every count, so every q_i > 0


@dataclass
class BigramOptions(Checked):
    """``sampler=bigram``: q(j | p) = (1 - w) c(p, j) / c(p) + w u(j) with p the position's input token (the
    previous word), c the training-split bigram counts and u the smoothed training unigram."""

    # w in (0, 1]: the unigram's share (PTB valid cross-entropy of q is lowest near 0.25-0.3); a token never
    # followed by anything in training uses the unigram alone
    unigram_weight: float = field(default=0.25, metadata={"above": 0, "at_most": 1})
    smoothing: float = field(default=1.0, metadata={"above": 0})  # added to every unigram count


@dataclass
class KernelOptions(Checked):
    """What every kernel proposal's divide-and-conquer tree takes (refreshed after every optimizer step)."""

    leaf_size: int | None = field(default=None, metadata=AT_LEAST_1)  # classes per tree bucket; None: auto
    eps: float = field(default=1e-6, metadata={"above": 0})  # clamp on tree node scores (RFF estimates can be < 0)
    # s in [0, 1): round(s m) of each position's m draws come from the training unigram, and every id is corrected
    # with the mixture (1 - s) q_kernel + s u (docs/strategies.md)
    unigram_share: float = field(default=0.0, metadata={"at_least": 0, "below": 1})
    # changed rows enter their bucket as phi(new) - phi(old); a bucket is recomputed after this many such deltas
    # (bounds float drift); 0: always recompute changed buckets
    refresh: int = field(default=64, metadata={"at_least": 0})
    # phi(w) of every class kept beside the tree: auto | full | bfloat16 | off. auto: full precision up to 4 GiB,
    # else bfloat16 up to 4 GiB, else off; never for quadratic (not worth it there). YAML reads off as false
    feature_cache: str | bool | None = field(
        default="auto", metadata={"choices": ("auto", "full", "bfloat16", "off", True, False, None)}
    )
    # auto: the fixed-shape backend in a GPU's step forms (step_forms; a run on a CUDA GPU), else the walk (chosen
    # once, when the tree is built); walk | fixed force one, for tests and benchmarks
    backend: Backend = Backend.auto
    # the fixed backend: the levels one product scores for every node at each step, so a tree of up to
    # 2^scored_levels buckets is scored whole and a deeper one draws its last levels in gathered stages; more trades
    # the stages' gathered bytes for the product's multiply-adds (docs/gpu.md)
    scored_levels: int = field(default=15, metadata={"at_least": 0})
    # the fixed backend: after a step the changed buckets' deltas go up their paths to the root (paths), or the tree is
    # re-summed from its leaves (resum); auto: whichever touches fewer values
    tree_update: TreeUpdate = TreeUpdate.auto


@dataclass
class QuadraticOptions(KernelOptions):
    """``sampler=quadratic``: q_i ∝ alpha (h~ . w~_i)^2 + 1 on augmented vectors [h, 1], [w, b] (Blanc & Rendle
    2018); ``leaf_size`` None means about d'/2 classes per bucket."""

    alpha: float = field(default=100.0, metadata={"above": 0})


@dataclass
class RFFOptions(KernelOptions):
    """``sampler=rff``: q_i ∝ exp(nu cos(h, w_i)) estimated with D random frequencies (2D features; Rawat et al.
    2019); ``leaf_size`` None means about 2D / d classes per bucket."""

    # 0.25 here, unlike quadratic: why, docs/strategies.md; measured against 0 (the paper's proposal), docs/results.md
    unigram_share: float = field(default=0.25, metadata={"at_least": 0, "below": 1})
    D: int = field(default=1024, metadata=AT_LEAST_1)  # random frequencies (rows of Omega)
    nu: float = field(default=4.0, metadata={"above": 0})  # kernel sharpness 1 / T^2, the paper's best T = 0.5
    temperature: float | None = field(default=None, metadata={"above": 0})  # T; when set it replaces nu
    # Omega is drawn once from this seed and saved in checkpoints; a config's follows the run's seed
    seed: int = field(default=0, metadata={"follows": "seed"})
    # bfloat16: Omega u from bfloat16 inputs (float32 sums), faster features on CPUs with AVX512-BF16
    projection: Projection = Projection.float32

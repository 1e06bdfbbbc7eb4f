"""CNN softmax (Jozefowicz et al. 2016): a class's output vector is a character CNN of its spelling plus a small
learned correction of its own, w_i = CNN(chars(word_i)) + P c_i; the logit is h . w_i + b_i (docs/strategies.md)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmtrain.common.ranges import AT_LEAST_1, Checked
from lmtrain.output.base import OutputLayer, initial_bias
from lmtrain.output.logsumexp import class_rows, exact_log_prob
from lmtrain.output.options import BiasInit
from lmtrain.output.rows import gather_rows
from lmtrain.output.sampled.estimators import accidental_hits, exact_offsets, joint_softmax_nll
from lmtrain.sampler.base import Sampler
from lmtrain.sampler.proposal import Draws, Proposal

PAD, BEGIN, END = 0, 1, 2  # the reserved character ids: padding, start of word, end of word; special tokens follow
WORDS_PER_CHUNK = 4096  # words per CNN call when every class vector is computed without gradients (memory bound)


@dataclass
class CharCNNOptions(Checked):
    """``output=charcnn``: the CNN softmax. The convolutions are ``kernel_widths`` wide with ``filters`` filters each
    (one entry per convolution) over ``char_dim``-dimensional character embeddings of words cut to
    ``max_word_length`` characters; ``highway_layers`` highway layers; a per-class correction of ``correction_dim``
    (0: none). Trained by the sampled softmax over the step's targets and ``num_samples`` negatives shared by the
    batch, or with ``exact_training`` by the full softmax over every class's vector."""

    num_samples: int = field(default=100, metadata=AT_LEAST_1)
    exact_training: bool = False  # every class vector computed at every step: the full softmax's loss
    char_dim: int = field(default=15, metadata=AT_LEAST_1)
    kernel_widths: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 5, 6])
    filters: list[int] = field(default_factory=lambda: [25, 50, 75, 100, 125, 150])
    highway_layers: int = field(default=1, metadata={"at_least": 0})
    max_word_length: int = field(default=20, metadata=AT_LEAST_1)  # longer words keep their first characters
    correction_dim: int = field(default=32, metadata={"at_least": 0})  # r of the correction P c_i; 0: none
    bias_init: BiasInit = BiasInit.zero
    # c_i ~ uniform(-correction_init, correction_init): the correction outweighs the CNN's untrained vectors at first
    correction_init: float = field(default=0.5, metadata={"above": 0})
    # sparse row gradients of the per-class table [c_i, b_i] (sampled training only). auto: on unless the optimizer
    # has weight decay or momentum, which move every row at every step (then dense); built directly: on
    sparse: bool | str = field(default="auto", metadata={"choices": (True, False, "auto")})
    eval_chunk: int = field(default=65536, metadata=AT_LEAST_1)  # classes per chunk of exact normalization

    def __post_init__(self) -> None:
        super().__post_init__()
        for problem in self.problems(self, "output"):
            raise ValueError(problem)  # the first one

    @staticmethod
    def problems(node: Any, path: str) -> Iterator[str]:
        """The rule across keys (the config check's and a Python build's): one filter count per width, each >= 1,
        and no convolution wider than a spelled word (``max_word_length`` + its two boundary characters)."""
        widths, filters = list(node.kernel_widths), list(node.filters)
        if not widths or len(widths) != len(filters):
            yield f"{path}.kernel_widths and {path}.filters need one entry per convolution, got {widths} and {filters}"
        elif min(widths) < 1 or min(filters) < 1:
            yield f"{path}.kernel_widths and {path}.filters must hold numbers >= 1, got {widths} and {filters}"
        elif max(widths) > node.max_word_length + 2:
            length = f"{path}.max_word_length + 2 = {node.max_word_length + 2}"
            yield f"{path}.kernel_widths has width {max(widths)}, over a spelled word ({length}): raise the latter"


def is_special(word: str) -> bool:
    """A special token of the vocabulary (``<unk>``, ``<eos>``, any ``<...>``): spelled by a character of its own."""
    return len(word) > 2 and word[0] == "<" and word[-1] == ">"


def spellings(words: Sequence[str], max_word_length: int) -> tuple[Tensor, int]:
    """The character ids of every word, (n, max_word_length + 2), and how many ids there are: BEGIN, the word's first
    ``max_word_length`` characters, END, then PAD; a special token is BEGIN, its own reserved id, END (so ``<unk>``
    and ``unk`` differ). Ids are given in sorted order, so the same words give the same table in every process."""
    special = sorted({word for word in words if is_special(word)})
    chars = sorted({c for word in words if not is_special(word) for c in word[:max_word_length]})
    ids = {key: END + 1 + i for i, key in enumerate([*special, *chars])}  # tokens (>2 chars) never equal a char
    rows = [[ids[w]] if is_special(w) else [ids[c] for c in w[:max_word_length]] for w in words]
    padded = [[BEGIN, *row, END, *[PAD] * (max_word_length - len(row))] for row in rows]
    return torch.tensor(padded, dtype=torch.long).view(len(words), max_word_length + 2), END + 1 + len(ids)


class CharCNNSoftmax(OutputLayer):
    """The CNN softmax: class i's vector is w_i = project(highway(tanh(max_t conv(E[chars(word_i)])))) + P c_i and its
    logit h . w_i + b_i. ``words`` are the vocabulary's strings in id order (None: each id spelled by its digits).

    Training (default) runs the CNN only for the step's classes, the N targets and m = ``num_samples`` negatives
    drawn from ``sampler`` once for the batch, and takes the sampled softmax with the exact log-q correction and the
    accidental hits removed (``estimators.py``); the sampler must be context-free (``Sampler.context_free``). With
    ``exact_training`` every class vector is computed at every step. Evaluation is exact; in eval mode without
    gradients the (n, d) vectors are computed once and kept until the module trains again or a weight changes.
    """

    name, Options = "charcnn", CharCNNOptions  # output=charcnn
    companions: ClassVar[dict[str, str]] = {"sampler": "unigram"}
    runtime_args: ClassVar[tuple[str, ...]] = ("num_classes", "dim", "sampler", "counts", "words")
    tie_refusal = "its class vectors are computed from the words' spellings by a character CNN, not stored"
    corrects_with_log_q: ClassVar[bool] = True  # the draw asks for the targets' log q (as a sampled output's)

    def __init__(
        self,
        num_classes: int,
        dim: int,
        sampler: Sampler,
        counts: Tensor | None = None,
        words: Sequence[str] | None = None,
        **options: Any,
    ) -> None:
        super().__init__()
        self.options = opts = CharCNNOptions(**options)  # the keys left out take their defaults
        if not getattr(sampler, "context_free", False):
            chosen = getattr(sampler, "name", type(sampler).__name__)
            raise ValueError(
                f"output=charcnn computes class vectors only for the step's targets and negatives, so it needs a "
                f"context-free sampler (uniform, unigram, noise, inbatch); sampler={chosen} reads the hidden state, "
                "the previous word or the class vectors"
            )
        words = [str(i) for i in range(num_classes)] if words is None else list(words)
        if len(words) != num_classes:
            raise ValueError(f"output=charcnn needs one word per class: {len(words)} words for {num_classes} classes")
        self.num_classes, self.dim, self.loss_is_nll = num_classes, dim, opts.exact_training
        self.sparse = opts.sparse is not False and not opts.exact_training  # exact training touches every row
        # the convolutions are one of the widest size W, each filter's taps beyond its width held at zero (``taps``),
        # over spellings padded by W - 1 so that every window start of a narrow filter exists, those that would leave
        # the word masked before the max (``windows``): a few operators a step whatever the number of widths
        chars, num_chars = spellings(words, opts.max_word_length)  # (n, L)
        widths = torch.tensor(opts.kernel_widths).repeat_interleave(torch.tensor(opts.filters))  # (F,) per filter
        wide, length = max(opts.kernel_widths), chars.shape[1]
        self.register_buffer("spellings", F.pad(chars, (0, wide - 1), value=PAD), persistent=False)  # (n, L + W - 1)
        taps = (torch.arange(wide) < widths[:, None]).to(torch.get_default_dtype())  # (F, W)
        self.register_buffer("taps", taps[:, None, :], persistent=False)  # (F, 1, W)
        starts = torch.arange(length) <= length - widths[:, None]  # (F, L) windows inside the word
        self.register_buffer("windows", torch.zeros(starts.shape).masked_fill_(~starts, -torch.inf), persistent=False)
        self.chars = nn.Embedding(num_chars, opts.char_dim, padding_idx=PAD)
        features = len(widths)  # F
        self.conv_weight = nn.Parameter(torch.empty(features, opts.char_dim, wide))  # (F, char_dim, W)
        self.conv_bias = nn.Parameter(torch.empty(features))  # (F,)
        self.highways = nn.ModuleList(nn.Linear(features, 2 * features) for _ in range(opts.highway_layers))
        # [CNN features, c_i] -> w_i in one product: the first F columns project the CNN's features, the last r are P
        self.project = nn.Linear(features + opts.correction_dim, dim, bias=False)
        self.table = nn.Parameter(torch.empty(num_classes, opts.correction_dim + 1))  # (n, r + 1) rows [c_i, b_i]
        with torch.no_grad():
            nn.init.normal_(self.chars.weight)  # unit scale, torch's embeddings'; the products: 1 / sqrt(fan-in)
            self.chars.weight[PAD] = 0.0  # padding adds nothing to a window
            bound = (opts.char_dim * widths).rsqrt()  # (F,) 1 / sqrt(fan-in), as torch's own convolutions
            self.conv_weight.copy_((torch.rand(self.conv_weight.shape) * 2 - 1) * bound[:, None, None] * self.taps)
            self.conv_bias.copy_((torch.rand(features) * 2 - 1) * bound)
            nn.init.orthogonal_(self.project.weight[:, features:])  # P: the correction starts as a rank-r full softmax
            nn.init.uniform_(self.table[:, :-1], -opts.correction_init, opts.correction_init)
            self.table[:, -1] = initial_bias(opts.bias_init, num_classes, counts)
            for highway in self.highways:
                highway.bias[:features] = -2.0  # the gates start mostly closed: the layer carries its input
        sampler.share_negatives(True)  # m negatives for the batch: N + m words through the CNN, a fixed shape
        self.sampler = sampler
        self._cache: tuple[tuple[tuple[int, int], ...], Tensor] | None = None  # (weights' versions, vectors)

    # --- class vectors -----------------------------------------------------------------------------
    def spell(self, chars: Tensor) -> Tensor:
        """Character ids (K, L + W - 1) -> the CNN's features (K, F): each filter's max over its windows, tanh, the
        highway layers."""
        x = self.chars(chars).transpose(1, 2)  # (K, char_dim, L + W - 1)
        y = F.conv1d(x, self.conv_weight * self.taps, self.conv_bias)  # (K, F, L): the window starting at t
        y = (y + self.windows).amax(2).tanh()  # (K, F): max over the windows inside the word, then tanh
        for highway in self.highways:
            gate, value = highway(y).chunk(2, 1)  # (K, F) each
            # t relu(W_H y) + (1 - t) y, written out: lerp refuses autocast's bfloat16 gate beside a float32 y
            y = y + gate.sigmoid() * (value.relu() - y)
        return y

    def vectors(self, chars: Tensor, corrections: Tensor) -> Tensor:
        """Character ids (K, L + W - 1) and corrections c (K, r) -> class vectors (K, d), the CNN's plus P c."""
        features = self.spell(chars)  # (K, F)
        joined = torch.cat([features, corrections], 1) if self.options.correction_dim else features  # (K, F + r)
        return self.project(joined)  # (K, d)

    def num_parameters(self) -> int:
        """The layer's trainable numbers: its parameters' less the convolution's taps beyond each filter's width."""
        return sum(p.numel() for p in self.parameters()) - int((self.taps == 0).sum()) * self.options.char_dim

    def all_vectors(self) -> tuple[Tensor, Tensor]:
        """Every class's vector (n, d) and bias (n,). In eval mode without gradients the vectors are computed once
        (in chunks of words) and kept while the weights keep their versions; ``train`` and the after-step hook drop
        them too (a fused optimizer step keeps a tensor's version)."""
        bias = self.table[:, -1]
        if self.training or torch.is_grad_enabled():
            return self.vectors(self.spellings, self.table[:, :-1]), bias
        key = tuple((p._version, p.data_ptr()) for p in self.parameters())
        if self._cache is None or self._cache[0] != key:
            with torch.inference_mode(False), torch.no_grad():  # a plain tensor, also made during validation
                parts = [
                    self.vectors(self.spellings[s : s + WORDS_PER_CHUNK], self.table[s : s + WORDS_PER_CHUNK, :-1])
                    for s in range(0, self.num_classes, WORDS_PER_CHUNK)
                ]
            self._cache = key, torch.cat(parts)  # (n, d)
        return self._cache[1], bias

    # --- exact evaluation --------------------------------------------------------------------------
    def log_prob(self, hidden: Tensor, target: Tensor) -> Tensor:
        vectors, bias = self.all_vectors()

        def logits(start: int, end: int) -> Tensor:  # (N, end - start)
            return F.linear(hidden, class_rows(vectors, start, end), class_rows(bias, start, end))

        def target_logit() -> Tensor:  # (N,)
            return (hidden * vectors[target]).sum(1) + bias[target]

        return exact_log_prob(logits, target_logit, target, self.num_classes, self.options.eval_chunk)

    def log_probs_all(self, hidden: Tensor) -> Tensor:
        vectors, bias = self.all_vectors()
        return torch.log_softmax(F.linear(hidden, vectors, bias), dim=1)  # (N, n)

    # --- training ----------------------------------------------------------------------------------
    def query(self, hidden: Tensor) -> Tensor:
        """What the sampler is shown, (N, d): the hidden states (a context-free sampler reads only their number)."""
        return hidden

    def propose(self, query: Tensor, inputs: Tensor | None = None, target: Tensor | None = None) -> Proposal:
        """The step's proposal (context-free: the same q at every position), given the targets for their log q."""
        return self.sampler.propose(query.detach(), inputs, target)

    def draw(self, proposal: Proposal) -> Draws:
        """The step's m negatives for the batch (m,), their log q and the targets' (N, 1)."""
        return proposal.draw(self.options.num_samples)

    def loss(self, hidden: Tensor, target: Tensor, inputs: Tensor | None = None) -> Tensor:
        if self.options.exact_training:
            vectors, bias = self.all_vectors()
            return F.cross_entropy(F.linear(hidden, vectors, bias), target)
        drawn = self.draw(self.propose(self.query(hidden), inputs, target))
        ids, log_q, target_log_q = drawn.ids, drawn.log_q, drawn.target_log_q
        sizes = [target.shape[0], ids.shape[0]]  # N, m
        classes = torch.cat([target, ids])  # (N + m,) repeats kept: a fixed shape, no unique
        rows = gather_rows(self.table, classes, self.sparse)  # (N + m, r + 1)
        corrections, bias = rows.split([self.options.correction_dim, 1], 1)  # (N + m, r), (N + m, 1)
        vectors = self.vectors(self.spellings[classes], corrections)  # (N + m, d)
        (own_w, noise_w), (own_b, noise_b) = vectors.split(sizes), bias.split(sizes)  # targets', negatives'
        own = (hidden * own_w).sum(1, keepdim=True) + own_b  # (N, 1)
        noise = torch.addmm(noise_b.T, hidden, noise_w.T)  # (N, m)
        hits = accidental_hits(ids, target)  # (N, m)
        offsets = exact_offsets(log_q.expand(hits.shape), target_log_q.reshape(-1), hits, ids.shape[0])  # (N, m)
        return joint_softmax_nll(torch.cat([own, noise], 1), offsets, mean=True)

    def train(self, mode: bool = True) -> CharCNNSoftmax:
        self._cache = None  # an evaluation starts or ends: the next one computes the vectors afresh
        return super().train(mode)

    def after_optimizer_step(self) -> None:
        self._cache = None

    def sparse_parameters(self) -> list[nn.Parameter]:
        return [self.table] if self.sparse else []

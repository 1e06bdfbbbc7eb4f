"""Adaptive softmax (Grave et al. 2017) behind the ``OutputLayer`` interface."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmtrain.common.precision import in_float32
from lmtrain.common.runtime import CPU_FORMS, StepForms
from lmtrain.output.base import OutputLayer
from lmtrain.output.chunked_softmax import exact_softmax_nll, fitting_chunk, logits_budget_mib
from lmtrain.output.options import AdaptiveOptions

HEAD_CAP, TAIL_FRACTION, MAX_CLUSTERS = 2000, 0.6, 3
IGNORED = -100  # a target that cross entropy skips (its default ignore_index): a position outside a tail cluster


def derive_cutoffs(num_classes: int, max_clusters: int = MAX_CLUSTERS) -> list[int]:
    """Default cluster boundaries for a frequency-ordered vocabulary of n = ``num_classes`` words.

    The head is h = min(round(n / 5), 2000); further cutoffs grow tenfold (20000, 200000, ...) while they
    stay below round(3n / 5), which closes the list; at most ``max_clusters`` tail clusters. PTB
    (n = 10,000) gets the classic [2000, 6000], WikiText-2 (33,278) [2000, 19967], n = 10^5
    [2000, 20000, 60000], WikiText-103 (267,735) [2000, 20000, 160641], n = 10^6 [2000, 20000, 200000].
    Needs n >= 2.
    """
    if num_classes < 2:
        raise ValueError(f"adaptive softmax needs at least 2 classes, got num_classes={num_classes}")
    last = round(TAIL_FRACTION * num_classes)
    cutoffs = [min(max(round(num_classes / 5), 1), HEAD_CAP)]
    while len(cutoffs) < max_clusters and cutoffs[-1] * 10 < last:
        cutoffs.append(cutoffs[-1] * 10)
    if len(cutoffs) < max_clusters and cutoffs[-1] < last <= num_classes - 1:
        cutoffs.append(last)
    return cutoffs


def target_columns(num_classes: int, cutoffs: list[int]) -> Tensor:
    """(1 + K, n) int64 for K tail clusters: row 0 each word's column in the head (its own below ``cutoffs[0]``,
    else its cluster's, after the shortlist), row k its column in tail cluster k, or ``IGNORED`` outside it."""
    words = torch.arange(num_classes)
    bounds = [*cutoffs, num_classes]
    cluster = torch.bucketize(words, torch.tensor(cutoffs), right=True)  # (n,) 0: head, k: tail cluster k
    rows = [torch.where(cluster == 0, words, cluster + (cutoffs[0] - 1))]
    for k in range(len(cutoffs)):
        rows.append(torch.where(cluster == k + 1, words - bounds[k], IGNORED))
    return torch.stack(rows)


def equal_size_runs(sizes: list[int]) -> list[tuple[int, int]]:
    """The runs of consecutive equal ``sizes`` as [start, stop) index ranges: [4000, 4000] -> [(0, 2)]."""
    runs: list[tuple[int, int]] = []
    for k, size in enumerate(sizes):
        if runs and sizes[runs[-1][0]] == size:
            runs[-1] = (runs[-1][0], k + 1)
        else:
            runs.append((k, k + 1))
    return runs


def max_clusters(dim: int, div_value: float) -> int:
    """Most tail clusters (at most 3) whose projection dim / div_value^k keeps at least one dimension."""
    k = 0
    while k < MAX_CLUSTERS and int(dim // div_value ** (k + 1)) >= 1:
        k += 1
    return max(k, 1)


class AdaptiveSoftmax(OutputLayer):
    """A thin wrapper over ``torch.nn.AdaptiveLogSoftmaxWithLoss``; exact log-probabilities.

    Relies on the vocabulary being ordered by descending frequency: ids below ``cutoffs[0]`` form the
    head (a full softmax with one extra logit per tail cluster), the ids between consecutive cutoffs form
    tail clusters whose input is projected to d / div_value^k dimensions. ``cutoffs=None`` derives them
    from the vocabulary size (``derive_cutoffs``, with no more clusters than ``dim`` allows). All
    parameters are dense (no sparse row gradients).

    In a GPU's forms (``forms.fixed_shapes``, the run's ``StepForms``) the training loss takes ``fixed_shape_nll``:
    torch's module finds each cluster's positions with ``nonzero`` (a host sync per cluster); there every tail
    cluster is scored for all N positions instead, each a cross entropy whose targets (one table lookup a step,
    ``target_columns``) ignore the positions outside the cluster. That costs N x (cluster size) logits per tail
    cluster where the CPU path scores only the cluster's own positions: dense while they fit in the budget
    (float32: ``logits_mib`` MiB, or ``gpu_logits_fraction`` of a GPU's memory, as ``FullSoftmax``), else in
    chunks (``exact_softmax_nll``), so memory stays bounded at any n. Same parameters, same values to float
    rounding; ``log_prob`` and ``log_probs_all`` (exact evaluation) are torch's on both paths.
    """

    name, Options = "adaptive", AdaptiveOptions  # output=adaptive
    loss_is_nll = True
    tie_refusal = (
        "only its head holds d-sized class vectors; the tail clusters score through projections to smaller sizes, "
        "which an input embedding would have to share per cluster (adaptive input), not implemented"
    )
    runtime_args: ClassVar[tuple[str, ...]] = ("num_classes", "dim", "forms")

    def __init__(self, num_classes: int, dim: int, forms: StepForms = CPU_FORMS, **options: Any) -> None:
        super().__init__()
        self.forms = forms  # the training loss's form: fixed shapes (a GPU's), else torch's module (a CPU's)
        self.options = opts = AdaptiveOptions(**options)  # the keys left out take their defaults
        cutoffs, div_value = opts.cutoffs, opts.div_value
        if cutoffs is None:
            cutoffs = derive_cutoffs(num_classes, max_clusters(dim, div_value))
        cutoffs = [int(c) for c in cutoffs]
        if not cutoffs or cutoffs != sorted(set(cutoffs)) or cutoffs[0] < 1 or cutoffs[-1] > num_classes - 1:
            raise ValueError(
                f"output.cutoffs must be strictly increasing integers between 1 and {num_classes - 1} "
                f"(the vocabulary size minus one), got {cutoffs}; or set output.cutoffs=null to derive them"
            )
        if int(dim // div_value ** len(cutoffs)) < 1:
            raise ValueError(
                f"output.div_value={div_value} leaves the last tail cluster with no dimensions at dim={dim} "
                f"({len(cutoffs)} clusters); use a smaller div_value or fewer cutoffs"
            )
        self.num_classes, self.dim = num_classes, dim
        self.cutoffs, self.logits_mib, self.gpu_logits_fraction = cutoffs, opts.logits_mib, opts.gpu_logits_fraction
        head_bias = opts.head_bias
        self.asm = nn.AdaptiveLogSoftmaxWithLoss(dim, num_classes, cutoffs, div_value=div_value, head_bias=head_bias)
        # every word's targets, for fixed shapes (one lookup a step); not saved: checkpoints are the same on both paths
        self.register_buffer("columns", target_columns(num_classes, cutoffs), persistent=False)  # (1 + K, n)
        # the widths of the stacked first product's outputs: the head's logits, then each tail's projection
        self.first_sizes = [self.asm.head_size, *(tail[0].out_features for tail in self.asm.tail)]
        self.tail_groups = equal_size_runs([b - a for a, b in zip(cutoffs, [*cutoffs[1:], num_classes], strict=True)])
        self._weights: dict[tuple, Tensor] = {}  # uniform_weight's tensors (a few: one per cluster and window shape)

    def log_prob(self, hidden: Tensor, target: Tensor) -> Tensor:
        return self.asm(hidden, target).output  # (N,) exact log p(target | hidden)

    @in_float32
    def loss(self, hidden: Tensor, target: Tensor, inputs: Tensor | None = None) -> Tensor:
        """The exact NLL, in float32 under autocast: torch's adaptive softmax writes its bfloat16 cluster
        log-probabilities into a tensor of the input's dtype and fails (or, given bfloat16, sums in bfloat16)."""
        if self.forms.fixed_shapes:
            return self.fixed_shape_nll(hidden, target)
        return self.asm(hidden, target).loss

    def fixed_shape_nll(self, hidden: Tensor, target: Tensor) -> Tensor:
        """(N, d), (N,) -> the mean of -log p(target | hidden) with shapes that do not depend on the targets (no host
        sync): the head's cross entropy at the target's head column (the word, or its cluster's column), plus each
        tail cluster's at the target's column in it, positions outside the cluster ignored (they add 0). The head's
        logits and every tail's projection come from one product with their weights stacked (one GEMM and, in the
        backward pass, one for the hidden state's gradient, where there were one per cluster and their sum). Each
        term comes divided by N already (the head's mean; each tail's targets weighted 1 / N), so no division
        follows the sum: one operator fewer each way."""
        asm = self.asm
        columns = self.columns[:, target]  # (1 + K, N): head column, then the column in each tail (or IGNORED)
        stacked = torch.cat([asm.head.weight, *(tail[0].weight for tail in asm.tail)])  # (head + sum p_k, d)
        head, *projected = (hidden @ stacked.T).split(self.first_sizes, 1)  # (N, head), (N, p_k) each
        head = head if asm.head.bias is None else head + asm.head.bias
        total = F.cross_entropy(head, columns[0])  # the mean over all N positions
        for start, stop in self.tail_groups:
            words = [tail[1].weight for tail in asm.tail[start:stop]]
            total = total + self.tails_nll(words, projected[start:stop], columns[start + 1 : stop + 1])
        return total

    def tails_nll(self, words: list[Tensor], projected: list[Tensor], local: Tensor) -> Tensor:
        """``tail_nll`` summed over G tail clusters of one size (consecutive ones, ``tail_groups``); ``local`` (G, N).
        While their G stacked (N, size) logits fit the budget, they take one cross entropy over (G N, size): one
        log-softmax and one pick, forward and backward, where each cluster took its own (the classic PTB cutoffs
        make two tails of 4,000 words)."""
        size, positions = words[0].shape[0], projected[0].shape[0]
        budget = logits_budget_mib(self.logits_mib, self.gpu_logits_fraction, projected[0].device)
        if len(words) > 1 and fitting_chunk(budget, len(words) * positions) >= size:
            # (G N, size): the clusters' logits one below the other
            logits = torch.cat([p @ w.T for w, p in zip(words, projected, strict=True)])
            weight = self.uniform_weight(size, positions, logits)
            return F.cross_entropy(logits, local.reshape(-1), weight=weight, reduction="sum")
        nlls = [self.tail_nll(w, p, t) for w, p, t in zip(words, projected, local, strict=True)]
        return sum(nlls[1:], nlls[0])

    def tail_nll(self, words: Tensor, projected: Tensor, local: Tensor) -> Tensor:
        """The sum over the positions in one tail cluster of -log p(local | cluster), divided by all N positions,
        from the positions' projections (N, d / div_value^k) and the cluster's word vectors ``words`` (cluster size,
        d / div_value^k); ``local`` (N,) IGNORED at the others: all N positions scored, dense, or in vocabulary
        chunks when large."""
        budget = logits_budget_mib(self.logits_mib, self.gpu_logits_fraction, projected.device)
        if fitting_chunk(budget, projected.shape[0]) >= words.shape[0]:
            # IGNORED: cross entropy's default; a 1 / N weight on every word of the cluster
            weight = self.uniform_weight(words.shape[0], projected.shape[0], projected)
            return F.cross_entropy(projected @ words.T, local, weight=weight, reduction="sum")
        outside = local == IGNORED  # (N,)
        nll = exact_softmax_nll(projected, words, None, local.clamp(min=0), budget)  # (N,) torch's tails: no biases
        return nll.masked_fill(outside, 0.0).mean()

    def uniform_weight(self, size: int, n_positions: int, like: Tensor) -> Tensor:
        """(size,) filled with 1 / ``n_positions`` in ``like``'s dtype and device, made once per shape (a step's
        shapes repeat): a class weight that costs no operator a step."""
        key = (size, n_positions, like.dtype, like.device)
        if key not in self._weights:
            self._weights[key] = torch.full((size,), 1.0 / n_positions, dtype=like.dtype, device=like.device)
        return self._weights[key]

    def log_probs_all(self, hidden: Tensor) -> Tensor:
        return self.asm.log_prob(hidden)

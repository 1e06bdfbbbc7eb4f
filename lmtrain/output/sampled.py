"""Sampled softmax with the exact proposal correction of docs/strategies.md."""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor, nn

from lmtrain.output.base import OutputLayer, changed_rows, initial_bias
from lmtrain.output.exact import chunked_logsumexp
from lmtrain.output.rows import gather_rows
from lmtrain.sampler.base import Sampler

# per-example scoring: one dense product with the distinct rows when they number at most this many times m
# (measured with scripts/bench_output.py --per-example; see docs/strategies.md)
DENSE_RATIO = 20


class SampledSoftmax(OutputLayer):
    """Softmax trained on the target plus ``num_samples`` negatives drawn from ``sampler``.

    ``shared_negatives`` (None = the sampler's own mode) asks for one set of m negatives for the whole batch (one
    dense (N, d') x (d', m) product) or for m per position. Context-free samplers share by default and draw N x m
    with ``shared_negatives=false``; kernel samplers draw per position by default and, with
    ``shared_negatives=true``, m for the batch from the mixture of the batch's proposals (then log q of every
    position's target is the mixture's); samplers with only a per-position mode (softmax, bigram) ignore it.
    Per-example samplers draw m per position from their context: the query vector and the input tokens ``loss``
    receives. ``unique`` draws distinct negatives and corrects with expected counts; ``correction`` picks the
    exact estimator (docs/strategies.md) or the classic ln(m q) one; ``remove_accidental_hits`` masks negatives
    equal to the target.
    ``bias_init="log_unigram"`` starts the biases at the log of the smoothed training unigram (``counts``),
    a normalized model (sum of exp(b) = 1) that already predicts word frequencies (Labeau & Allauzen 2018).

    Classes are stored as one augmented matrix ``weight`` (n, d + 1) = [W, b] (or (n, d) with
    ``bias=False``), so that a logit is ``query(h) . weight[i]`` and one sparse gather serves W and b.
    Subclasses change the logit (absolute, cosine) by overriding ``score``; evaluation is always the
    exact softmax over the same scores.
    """

    signed_scores = True  # False where the logit is |o|: then only zero biases make sense

    def __init__(
        self,
        num_classes: int,
        dim: int,
        sampler: Sampler,
        num_samples: int = 100,
        remove_accidental_hits: bool = True,
        correction: Literal["exact", "classic"] = "exact",
        unique: bool = False,
        shared_negatives: bool | None = None,
        bias: bool = True,
        sparse: bool = True,
        init_range: float = 0.1,
        eval_chunk: int = 65536,
        bias_init: Literal["zero", "log_unigram"] = "zero",
        counts: Tensor | None = None,
    ) -> None:
        super().__init__()
        if correction not in ("exact", "classic"):
            raise ValueError(f"output.correction must be 'exact' or 'classic', got {correction!r}")
        if num_samples < 1:
            raise ValueError(f"output.num_samples must be a positive number of negatives, got {num_samples}")
        if shared_negatives is not None:
            sampler.share_negatives(shared_negatives)  # kernel samplers switch mode; the others keep theirs
        else:
            shared_negatives = not sampler.per_example
        if unique and (sampler.per_example or not shared_negatives):
            raise ValueError(
                "output.unique=true needs shared negatives for the batch: a context-free sampler (uniform, unigram) "
                "or a kernel sampler with output.shared_negatives=true"
            )
        if bias_init != "zero" and not self.signed_scores:
            raise ValueError(
                f"{type(self).__name__} scores |o|, so its biases start at zero; got bias_init={bias_init!r}"
            )
        if unique and num_samples >= num_classes:
            raise ValueError(f"output.unique=true needs num_samples < num_classes ({num_classes}), got {num_samples}")
        self.num_classes, self.dim = num_classes, dim
        self.sampler = sampler
        self.num_samples = num_samples
        self.remove_accidental_hits = remove_accidental_hits
        self.correction = correction
        self.unique = unique
        self.shared_negatives = shared_negatives
        self.has_bias = bias
        self.sparse = sparse
        self.eval_chunk = eval_chunk
        self.weight = nn.Parameter(torch.empty(num_classes, dim + int(bias)))
        nn.init.uniform_(self.weight, -init_range, init_range)
        if bias:
            with torch.no_grad():
                self.weight[:, -1] = initial_bias(bias_init, num_classes, counts)
        self.sampler.use_scores(self.score)  # a softmax proposal is then this model's softmax (any subclass)
        self.sampler.update(self.weight.detach())
        # derived sampler state (trees) is never stored: rebuild it from the loaded weights
        self.register_load_state_dict_post_hook(lambda module, _: module.sampler.update(module.weight.detach()))

    def sparse_parameters(self) -> list[nn.Parameter]:
        return [self.weight] if self.sparse else []

    # --- scores -------------------------------------------------------------------------------
    def query(self, hidden: Tensor) -> Tensor:
        """(N, d) -> (N, d') vectors whose dot product with a weight row is the logit."""
        if not self.has_bias:
            return hidden
        return torch.cat([hidden, hidden.new_ones(hidden.shape[0], 1)], dim=1)

    def score(self, query: Tensor, rows: Tensor) -> Tensor:
        """query (N, d'), rows (k, d') shared or (N, k, d') per example -> logits (N, k)."""
        if rows.dim() == 2:
            return query @ rows.T
        if rows.shape[1] == 1:  # one row per example (the targets): a row-wise dot, no batched matmul
            return (query.unsqueeze(1) * rows).sum(2)
        return torch.einsum("nd,nkd->nk", query, rows)

    def class_scores(self, hidden: Tensor, ids: Tensor) -> Tensor:
        """Logits of the given ids: (m,) shared or (N, m) per example -> (N, m); sparse gradient."""
        return self.query_scores(self.query(hidden), ids)

    def query_scores(self, query: Tensor, ids: Tensor) -> Tensor:
        """``class_scores`` for precomputed query vectors (N, d'), so a loss builds them once.

        Per-example ids (N, m) that repeat a lot (N m draws over few distinct classes, as on a small vocabulary)
        are scored as one dense product with their u distinct rows, (N, d') x (d', u), then picked per position:
        N u d' multiply-adds in a matrix product cost less than gathering N m rows once u <= ``DENSE_RATIO`` m.
        """
        if ids.dim() == 2 and ids.shape[1] > 1:
            distinct, inverse = torch.unique(ids, return_inverse=True)  # (u,), (N, m)
            if distinct.numel() <= DENSE_RATIO * ids.shape[1]:
                scores = self.score(query, gather_rows(self.weight, distinct, self.sparse))  # (N, u)
                return scores.gather(1, inverse)  # (N, m)
        return self.score(query, gather_rows(self.weight, ids, self.sparse))

    # --- exact evaluation ---------------------------------------------------------------------
    def log_normalizer(self, hidden: Tensor) -> Tensor:
        """(N, d) -> (N,) log of the sum over all classes of exp(score)."""
        query = self.query(hidden)
        return chunked_logsumexp(lambda s, e: self.score(query, self.weight[s:e]), self.num_classes, self.eval_chunk)

    def log_prob(self, hidden: Tensor, target: Tensor) -> Tensor:
        target_score = self.class_scores(hidden, target.unsqueeze(1))[:, 0]  # (N,)
        return target_score - self.log_normalizer(hidden)

    def log_probs_all(self, hidden: Tensor) -> Tensor:
        return torch.log_softmax(self.score(self.query(hidden), self.weight), dim=1)  # (N, n), the same scores

    # --- training -------------------------------------------------------------------------------
    def draw(
        self, hidden: Tensor, inputs: Tensor | None = None, query: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """Negatives: ids (m,) shared or (N, m) per example, their log q, and for unique draws the number of
        tries. The sampler gets the query vectors (N, d') (``query``, when the caller has built them already) and
        the input tokens ``inputs`` (N,) as context."""
        context = (self.query(hidden) if query is None else query).detach()  # (N, d'); context-free samplers ignore it
        if self.unique:
            return draw_unique(self.sampler, self.num_samples, context, inputs)
        if self.sampler.per_example or self.shared_negatives:  # (N, m) per example, or (m,) for the batch
            ids, log_q = self.sampler.sample(context, self.num_samples, inputs=inputs)
            return ids, log_q, None
        ids, log_q = self.sampler.sample(context, hidden.shape[0] * self.num_samples)  # (N * m,) context-free
        return ids.view(hidden.shape[0], -1), log_q.view(hidden.shape[0], -1), None  # (N, m) each

    def loss(self, hidden: Tensor, target: Tensor, inputs: Tensor | None = None) -> Tensor:
        query = self.query(hidden)  # (N, d'), built once for the draw and the scores
        ids, log_q, tries = self.draw(hidden, inputs, query)
        target_logit = self.query_scores(query, target.unsqueeze(1))  # (N, 1)
        neg_logits = self.query_scores(query, ids)  # (N, m)
        return self.sampled_nll(query, target, target_logit, neg_logits, ids, log_q, tries, inputs).mean()

    def target_log_q(self, query: Tensor, target: Tensor, inputs: Tensor | None = None) -> Tensor:
        """log q of each position's target (N, 1) under the proposal of that position (query (N, d'), inputs (N,));
        a batch-shared proposal is the same for every position."""
        return self.sampler.log_q(query.detach(), target.unsqueeze(1), inputs=inputs)  # (N, 1)

    def sampled_nll(
        self,
        query: Tensor,
        target: Tensor,
        target_logit: Tensor,
        neg_logits: Tensor,
        ids: Tensor,
        log_q: Tensor,
        tries: Tensor | None,
        inputs: Tensor | None = None,
    ) -> Tensor:
        """The per-position sampled-softmax loss (N,) from the logits of the targets (N, 1) and of the drawn
        ids (N, m) (``draw``'s ids, log q and tries; ``inputs`` as given to ``draw``): the estimator that training
        minimises and that ``lmtrain.diagnose`` differentiates with respect to the logits."""
        hits = ids.unsqueeze(0) == target.unsqueeze(1) if ids.dim() == 1 else ids == target.unsqueeze(1)
        log_q = log_q.expand_as(neg_logits)  # (N, m)
        if tries is not None:  # without replacement: expected counts E_j = 1 - (1 - q_j)^tries
            log_count = torch.log(-torch.expm1(tries * torch.log1p(-log_q.exp().clamp(max=1 - 1e-7))))
            neg_logits = neg_logits - log_count
            if self.remove_accidental_hits:
                neg_logits = neg_logits.masked_fill(hits, float("-inf"))
        elif self.correction == "classic":
            neg_logits = neg_logits - (math.log(self.num_samples) + log_q)
            if self.remove_accidental_hits:
                neg_logits = neg_logits.masked_fill(hits, float("-inf"))
        else:
            log_q_target = self.target_log_q(query, target, inputs).reshape(-1)  # (N,)
            if self.remove_accidental_hits:
                kept = (self.num_samples - hits.sum(1)).clamp(min=1)  # (N,) k_t
                # the proposal with the target removed has q_j / (1 - q_t)
                log_rest = torch.log(-torch.expm1(log_q_target.clamp(max=-1e-7)))  # (N,) ln(1 - q_t)
                neg_logits = neg_logits - (kept.log() - log_rest).unsqueeze(1) - log_q
                neg_logits = neg_logits.masked_fill(hits, float("-inf"))
            else:
                neg_logits = neg_logits - (math.log(self.num_samples) + log_q)
        logits = torch.cat([target_logit, neg_logits], dim=1)  # (N, 1 + m)
        return torch.logsumexp(logits, dim=1) - target_logit[:, 0]

    def after_optimizer_step(self) -> None:
        self.sampler.update(self.weight.detach(), changed_rows(self.weight))


def draw_unique(
    sampler: Sampler, num_samples: int, context: Tensor | None = None, inputs: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Draw from a shared proposal (context-free, or batch-shared given the batch's ``context`` (N, d') and
    ``inputs`` (N,)) until ``num_samples`` distinct ids are seen.

    Returns the distinct ids (m,), their log q (m,), and the number of draws it took (scalar tensor).
    """
    drawn: list[Tensor] = []
    seen = 0
    while seen < num_samples:
        batch, _ = sampler.sample(context, num_samples, inputs=inputs)
        drawn.append(batch)
        seen = torch.unique(torch.cat(drawn)).numel()
    stream = torch.cat(drawn)  # (T,) all draws in order
    uniq, inverse = torch.unique(stream, return_inverse=True)
    first = torch.full((uniq.numel(),), stream.numel(), dtype=torch.long, device=stream.device)
    first.scatter_reduce_(0, inverse, torch.arange(stream.numel(), device=stream.device), "amin")
    order = first.argsort()[:num_samples]  # the first m distinct ids in draw order
    ids = uniq[order]
    tries = first[order].max() + 1  # draws needed to see m distinct ids
    return ids, sampler.log_q(context, ids, inputs=inputs), tries.to(torch.get_default_dtype())

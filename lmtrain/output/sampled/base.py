"""What the sampled family shares: the class matrix, scores, exact log-probabilities, drawing, the after-step hook."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

import torch
from torch import Tensor, nn

from lmtrain.common.constants import with_ones_column
from lmtrain.output.base import OutputLayer, changed_rows, initial_bias
from lmtrain.output.logsumexp import chunked_logsumexp
from lmtrain.output.rows import gather_rows
from lmtrain.output.sampled.estimators import draw_negative_ids, draw_negatives
from lmtrain.output.sampled.options import BiasOptions, SampledOptions
from lmtrain.sampler.base import Sampler
from lmtrain.sampler.proposal import Proposal

# per-example scoring: one dense product with the distinct rows when they number at most this many times m
# (measured with scripts/bench_output.py --per-example; see docs/strategies.md)
DENSE_RATIO = 20


class Draw(NamedTuple):
    """One step's negatives, scored: the query vectors, the proposal, the drawn ids and their log q (``draw``), the
    number of draws for distinct negatives (else None), and the scores of the targets (N, 1) and of the negatives
    (N, m)."""

    query: Tensor  # (N, d')
    proposal: Proposal  # the step's proposal: the negatives were drawn from it, the targets' log q comes from it
    ids: Tensor  # (m,) shared or (N, m) per position
    log_q: Tensor  # like ids
    tries: Tensor | None
    target_score: Tensor  # (N, 1)
    noise_score: Tensor  # (N, m)
    scores: Tensor | None = None  # (N, 1 + m), target first, where both came from one product (the GPU paths)
    joint_log_q: Tensor | None = None  # (N, 1 + m), target first, where both came from one lookup (the GPU paths)


class SampledOutput(OutputLayer):
    """The base of every strategy trained on the target plus ``num_samples`` negatives drawn from ``sampler``.

    Classes are one augmented matrix ``weight`` (n, d + 1) = [W, b] (or (n, d) without a bias), so that a logit is
    ``query(h) . weight[i]`` and one sparse gather serves W and b. A leaf adds only its loss (``loss``) and, where
    its model differs, its logit (``score``); evaluation is always the exact softmax over the same scores.
    ``Options`` is the leaf's options dataclass, built from the constructor's keywords into ``self.options``.
    ``shared_negatives`` (None = the sampler's own mode) asks for one set of m negatives for the whole batch or
    for m per position; a kernel sampler then switches mode, the others keep theirs (see ``SampledSoftmax``).
    ``bias_init="log_unigram"`` starts the biases at the log of the smoothed training unigram (``counts``).
    """

    runtime_args: ClassVar[tuple[str, ...]] = ("num_classes", "dim", "sampler", "counts")

    Options: ClassVar[type[SampledOptions]] = SampledOptions
    signed_scores: ClassVar[bool] = True  # False where the logit is |o|: then only zero biases make sense

    def __init__(
        self, num_classes: int, dim: int, sampler: Sampler, counts: Tensor | None = None, **options: Any
    ) -> None:
        super().__init__()
        self.options = opts = self.Options(**options)
        self.has_bias = isinstance(opts, BiasOptions) and opts.bias
        if isinstance(opts, BiasOptions) and opts.bias_init != "zero" and not self.signed_scores:
            raise ValueError(
                f"{type(self).__name__} scores |o|, so its biases start at zero; got bias_init={opts.bias_init!r}"
            )
        self.num_classes, self.dim = num_classes, dim
        self.weight = nn.Parameter(torch.empty(num_classes, dim + int(self.has_bias)))
        nn.init.uniform_(self.weight, -opts.init_range, opts.init_range)
        if self.has_bias:
            with torch.no_grad():
                self.weight[:, -1] = initial_bias(opts.bias_init, num_classes, counts)
        self.attach(sampler)
        self.check_options(num_classes, sampler)
        # derived sampler state (trees) is never stored: rebuild it from the loaded weights
        self.register_load_state_dict_post_hook(lambda module, _: module.sampler.update(module.weight.detach()))

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> SampledOutput:
        out = super()._apply(fn, recurse)  # moves the weight, and the sampler's own buffers (a submodule)
        self.sampler.follow(self.weight.detach())  # a proposal holding the weight follows it to the new device
        return out

    def attach(self, sampler: Sampler) -> None:
        """Make ``sampler`` this strategy's proposal: the one place that sets its mode (``shared_negatives``: kernel
        samplers switch, the others keep their only one), gives it the logit function (a softmax proposal is then
        this model's softmax) and the current class vectors."""
        shared = self.options.shared_negatives
        if shared is not None:
            sampler.share_negatives(shared)
        self.shared_negatives = not sampler.per_example if shared is None else shared
        self.sampler = sampler
        sampler.use_scores(self.score)
        sampler.update(self.weight.detach())

    def check_options(self, num_classes: int, sampler: Sampler) -> None:
        """Checks of the options that need the vocabulary size or the sampler; default none."""

    @property
    def num_samples(self) -> int:
        """m, the negatives per step (``options.num_samples``; ``lmtrain.diagnose`` sets it)."""
        return self.options.num_samples

    @num_samples.setter
    def num_samples(self, value: int) -> None:
        self.options.num_samples = value

    def sparse_parameters(self) -> list[nn.Parameter]:
        return [self.weight] if self.options.sparse else []

    # --- scores -------------------------------------------------------------------------------
    def query(self, hidden: Tensor) -> Tensor:
        """(N, d) -> (N, d') vectors whose dot product with a weight row is the logit."""
        if not self.has_bias:
            return hidden
        return with_ones_column(hidden)

    def score(self, query: Tensor, rows: Tensor) -> Tensor:
        """query (N, d'), rows (k, d') shared or (N, k, d') per example -> logits (N, k).

        The GPU paths multiply with the rows on the left, so the rows' gradient comes out of the product contiguous
        and the sparse gradient takes it without a copy (one operator fewer), and a target's row-wise dot is one
        batched product (one operator forward instead of two); the same sums in another order."""
        if self.gpu_paths:
            if rows.dim() == 2:
                return torch.mm(rows, query.T).T  # (N, k), transposed in memory
            return torch.bmm(rows, query.unsqueeze(2)).view(rows.shape[:2])  # (N, k)
        if rows.dim() == 2:
            return query @ rows.T
        if rows.shape[1] == 1:  # one row per example (the targets): a row-wise dot, no batched matmul
            return (query.unsqueeze(1) * rows).sum(2)
        return torch.einsum("nd,nkd->nk", query, rows)

    def query_scores(self, query: Tensor, ids: Tensor) -> Tensor:
        """Logits of the given ids, (m,) shared or (N, m) per example -> (N, m), for query vectors (N, d') built
        once per step; the gradient into ``weight`` is sparse.

        Per-example ids (N, m) that repeat a lot (N m draws over few distinct classes, as on a small vocabulary)
        are scored as one dense product with their u distinct rows, (N, d') x (d', u), then picked per position:
        N u d' multiply-adds in a matrix product cost less than gathering N m rows once u <= ``DENSE_RATIO`` m.
        """
        if ids.dim() == 2 and ids.shape[1] > 1 and not self.gpu_paths:  # on a GPU: no data-dependent sizes
            distinct, inverse = torch.unique(ids, return_inverse=True)  # (u,), (N, m)
            if distinct.numel() <= DENSE_RATIO * ids.shape[1]:
                scores = self.score(query, gather_rows(self.weight, distinct, self.options.sparse))  # (N, u)
                return scores.gather(1, inverse)  # (N, m)
        return self.score(query, gather_rows(self.weight, ids, self.options.sparse))

    # --- exact evaluation ---------------------------------------------------------------------
    def log_normalizer(self, hidden: Tensor) -> Tensor:
        """(N, d) -> (N,) log of the sum over all classes of exp(score)."""
        query = self.query(hidden)
        chunk = self.options.eval_chunk
        return chunked_logsumexp(lambda s, e: self.score(query, self.weight[s:e]), self.num_classes, chunk)

    def log_prob(self, hidden: Tensor, target: Tensor) -> Tensor:
        target_score = self.query_scores(self.query(hidden), target.unsqueeze(1))[:, 0]  # (N,)
        return target_score - self.log_normalizer(hidden)

    def log_probs_all(self, hidden: Tensor) -> Tensor:
        return torch.log_softmax(self.score(self.query(hidden), self.weight), dim=1)  # (N, n), the same scores

    # --- training -------------------------------------------------------------------------------
    def propose(self, query: Tensor, inputs: Tensor | None = None) -> Proposal:
        """The sampler's proposal for this step, given the query vectors (N, d') and the input tokens (N,)."""
        return self.sampler.propose(query.detach(), inputs)  # context-free samplers ignore the context

    def draw(
        self, hidden: Tensor, inputs: Tensor | None = None, proposal: Proposal | None = None
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """Negatives: ids (m,) shared or (N, m) per example, their log q, and for distinct draws the number of
        tries (else None), from the step's ``proposal`` (built here from ``hidden`` and ``inputs`` when None)."""
        proposal = self.propose(self.query(hidden), inputs) if proposal is None else proposal
        positions = hidden.shape[0]
        ids, log_q = draw_negatives(proposal, self.options.num_samples, positions, self.shared_negatives)
        return ids, log_q, None

    def scored_draw(self, hidden: Tensor, target: Tensor, inputs: Tensor | None = None) -> Draw:
        """The step's proposal, ``draw`` and the scores of the targets and the negatives, from query vectors built
        once."""
        query = self.query(hidden)  # (N, d')
        proposal = self.propose(query, inputs)
        proposal.expect(target.unsqueeze(1))  # the targets' log q may come with the draws' (target_log_q)
        if self.gpu_paths and proposal.log_q_by_lookup and (proposal.per_example or not self.shared_negatives):
            return self.joint_draw(query, proposal, target)
        ids, log_q, tries = self.draw(hidden, inputs, proposal)
        if self.gpu_paths:
            return Draw(query, proposal, ids, log_q, tries, *self.joint_scores(query, target, ids))
        target_score, noise_score = self.query_scores(query, target.unsqueeze(1)), self.query_scores(query, ids)
        return Draw(query, proposal, ids, log_q, tries, target_score, noise_score)

    def joint_draw(self, query: Tensor, proposal: Proposal, target: Tensor) -> Draw:
        """The GPU paths' per-position draw from a proposal whose log q is a lookup: the ids alone, then the targets'
        and the negatives' rows and log q each from one gather of the joined ids (N, 1 + m), the targets first (one
        lookup where the draw's and the targets' took one each). Per position only, so never ``unique`` draws."""
        ids = self.negative_ids(proposal, query.shape[0])  # (N, m)
        joint = torch.cat([target.unsqueeze(1), ids], dim=1)  # (N, 1 + m)
        log_q = proposal.log_q(joint)  # (N, 1 + m)
        proposal.remember(log_q[:, :1])  # the targets' (N, 1), for target_log_q
        scores = self.query_scores(query, joint)  # (N, 1 + m)
        return Draw(query, proposal, ids, log_q[:, 1:], None, scores[:, :1], scores[:, 1:], scores, log_q)

    def negative_ids(self, proposal: Proposal, positions: int) -> Tensor:
        """The ids alone (positions, m) of a per-position draw whose log q is looked up afterwards (``joint_draw``)."""
        return draw_negative_ids(proposal, self.options.num_samples, positions)

    def joint_scores(self, query: Tensor, target: Tensor, ids: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """The GPU paths' scores of the targets (N, 1) and the negatives (N, m); per position from one gather of
        their rows (one sparse gradient) and one product, which is returned too (N, 1 + m). Shared negatives keep
        two gathers: splitting one gather of N + m rows costs as many operators in the backward pass."""
        if ids.dim() == 2:
            scores = self.query_scores(query, torch.cat([target.unsqueeze(1), ids], dim=1))  # (N, 1 + m)
            return scores[:, :1], scores[:, 1:], scores
        return self.query_scores(query, target.unsqueeze(1)), self.query_scores(query, ids), None

    def target_log_q(
        self, query: Tensor, target: Tensor, inputs: Tensor | None = None, proposal: Proposal | None = None
    ) -> Tensor:
        """log q of each position's target (N, 1) under the step's ``proposal`` (built from the query vectors
        (N, d') and ``inputs`` (N,) when None); a batch-shared proposal is the same for every position."""
        proposal = self.propose(query, inputs) if proposal is None else proposal
        return proposal.log_q(target.unsqueeze(1))  # (N, 1)

    def after_optimizer_step(self) -> None:
        self.sampler.update(self.weight.detach(), changed_rows(self.weight, repeats=self.gpu_paths))

"""What the sampled family shares: the class matrix, scores, exact log-probabilities, drawing, the after-step hook."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, ClassVar, NamedTuple

import torch
from torch import Tensor, nn

from lmtrain.common.constants import with_ones_column
from lmtrain.output.base import OutputLayer, changed_rows, initial_bias
from lmtrain.output.logsumexp import chunked_logsumexp, class_rows, exact_log_prob
from lmtrain.output.rows import gather_rows, row_scores
from lmtrain.output.sampled.options import BiasOptions, SampledOptions
from lmtrain.sampler.base import Sampler
from lmtrain.sampler.proposal import Proposal


class Drawn(NamedTuple):
    """A step's draw as the loss takes it: the ``Draws`` of the proposal and, for distinct draws, the number of
    draws it took (``tries``, else None)."""

    ids: Tensor  # (m,) shared or (N, m) per position
    log_q: Tensor  # like ids
    target_log_q: Tensor | None  # (N, 1); None when the proposal was not given the targets
    tries: Tensor | None
    joint_ids: Tensor | None = None  # (N, 1 + m) the targets then the ids, where the proposal joined them


class Negatives(NamedTuple):
    """One step's negatives, scored: the drawn ids (m,) shared or (N, m) per position with their log q, the targets'
    log q (N, 1), the number of draws it took for distinct negatives (else None), and the scores of the targets
    (N, 1) and of the negatives (N, m), views of one (N, 1 + m) tensor ``joint`` where one product gave both (per
    position), else None."""

    ids: Tensor
    log_q: Tensor
    target_log_q: Tensor | None  # None where the loss reads no log q (``corrects_with_log_q``)
    tries: Tensor | None
    target_scores: Tensor
    noise_scores: Tensor
    joint: Tensor | None

    @property
    def scores(self) -> Tensor:
        """(N, 1 + m), the target's score first."""
        return self.joint if self.joint is not None else torch.cat([self.target_scores, self.noise_scores], dim=1)


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
    corrects_with_log_q: ClassVar[bool] = True  # False where the loss reads no log q (the targets' is not looked up)
    signed_scores: ClassVar[bool] = True  # False where the logit is |o|: then only zero biases make sense
    tie_refusal = ""

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
        self.sparse = opts.sparse is not False  # auto, resolved by the app from the optimizer, means on here
        self.weight = nn.Parameter(torch.empty(num_classes, dim + int(self.has_bias)))
        nn.init.uniform_(self.weight, -opts.init_range, opts.init_range)
        if self.has_bias:
            with torch.no_grad():
                self.weight[:, -1] = initial_bias(opts.bias_init, num_classes, counts)
        self.attach(sampler)
        self.check_options(num_classes, sampler)
        sampler.check_output(self)  # e.g. sampler=target refuses output.unique=true
        # derived sampler state (trees) is never stored: rebuild it from the loaded weights (``before_checkpoint``)
        self.register_load_state_dict_post_hook(lambda module, _: module.sampler.rebuild(module.weight.detach()))

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> SampledOutput:
        out = super()._apply(fn, recurse)  # moves the weight, and the sampler's own buffers (a submodule)
        self.sampler.follow(self.weight.detach())  # a proposal holding the weight follows it to the new device
        return out

    def attach(self, sampler: Sampler) -> None:
        """Make ``sampler`` this strategy's proposal: the one place that sets its mode (``shared_negatives``: kernel
        and context-free samplers switch, softmax and bigram keep their only one), gives it the logit function (a
        softmax proposal is then this model's softmax) and the current class vectors."""
        shared = self.options.shared_negatives
        if shared is not None:
            sampler.share_negatives(shared)
        self.shared_negatives = sampler.shared
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
        return [self.weight] if self.sparse else []

    def embed(self, tokens: Tensor) -> Tensor:
        """The tied input embedding: columns [:d] of the tokens' rows of ``weight`` (the bias column stays the
        output's). Gathered like the output's rows, sparse with ``sparse``, so both sides' row gradients add up to
        one sparse gradient of ``weight`` and ``changed_rows`` names the input rows too (a kernel tree follows them)."""
        return gather_rows(self.weight, tokens, self.sparse)[..., : self.dim]  # (..., d)

    # --- scores -------------------------------------------------------------------------------
    def query(self, hidden: Tensor) -> Tensor:
        """(N, d) -> (N, d') vectors whose dot product with a weight row is the logit."""
        if not self.has_bias:
            return hidden
        return with_ones_column(hidden)

    def score(self, query: Tensor, rows: Tensor) -> Tensor:
        """query (N, d'), rows (k, d') shared or (N, k, d') per example -> logits (N, k)."""
        return self.row_logits(self.logit_query(query), rows)

    def logit_query(self, query: Tensor) -> Tensor:
        """What ``row_logits`` multiplies the rows with, (N, d'): the query itself here, a leaf's transform of it
        (the cosine's unit vector). A call that scores one query several times (targets and shared negatives,
        vocabulary chunks) computes it once and passes it down, so nothing is kept between calls."""
        return query

    def row_logits(self, logit_query: Tensor, rows: Tensor) -> Tensor:
        """``logit_query`` (N, d'), rows (k, d') shared or (N, k, d') per example -> logits (N, k).

        Shared rows are multiplied on the left, so their gradient comes out of the product contiguous and the sparse
        gradient takes it without a copy; per-example rows go through ``row_scores``, which keeps that."""
        if rows.dim() == 2:
            return torch.mm(rows, logit_query.T).T  # (N, k), transposed in memory
        return row_scores(logit_query, rows)  # (N, k)

    def query_scores(self, query: Tensor, ids: Tensor) -> Tensor:
        """Logits of the given ids, (m,) shared or (N, m) per example -> (N, m), for query vectors (N, d') built
        once per step; the gradient into ``weight`` is sparse."""
        return self.score(query, gather_rows(self.weight, ids, self.sparse))

    def id_logits(self, logit_query: Tensor, ids: Tensor) -> Tensor:
        """``query_scores`` from the ``logit_query`` (N, d') computed once by the caller -> (N, m)."""
        return self.row_logits(logit_query, gather_rows(self.weight, ids, self.sparse))

    # --- exact evaluation ---------------------------------------------------------------------
    def log_normalizer(self, hidden: Tensor) -> Tensor:
        """(N, d) -> (N,) log of the sum over all classes of exp(score)."""
        return self.chunked_log_normalizer(self.logit_query(self.query(hidden)))

    def chunked_log_normalizer(self, logit_query: Tensor) -> Tensor:
        """``log_normalizer`` from the ``logit_query`` (N, d'), over the classes in chunks of ``eval_chunk``."""
        return chunked_logsumexp(partial(self.class_logits, logit_query), self.num_classes, self.options.eval_chunk)

    def class_logits(self, logit_query: Tensor, start: int, end: int) -> Tensor:
        """Logits of classes start..end for the ``logit_query`` (N, d') -> (N, end - start)."""
        return self.row_logits(logit_query, class_rows(self.weight, start, end))

    def log_prob(self, hidden: Tensor, target: Tensor) -> Tensor:
        logit_query = self.logit_query(self.query(hidden))  # (N, d')

        def target_score() -> Tensor:  # (N,)
            return self.id_logits(logit_query, target.unsqueeze(1))[:, 0]

        logits = partial(self.class_logits, logit_query)  # (start, end) -> (N, end - start)
        return exact_log_prob(logits, target_score, target, self.num_classes, self.options.eval_chunk)

    def log_probs_all(self, hidden: Tensor) -> Tensor:
        return torch.log_softmax(self.score(self.query(hidden), self.weight), dim=1)  # (N, n), the same scores

    # --- training -------------------------------------------------------------------------------
    def propose(self, query: Tensor, inputs: Tensor | None = None, target: Tensor | None = None) -> Proposal:
        """The sampler's proposal for this step, given the query vectors (N, d'), the input tokens (N,) and the
        targets (N,)."""
        return self.sampler.propose(query.detach(), inputs, target)  # context-free samplers ignore the context

    def draw(self, proposal: Proposal) -> Drawn:
        """The step's negatives from ``proposal`` (m = ``num_samples``)."""
        ids, log_q, target_log_q, joint_ids = proposal.draw(self.options.num_samples)
        return Drawn(ids, log_q, target_log_q, None, joint_ids)

    def negatives(self, hidden: Tensor, target: Tensor, inputs: Tensor | None = None) -> Negatives:
        """The step's proposal, its draws and the scores of the targets and the negatives, from query vectors built
        once."""
        query = self.query(hidden)  # (N, d')
        proposal = self.propose(query, inputs, target if self.corrects_with_log_q else None)
        d = self.draw(proposal)
        scores = self.joint_scores(query, target, d.ids, d.joint_ids)
        proposal.observe(d.ids, scores[1].detach())  # an adaptive proposal learns from its draws' logits
        return Negatives(d.ids, d.log_q, d.target_log_q, d.tries, *scores)

    def joint_scores(
        self, query: Tensor, target: Tensor, ids: Tensor, joint_ids: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """The scores of the targets (N, 1) and the negatives (N, m): per position views of one (N, 1 + m) product
        with one gather of their rows (``joint_ids`` when the proposal joined them already; one sparse gradient),
        returned too; shared negatives from the targets' row-wise dots and one product with the m rows."""
        logit_query = self.logit_query(query)  # (N, d'), once for both
        if ids.dim() == 2:
            joint_ids = torch.cat([target.unsqueeze(1), ids], dim=1) if joint_ids is None else joint_ids
            joint = self.id_logits(logit_query, joint_ids)  # (N, 1 + m)
            return joint[:, :1], joint[:, 1:], joint
        return self.id_logits(logit_query, target.unsqueeze(1)), self.id_logits(logit_query, ids), None

    def after_optimizer_step(self) -> None:
        self.sampler.update(self.weight.detach(), changed_rows(self.weight))

    def pin_proposal(self) -> None:
        self.sampler.rebuild(self.weight.detach().clone())  # a tree's buckets then read the copy, not the parameter

    def before_checkpoint(self) -> None:
        self.sampler.rebuild(self.weight.detach())  # what loading this checkpoint does, so both go on alike

    def kept_state(self) -> dict[str, Tensor]:
        return self.sampler.kept_state()

    def restore_kept_state(self, kept: dict[str, Tensor]) -> None:
        self.sampler.restore_kept_state(kept)

"""The interface every output strategy implements (docs/architecture.md)."""

from __future__ import annotations

from typing import ClassVar, NamedTuple

import torch
from torch import Tensor, nn

from lmtrain.common.part import Part
from lmtrain.common.precision import in_float32, wrap_methods

PAIRS_PER_CHUNK = 1 << 16  # (position, class) pairs per log_prob call in the default log_probs_all


class ExactClasses(NamedTuple):
    """Classes a sampled loss scores exactly instead of sampling them (dynamic evaluation's recent targets), in
    fixed-size tensors: ``ids`` (r,) with ``include`` (r,) False on a repeat or an empty slot, and ``member`` (n,)
    True for each class of the set."""

    ids: Tensor
    include: Tensor
    member: Tensor


class OutputLayer(nn.Module, Part):
    """Maps top-layer hidden states to a training objective and to exact log-probabilities.

    ``loss`` is the (possibly surrogate) objective minimised in training; ``log_prob`` is always the
    exact, normalized log-probability used for perplexity. Subclasses that keep derived state (a sampler tree)
    refresh it in ``after_optimizer_step`` and rebuild it in ``before_checkpoint``. ``loss`` also receives the input
    token at each position (the previous word), which the sampled strategies hand to a proposal conditioned on it.

    Every loss is one form on every device: fixed shapes, no host syncs (``docs/architecture.md``).

    Under mixed precision (autocast) every subclass's ``log_prob``, ``log_probs_all`` and ``extra_metrics`` run in
    float32 (``lmtrain.common.precision``): exact evaluation never passes through bfloat16.
    """

    group = "output"  # output=NAME (``lmtrain.common.part``)
    # the run-time values lmtrain.run.build passes besides the config
    runtime_args: ClassVar[tuple[str, ...]] = ("num_classes", "dim")

    num_classes: int
    loss_is_nll: bool = False  # True when `loss` is the exact mean -log p: then exp(loss) is a perplexity
    # True where ``loss`` takes ``exact`` (``ExactClasses``): a sampled normalizer that can hold classes exactly
    holds_exact_classes: ClassVar[bool] = False
    # why model.tie_weights cannot share this strategy's class vectors with the input embedding; "" where it can
    # (then ``embed`` reads them): the config check refuses the others before anything is built
    tie_refusal: ClassVar[str] = "it has no single vector per class to share"

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        wrap_methods(cls, ("log_prob", "log_probs_all", "extra_metrics", "unnormalized_log_prob"))

    def loss(self, hidden: Tensor, target: Tensor, inputs: Tensor | None = None) -> Tensor:
        """(N, d), (N,) -> scalar mean training objective; ``inputs`` (N,) the input tokens (None: not known)."""
        raise NotImplementedError

    def log_prob(self, hidden: Tensor, target: Tensor) -> Tensor:
        """(N, d), (N,) -> (N,) exact log p(target | hidden)."""
        raise NotImplementedError

    @in_float32
    def log_probs_all(self, hidden: Tensor) -> Tensor:
        """(N, d) -> (N, n) exact log p of every class (for sampling text and for checks; O(n) per position).

        Default: ``log_prob`` of every (position, class) pair, in vocabulary chunks of at most ``PAIRS_PER_CHUNK``
        pairs, right for any strategy; strategies with a direct form (one product with all class vectors) override it.
        """
        num_positions = hidden.shape[0]
        chunk = max(1, PAIRS_PER_CHUNK // max(num_positions, 1))
        parts = []
        for start in range(0, self.num_classes, chunk):
            classes = torch.arange(start, min(start + chunk, self.num_classes), device=hidden.device)  # (k,)
            pairs = self.log_prob(hidden.repeat_interleave(classes.numel(), 0), classes.repeat(num_positions))
            parts.append(pairs.view(num_positions, classes.numel()))  # (N, k)
        return torch.cat(parts, dim=1)

    def embed(self, tokens: Tensor) -> Tensor:
        """tokens (...) -> (..., dim) their class vectors: the input embedding of a tied model (``tie_weights``),
        read from this layer's own matrix, so both sides' gradients reach one parameter."""
        raise NotImplementedError(f"{type(self).__name__} cannot be tied: {self.tie_refusal}")

    def after_optimizer_step(self) -> None:
        """Called once after every optimizer step; default: nothing to refresh."""

    def pin_proposal(self) -> None:
        """Keep the proposal as the current weights give it until the next ``before_checkpoint``, however the weights
        move (dynamic evaluation's training objective): derived state built from a copy of them. Default: none."""

    def before_checkpoint(self) -> None:
        """Called whenever a checkpoint is written: derived state that the steps keep up to date incrementally is
        rebuilt from the weights, as loading the checkpoint rebuilds it, so that this process and one resumed from
        the checkpoint go on from the same state (exact resume). Default: no derived state."""

    def kept_state(self) -> dict[str, Tensor]:
        """For a checkpoint written off the run's step schedule (a stop, a timed one), which must not rebuild derived
        state (the run would then part from one never stopped): that state as the steps keep it, which a resume puts
        back over its rebuild (``restore_kept_state``). Default: no derived state."""
        return {}

    def restore_kept_state(self, kept: dict[str, Tensor]) -> None:
        """Put back what ``kept_state`` returned, after loading the same checkpoint's weights. Default: nothing."""

    def sparse_parameters(self) -> list[nn.Parameter]:
        """Parameters whose gradients are sparse row tensors (handled by the sparse optimizer path)."""
        return []

    def extra_metrics(self, hidden: Tensor) -> dict[str, Tensor]:
        """Optional diagnostics logged on validation (e.g. NCE's mean ln Z); default none."""
        return {}

    def unnormalized_log_prob(self, hidden: Tensor, target: Tensor) -> Tensor:
        """(N, d), (N,) -> (N,) the target's unnormalized score s_t (ln p + ln Z), one row read per position; only
        strategies with one score per class have it (``lmtrain.score normalized=false``)."""
        raise ValueError(f"output={getattr(self, 'name', type(self).__name__)} has no unnormalized score")

    eval_sum_count: int = 0  # how many sums ``eval_sums`` returns (fixed per layer: DDP adds them up across ranks)

    def eval_sums(self, hidden: Tensor, target: Tensor, log_p: Tensor) -> Tensor:
        """(N, d), (N,), the exact ln p (N,) -> (eval_sum_count,) float64 sums over the window's positions, which an
        evaluation adds up and hands to ``eval_summary`` at its end; default none."""
        return log_p.new_zeros(0, dtype=torch.float64)

    def eval_summary(self, sums: Tensor, tokens: Tensor, mean_nll: Tensor) -> dict[str, Tensor]:
        """The metrics of an evaluation (``val/NAME``, ``test/NAME``) from its summed ``eval_sums`` over ``tokens``
        positions and its mean NLL; default none."""
        return {}


def changed_rows(param: Tensor) -> Tensor | None:
    """Row ids that the last optimizer step changed: the rows of a sparse gradient, None = all rows. A row may be
    named more than once (no coalescing: its size would depend on the data)."""
    grad = param.grad
    if grad is None:
        return param.new_empty(0, dtype=torch.long)
    if grad.is_sparse:
        return grad._indices()[0]
    return None


def initial_bias(kind: str, num_classes: int, counts: Tensor | None) -> Tensor:
    """Initial output biases (n,): zeros, or (``log_unigram``) ln of the add-one-smoothed unigram of the training
    ``counts``; the config check has refused any other ``kind`` (the ``bias_init`` schema field's choices)."""
    if kind == "zero":
        return torch.zeros(num_classes)
    if counts is None or counts.numel() != num_classes:
        raise ValueError("output.bias_init=log_unigram needs the training counts, one per class")
    smoothed = counts.detach().double().cpu().reshape(-1) + 1.0
    return (smoothed / smoothed.sum()).log().to(torch.get_default_dtype())

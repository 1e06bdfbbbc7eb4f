"""Dynamic evaluation (Krause et al. 2018): the model keeps learning from the text it has scored.

The text is read in segments of ``segment`` tokens, batch 1, the LSTM state carried. Each segment is first scored
(the strategy's exact ``log_prob``, with the weights as the segments before left them), then the weights take one
step on that segment's mean loss g: with ``method=rms``

    θ <- θ - lr g / (RMS + eps) + decay · min(RMS / mean(RMS), 1 / decay) · (θ_0 - θ)

(both terms from the same θ), where θ_0 are the trained weights and RMS, per weight, the root mean square of the
gradients of training batches (``stat_batches`` windows of ``stat_batch`` x ``segment`` tokens, state carried):
the step is normalized per weight, and the pull back to θ_0 is stronger where the gradients are larger. mean(RMS)
is the mean over every adapted weight (the paper's; the reference code averages the tensors' means instead).
``method=sgd`` is θ <- θ - lr g: no statistics, no decay. ``objective=exact`` takes g from the exact
log-likelihood (what is scored); ``objective=train`` from the strategy's training loss (``output.loss`` with the
input tokens: sampled softmax, NCE, ...), whose backward pass skips the normalization over the vocabulary (where
that loss is the exact log-likelihood, as full's, ``train`` resolves to ``exact``: one computation). Its
proposal, with ``proposal=trained``, stays the trained model's for the pass: state derived from the class vectors (a
kernel sampler's tree) is built once from a copy of θ_0 and a proposal that learns (adaptive_ngram) does not step,
so its draws and log q stay exact for that fixed proposal and a step costs no refresh over the vocabulary;
``proposal=current`` refreshes it after every step, as training does (a kernel tree rebuilt over every class each
segment, since every row moves). Proposals computed from the current weights (softmax, quartic) follow them in
both. A sampled softmax's loss also holds the distinct targets of the last ``recent`` tokens in every position's
normalizer exactly (``lmtrain.tools.recent_targets``): the rows a pass pushes up are pushed down again at every
step, where a proposal that does not follow the model seldom draws them. Every token is scored before any step that
has read it. The weights change only in memory: ``restore`` puts θ_0 back (and the buffers a proposal learns);
nothing is written to the checkpoint. Every pass (and the statistics) starts by seeding torch's generators with
``seed``: the training loss's draws are then the same in every call and any process, so a score repeats exactly and
a search's result can be reused. An lr left out (null) is searched: the one of ``lr_grid`` with the lowest
perplexity of the first ``search_tokens`` tokens of the run's validation split (``lmtrain.tools.score_extras``),
going on past a grid end that is the best (``BEYOND``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor, nn

from lmtrain.common.precision import float32_region
from lmtrain.common.ranges import AT_LEAST_1, Checked, Choice
from lmtrain.data import WindowDataset, batchify
from lmtrain.output.base import ExactClasses
from lmtrain.tools.recent_targets import RecentTargets
from lmtrain.training.step import Batch, carry


class Method(Choice):
    """``rms``: the step normalized by the training gradients' RMS, with the decay to the trained weights (the
    paper's); ``sgd``: plain SGD steps."""

    rms = "rms"
    sgd = "sgd"


class ProposalState(Choice):
    """With ``objective=train``, the sampled loss's proposal during the pass: ``trained`` (fixed at θ_0: derived
    state built once, no proposal learning) or ``current`` (refreshed after every step, as in training)."""

    trained = "trained"
    current = "current"


class Objective(Choice):
    """The loss whose gradient a step takes: ``exact`` (the exact negative log-likelihood) or ``train`` (the
    strategy's training loss)."""

    exact = "exact"
    train = "train"


@dataclass
class DynamicOptions(Checked):
    """The keys of dynamic evaluation (``dynamic.KEY`` of ``python -m lmtrain.score``)."""

    method: Method = Method.rms
    objective: Objective = Objective.exact
    proposal: ProposalState = ProposalState.trained  # objective=train: the proposal fixed at θ_0 or refreshed
    # objective=train: the last `recent` tokens' targets held exactly in a sampled softmax's normalizer (0: none);
    # None: RECENT_WINDOW where the training loss is a sampled softmax, else 0
    recent: int | None = field(default=None, metadata={"at_least": 0})
    lr: float | None = field(default=None, metadata={"above": 0})  # η; None: searched (lr_grid)
    decay: float = field(default=2e-3, metadata={"at_least": 0})  # λ, the pull to the trained weights (rms)
    eps: float = field(default=2e-5, metadata={"above": 0})  # added to the RMS (rms)
    segment: int = field(default=5, metadata=AT_LEAST_1)  # tokens scored per step
    stat_batch: int = field(default=100, metadata=AT_LEAST_1)  # rows of a training batch of the statistics
    stat_batches: int | None = field(default=200, metadata=AT_LEAST_1)  # training batches read; None: all
    search_tokens: int = field(default=10000, metadata={"at_least": 100})  # validation tokens scored per lr tried
    seed: int = 0  # torch's generators at the start of each pass: objective=train's draws repeat


# The lrs searched, per method. An rms step divides g by its training RMS, so lr is near the step per weight; an sgd
# step is lr g raw, so the same step size needs an lr thousands of times larger. A grid's end that is the best is not
# taken as the optimum: the search goes on past it, doubling (or halving) the lr, until one is worse or BEYOND more
# have been tried. Each score report lists every candidate's perplexity.
LRS: dict[Method, tuple[float, ...]] = {
    Method.rms: (5e-6, 1e-5, 2e-5, 5e-5, 1e-4),
    Method.sgd: (0.05, 0.1, 0.2, 0.5, 1.0),
}
BEYOND = 4
RECENT_WINDOW = 2000  # tokens whose targets objective=train holds exactly, where the loss is a sampled softmax


def lr_grid(method: Method | str) -> tuple[float, ...]:
    """The lrs a search tries for ``method`` (``LRS``)."""
    return LRS[Method(method)]


def resolved(options: DynamicOptions, module: Any) -> DynamicOptions:
    """``options`` with ``recent`` concrete: left out, ``RECENT_WINDOW`` where ``objective=train`` steps on a
    sampled softmax (``module.output.holds_exact_classes``), else 0. A window given where no such loss is stepped
    on is refused. ``objective=train`` where the training loss is the exact log-likelihood
    (``module.output.loss_is_nll``: full without self-normalization, adaptive, hsm, mos, ...) is ``exact``: the same
    gradient, one output pass instead of two (the scores' and the loss's)."""
    trains = options.objective == Objective.train
    output = module.output if trains else None  # only a training loss asks what the output is
    exact_loss = trains and output.loss_is_nll
    holds = trains and output.holds_exact_classes
    if options.recent is not None and options.recent > 0 and not holds:
        if not trains:
            why = "dynamic.objective=exact steps on the exact loss"
        elif exact_loss:
            why = f"output={output.name}'s training loss is its exact log-likelihood"
        else:
            why = f"output={output.name}'s training loss has no sampled normalizer (each draw is judged alone)"
        raise ValueError(
            f"dynamic.recent={options.recent} holds recent targets in a sampled softmax's normalizer, but {why}: "
            "leave it out or set 0"
        )
    if options.recent is not None and 0 < options.recent < options.segment:
        raise ValueError(f"dynamic.recent={options.recent} is shorter than a segment ({options.segment} tokens)")
    recent = (RECENT_WINDOW if holds else 0) if options.recent is None else options.recent
    objective = Objective.exact if exact_loss else options.objective
    return replace(options, objective=objective, recent=recent)


def adapted(module: nn.Module) -> list[nn.Parameter]:
    """The weights dynamic evaluation changes: every trainable parameter (encoder and output)."""
    return [p for p in module.parameters() if p.requires_grad]


def segment_gradients(
    module: Any,
    batch: Batch,
    state: Any,
    objective: Objective | str,
    scored: bool = True,
    exact: ExactClasses | None = None,
) -> tuple[Tensor | None, Tensor, Any, list[Tensor]]:
    """One segment's forward pass from ``state`` and the gradient of its mean loss: exact log p of the targets
    (detached, (N,); None when not ``scored`` and the objective does not need it), hidden states (N, d), the state
    to carry on and one gradient per ``adapted`` parameter: dense (zeros where the loss does not reach it), or for
    a sparse embedding a sparse row tensor as autograd gives it (the segment's few input rows, a row possibly more
    than once: coalescing would size a tensor by the data, a host sync on a GPU). ``exact``: classes the training
    loss (a sampled softmax's) holds exactly."""
    inputs, targets = batch
    params = adapted(module)
    # cuDNN runs an LSTM's backward pass only in training mode; evaluation mode keeps dropout off
    with torch.enable_grad(), float32_region(), torch.backends.cudnn.flags(enabled=False):
        hidden, state = carry(module.encoder, inputs, state)
        log_p = module.output.log_prob(hidden, targets.reshape(-1)) if scored or objective == "exact" else None
        if objective == Objective.exact:
            loss = -log_p.mean()
        else:  # only a sampled softmax's loss (holds_exact_classes) is handed classes to hold exactly
            held = {} if exact is None else {"exact": exact}
            loss = module.output.loss(hidden, targets.reshape(-1), inputs=inputs.reshape(-1), **held)
        grads = torch.autograd.grad(loss, params, allow_unused=True)
    pairs = zip(params, grads, strict=True)
    grads = [torch.zeros_like(p) if g is None else g for p, g in pairs]
    return None if log_p is None else log_p.detach(), hidden.detach(), state, grads


def statistics_batches(tokens: int, options: DynamicOptions) -> int:
    """The training batches ``gradient_rms`` reads from a split of ``tokens`` tokens."""
    windows = math.ceil((tokens // options.stat_batch - 1) / options.segment)
    return windows if options.stat_batches is None else min(windows, options.stat_batches)


def gradient_rms(
    module: Any, train_ids: Tensor, options: DynamicOptions, device: torch.device, progress: Callable | None = None
) -> tuple[list[Tensor], int]:
    """RMS over training batches of each adapted parameter's gradient (one tensor per parameter) and the number of
    batches read: ``stat_batches`` windows (None: all) of ``stat_batch`` rows x ``segment`` tokens, in order. A
    sampled softmax's loss holds no recent targets here: the statistics are the training loss's own."""
    windows = WindowDataset(batchify(train_ids, options.stat_batch, "train"), options.segment)
    torch.manual_seed(options.seed)  # objective=train draws samples
    count = statistics_batches(train_ids.numel(), options)
    squares, state = [torch.zeros_like(p) for p in adapted(module)], None
    for index in range(count):
        batch = tuple(part.to(device) for part in windows[index])
        _, _, state, grads = segment_gradients(module, batch, state, options.objective, scored=False)
        for total, grad in zip(squares, grads, strict=True):
            dense = grad.to_dense() if grad.is_sparse else grad  # a row's entries summed before squaring
            total.addcmul_(dense, dense)
        if progress is not None:
            progress(index + 1)
    return [total.div_(count).sqrt_() for total in squares], count


@torch.no_grad()
def rms_step(params: list[Tensor], grads: list[Tensor], keeps: list[Tensor], anchors: list[Tensor],
             scales: list[Tensor]) -> None:  # fmt: skip
    """θ <- keep θ + anchor + scale g for each parameter, in place: with keep = 1 - pull, anchor = pull θ_0 and
    scale = -lr / (RMS + eps) this is θ + pull (θ_0 - θ) - lr g / (RMS + eps), both terms from the θ before the
    step, in two passes over θ and no θ-sized temporary. A sparse gradient adds its term to its rows only."""
    for param, grad, keep, anchor, scale in zip(params, grads, keeps, anchors, scales, strict=True):
        torch.addcmul(anchor, keep, param, out=param)  # every row decays: one pass, θ read and written in place
        add_rows_or_all(param, grad, scale)


def add_rows_or_all(param: Tensor, grad: Tensor, scale: Tensor) -> None:
    """θ += scale g in place; a sparse gradient adds its term to its rows only (a row named twice adds both)."""
    if grad.is_sparse:
        rows = grad._indices()[0]  # (r,)
        param.index_add_(0, rows, grad._values() * scale[rows])
    else:
        param.addcmul_(grad, scale)


class LazyDecay:
    """The rms step's decay of a parameter whose gradient is sparse rows (an untied input embedding), applied to a
    row only when a segment reads it. A row left alone for k steps decays as θ_0 + keep^k (θ - θ_0), which is k
    eager steps of θ <- keep θ + (1 - keep) θ_0; so a step costs the segment's rows, not the vocabulary's.
    ``catch_up(rows)`` before a forward pass reads them; ``current`` before anything reads the whole matrix."""

    def __init__(self, param: Tensor, keep: Tensor, origin: Tensor) -> None:
        self.param, self.keep, self.origin = param, keep, origin
        self.done = torch.zeros(param.shape[0], dtype=torch.long, device=param.device)  # (n,) steps applied per row
        self.steps = 0  # steps taken

    @torch.no_grad()
    def catch_up(self, rows: Tensor) -> None:
        """Apply every step's decay that ``rows`` (r,) have missed (a row named twice gets the same value twice)."""
        missed = (self.steps - self.done[rows]).unsqueeze(1).to(self.param.dtype)  # (r, 1)
        origin = self.origin[rows]  # (r, d)
        self.param[rows] = origin + self.keep[rows].pow(missed) * (self.param[rows] - origin)
        self.done[rows] = self.steps

    @torch.no_grad()
    def step(self, grad: Tensor, scale: Tensor) -> None:
        """One step: the decay on the gradient's rows (read by the segment, so caught up), its term added to them."""
        self.steps += 1
        self.catch_up(grad._indices()[0])
        add_rows_or_all(self.param, grad, scale)

    def current(self) -> None:
        """Every row decayed to the current step (the whole matrix as the eager step leaves it)."""
        self.catch_up(torch.arange(self.param.shape[0], device=self.param.device))

    def reset(self) -> None:
        """After θ_0 is restored: no step taken."""
        self.done.zero_()
        self.steps = 0


@torch.no_grad()
def sgd_step(params: list[Tensor], grads: list[Tensor], lr: float) -> None:
    """θ -= lr g, in place."""
    for param, grad in zip(params, grads, strict=True):
        param.add_(grad, alpha=-lr)


class DynamicEvaluation:
    """A scorer (``lmtrain.output.cache.Scorer``) that adapts ``module`` as it reads: each call scores a segment,
    then steps on its gradient. ``rms``: the training gradients' RMS per parameter (``gradient_rms``; ``method=rms``
    only). ``restore`` puts the trained weights back."""

    def __init__(self, module: Any, options: DynamicOptions, rms: list[Tensor] | None = None) -> None:
        if options.lr is None:  # the search (score_extras) resolves it first
            raise ValueError("dynamic evaluation needs a concrete lr: pass dynamic.lr or search it (lr_grid)")
        options = resolved(options, module)
        self.module, self.options = module, options
        self.params = adapted(module)
        device = self.params[0].device
        self.recent = RecentTargets(options.recent, module.output.num_classes, device) if options.recent else None
        self.start = [p.detach().clone() for p in self.params]  # θ_0
        # what a proposal learns lives in persistent buffers (adaptive_ngram's mixture logits): kept to restore
        persistent = module.state_dict(keep_vars=True)
        self.start_buffers = {n: b.detach().clone() for n, b in module.named_buffers() if n in persistent}
        self.refreshes = options.objective == Objective.train and options.proposal == ProposalState.current
        self.owned: list[int] = []  # the parameters whose gradients a refresh reads (which rows changed)
        if self.refreshes:  # the output's own, no other's
            mine = {id(p) for p in module.output.parameters()}
            self.owned = [i for i, p in enumerate(self.params) if id(p) in mine]
        if options.objective == Objective.train and not self.refreshes:
            module.output.pin_proposal()  # a tree over a copy of θ_0, kept for the pass
        # the rms step's three factors (rms_step), fixed for the pass: keep = 1 - pull, anchor = pull θ_0 and
        # scale = -lr / (RMS + eps), where pull = decay · min(RMS / mean(RMS), 1 / decay) is at most 1
        self.keeps: list[Tensor] = []
        self.anchors: list[Tensor] = []
        self.scales: list[Tensor] = []
        if options.method == Method.rms:
            if rms is None:
                raise ValueError("dynamic.method=rms needs the training gradients' RMS (gradient_rms)")
            mean = sum(float(r.double().sum()) for r in rms) / max(sum(r.numel() for r in rms), 1)
            ceiling = 1 / options.decay if options.decay > 0 else 0.0
            for r, origin in zip(rms, self.start, strict=True):
                pull = (r / mean if mean > 0 else torch.ones_like(r)).clamp_(max=ceiling).mul_(options.decay)
                self.keeps.append(1 - pull)
                self.anchors.append(pull.mul_(origin))
                self.scales.append((r + options.eps).reciprocal_().mul_(-options.lr))
        # an embedding with sparse row gradients decays lazily: a step then touches the segment's rows only
        embedding = getattr(module.encoder, "embedding", None) if hasattr(module, "encoder") else None
        self.lazy: LazyDecay | None = None
        if self.keeps and isinstance(embedding, nn.Embedding) and embedding.sparse:
            index = next(i for i, p in enumerate(self.params) if p is embedding.weight)
            self.lazy = LazyDecay(self.params[index], self.keeps[index], self.start[index])
        torch.manual_seed(options.seed)  # a pass's draws (objective=train) start here, and again after restore

    def __call__(self, batch: Batch, state: Any) -> tuple[Tensor, Tensor, Any]:
        """Score one segment with the current weights, then take the step on it."""
        if self.lazy is not None:
            self.lazy.catch_up(batch[0].reshape(-1))  # the input rows the forward pass reads
        exact = None
        if self.recent is not None:  # this segment's targets join the window before its step
            self.recent.push(batch[1].reshape(-1))
            exact = self.recent.classes()
        log_p, hidden, state, grads = segment_gradients(self.module, batch, state, self.options.objective, exact=exact)
        self.step(grads)
        return log_p, hidden, state

    def step(self, grads: list[Tensor]) -> None:
        """One step on the gradients ``grads`` (one per adapted parameter)."""
        opts = self.options
        if opts.method == Method.rms:
            for i, (param, grad) in enumerate(zip(self.params, grads, strict=True)):
                if self.lazy is not None and param is self.lazy.param:  # a sparse embedding's gradient: sparse
                    self.lazy.step(grad, self.scales[i])
                else:
                    rms_step([param], [grad], [self.keeps[i]], [self.anchors[i]], [self.scales[i]])
        else:
            sgd_step(self.params, grads, opts.lr)
        if self.refreshes:  # the training loss reads derived state: refresh it (all rows changed)
            for i in self.owned:
                self.params[i].grad = grads[i].to_dense() if grads[i].is_sparse else grads[i]  # every row moved
            self.module.output.after_optimizer_step()
            for i in self.owned:
                self.params[i].grad = None

    @torch.no_grad()
    def restore(self) -> None:
        """The trained weights and persistent buffers again (and the output's derived state rebuilt from them), and
        the seed: the next pass starts as this one did."""
        for param, origin in zip(self.params, self.start, strict=True):
            param.copy_(origin)
        if self.lazy is not None:
            self.lazy.reset()
        if self.recent is not None:
            self.recent.clear()
        for name, buffer in self.module.named_buffers():
            if name in self.start_buffers:
                buffer.copy_(self.start_buffers[name])
        self.module.output.before_checkpoint()
        torch.manual_seed(self.options.seed)

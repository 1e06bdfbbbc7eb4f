"""The interface every proposal distribution implements (docs/architecture.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from torch import Tensor, nn

from lmtrain.common.part import Part
from lmtrain.common.precision import wrap_methods
from lmtrain.sampler.proposal import Proposal


class Sampler(nn.Module, Part):
    """A proposal q over the classes, used for negatives by sampled softmax, NCE and negative sampling.

    Its one method of the step is ``propose(query, inputs, targets)``: this step's ``Proposal``, which draws the
    negatives with their log q and the targets' log q (``Proposal.draw``) and answers ``log_q`` of any ids. The
    context is ``query``, the output layer's query vectors (N, d'), e.g. [h, 1], whose dot product with a row of the
    class vectors given to ``update`` is the logit; ``inputs`` (N,), the input token at each position (for a language
    model the previous word); and ``targets`` (N,), the classes the loss scores against the draws. A sampler uses
    what it needs; one that needs ``inputs`` and gets None raises ValueError.

    ``shared``: the proposal draws one set of m ids for the whole batch, else m per position. Context-free samplers
    offer both (the output layer chooses with ``share_negatives``), kernel samplers too (batch-shared: from the
    mixture of the batch's proposals), while softmax and bigram always draw per position.

    Under mixed precision (autocast) ``propose``, ``update`` and ``rebuild`` of every subclass run in float32
    (``lmtrain.common.precision``): log q and a kernel tree's node sums never pass through bfloat16.
    """

    group = "sampler"  # sampler=NAME (``lmtrain.common.part``)
    # the run-time values lmtrain.run.build passes besides the config
    runtime_args: ClassVar[tuple[str, ...]] = ("num_classes",)

    shared: bool = True
    per_position_only: ClassVar[bool] = False  # True where every draw depends on its position (no shared mode)
    # True where q reads neither the queries, the input tokens nor the class vectors (``update`` keeps nothing), so
    # that an output without a class matrix can use it (``output=charcnn``): uniform, unigram, inbatch
    context_free: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        wrap_methods(cls, ("propose", "update", "rebuild"))

    def propose(self, query: Tensor | None, inputs: Tensor | None = None, targets: Tensor | None = None) -> Proposal:
        """This step's proposal for the queries (N, d'), input tokens (N,) and targets (N,)."""
        raise NotImplementedError

    def share_negatives(self, shared: bool) -> None:
        """Draw one set of negatives per batch (``shared``) or one per position; samplers with only a per-position
        mode (softmax, bigram) keep it."""
        if not self.per_position_only:
            self.shared = bool(shared)

    def update(self, weight: Tensor, rows: Tensor | None = None) -> None:
        """Refresh after class embeddings changed; ``rows`` = changed rows, None = all. Default no-op."""

    def rebuild(self, weight: Tensor) -> None:
        """Derive every piece of state that depends on the class vectors from ``weight`` (n, d') alone. A loaded
        checkpoint's weights get this, and so do the weights of a running process whenever it writes a checkpoint,
        so that a process resumed from it draws what the writer draws next. Default: ``update`` with every row
        changed."""
        self.update(weight)

    def kept_state(self) -> dict[str, Tensor]:
        """The state derived from the class vectors as the steps keep it, where a ``rebuild`` would not give it back
        bit for bit (a kernel tree's sums), for a checkpoint written off the run's schedule. Default: none."""
        return {}

    def restore_kept_state(self, kept: dict[str, Tensor]) -> None:
        """Put back what ``kept_state`` returned, after a ``rebuild`` from the same weights. Default: nothing."""

    def follow(self, weight: Tensor) -> None:
        """The output layer's weight moved (another device or dtype: ``module.to``): samplers that keep a reference
        to it take the moved tensor. Default no-op (trees move their own buffers as submodules)."""

    def check_output(self, output: Any) -> None:
        """Refuse, with one line, an output layer whose options this sampler cannot serve (``output.options``; the
        output calls it once it is built). Default: every output fits."""

    def use_scores(self, score: Callable[[Tensor, Tensor], Tensor]) -> None:
        """Receive the output layer's logit function, query (N, d') and rows (k, d') -> (N, k). Samplers whose
        proposal is the model's own softmax keep it; the others ignore it (the default)."""

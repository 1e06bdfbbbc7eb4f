"""One step's proposal: q given this step's context, built once by ``Sampler.propose`` and dropped after the step."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor

from lmtrain.common.precision import wrap_methods

if TYPE_CHECKING:
    from lmtrain.sampler.base import Sampler


class Proposal:
    """The proposal of one step: ``sample(m)`` draws and ``log_q(ids)`` is the exact log-probability of any ids
    under the same q. ``per_example``: ids and log q (N, m), one row per position; else (m,) shared by the batch
    (context-free, or one proposal built from the whole batch), and ``log_q`` takes ids of any shape."""

    per_example: bool = False
    # True where log q of any ids is a lookup whose cost does not depend on how many ids: the GPU paths then draw
    # the ids alone (``sample_ids``) and look up the targets' and the negatives' log q together, one operator
    log_q_by_lookup: bool = False
    _expected: Tensor | None = None  # ``expect``'s ids, and their log q once ``remember`` keeps it
    _expected_log_q: Tensor | None = None

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        wrap_methods(cls, ("sample", "sample_ids", "log_q"))  # float32 under autocast, as the samplers' (precision.py)

    def sample(self, num_samples: int) -> tuple[Tensor, Tensor]:
        """Draw ``num_samples`` ids (with replacement) per position, or for the batch; (ids, log_q)."""
        raise NotImplementedError

    def sample_ids(self, num_samples: int) -> Tensor:
        """``sample``'s ids alone, the same draws (a proposal whose log q is a lookup skips it: ``log_q_by_lookup``)."""
        return self.sample(num_samples)[0]

    def log_q(self, ids: Tensor) -> Tensor:
        """Exact log q of ``ids``: (N, k) per position, any shape for a shared proposal."""
        raise NotImplementedError

    def expect(self, ids: Tensor) -> None:
        """``ids`` whose ``log_q`` will be asked for after ``sample`` (a step's targets, (N, 1)): a proposal may
        compute it together with its draws' (fewer operators: ``remember``) and return it from ``known_log_q``."""
        self._expected, self._expected_log_q = ids, None

    @property
    def expected(self) -> Tensor | None:
        """The ids given to ``expect``, if any."""
        return self._expected

    def remember(self, log_q: Tensor) -> None:
        """Keep ``log_q`` of the expected ids, computed with the draws."""
        self._expected_log_q = log_q

    def known_log_q(self, ids: Tensor) -> Tensor | None:
        """The log q of ``ids`` kept by ``remember`` when they are the expected ids (the same tensor), else None."""
        known, log_q = self._expected, self._expected_log_q
        if log_q is None or known is None or ids.shape != known.shape or ids.data_ptr() != known.data_ptr():
            return None
        return log_q


class BoundProposal(Proposal):
    """A sampler with this step's context bound: its queries (N, d') and input tokens (N,). The default of
    ``Sampler.propose`` for samplers whose ``sample`` and ``log_q`` need nothing computed per step."""

    def __init__(self, sampler: Sampler, query: Tensor | None, inputs: Tensor | None) -> None:
        self.sampler, self.query, self.inputs = sampler, query, inputs
        self.per_example, self.log_q_by_lookup = sampler.per_example, sampler.log_q_by_lookup

    def sample(self, num_samples: int) -> tuple[Tensor, Tensor]:
        return self.sampler.sample(self.query, num_samples, inputs=self.inputs)

    def sample_ids(self, num_samples: int) -> Tensor:
        return self.sampler.sample_ids(self.query, num_samples, inputs=self.inputs)

    def log_q(self, ids: Tensor) -> Tensor:
        known = self.known_log_q(ids)  # looked up with the draws' (``SampledOutput.joint_draw``)
        return known if known is not None else self.sampler.log_q(self.query, ids, inputs=self.inputs)

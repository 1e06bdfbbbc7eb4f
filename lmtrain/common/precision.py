"""Float32 regions under mixed precision (``trainer.precision=bf16-mixed`` or ``16-mixed``).

Autocast runs matrix products in bfloat16 (8 significant bits) or float16. That is fine for a training step's
logits, but not for the numbers whose small differences matter: a proposal's log q (the sampled losses subtract
it from the logits), the kernel tree's node sums (sums of thousands of feature vectors, whose differences are
the walk's branch probabilities) and the exact log-probabilities of evaluation (a mean over many positions,
compared between strategies to a fraction of a percent). Those run in ``float32_region``: autocast off, the
tensors they get cast to float32. ``Sampler`` and ``OutputLayer`` apply ``in_float32`` to those methods of
every subclass (docs/strategies.md, "Mixed precision").
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from typing import Any, TypeVar

import torch

AUTOCAST_DEVICES = ("cpu", "cuda")
LOW_PRECISION = (torch.bfloat16, torch.float16)
# precision names Lightning also takes, under the names it reports once it has built a Trainer
PRECISION_ALIASES = {"16": "16-mixed", "bf16": "bf16-mixed", "32": "32-true", "64": "64-true"}
F = TypeVar("F", bound=Callable[..., Any])
log = logging.getLogger(__name__)


def autocast_on() -> bool:
    """Whether autocast is enabled for any device type here."""
    return any(torch.is_autocast_enabled(device) for device in AUTOCAST_DEVICES)


@contextmanager
def float32_region() -> Iterator[None]:
    """Autocast off for every device type where it is on: inside, products run in their inputs' dtype. A no-op
    outside autocast."""
    with ExitStack() as stack:
        for device in AUTOCAST_DEVICES:
            if torch.is_autocast_enabled(device):
                stack.enter_context(torch.autocast(device, enabled=False))
        yield


def to_float32(value: Any) -> Any:
    """A bfloat16 / float16 tensor as float32 (differentiable), anything else unchanged."""
    return value.float() if isinstance(value, torch.Tensor) and value.dtype in LOW_PRECISION else value


def in_float32(fn: F) -> F:
    """``fn`` run in a ``float32_region``, its bfloat16 / float16 tensor arguments cast to float32; outside autocast
    and without such arguments it is called as it is."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        low = any(isinstance(a, torch.Tensor) and a.dtype in LOW_PRECISION for a in (*args, *kwargs.values()))
        if not low and not autocast_on():
            return fn(*args, **kwargs)
        with float32_region():
            return fn(*map(to_float32, args), **{k: to_float32(v) for k, v in kwargs.items()})

    wrapper.__wrapped_in_float32__ = True  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]


def wrap_methods(cls: type, names: tuple[str, ...]) -> None:
    """Make the methods ``names`` that ``cls`` itself defines run ``in_float32`` (for ``__init_subclass__``)."""
    for name in names:
        method = cls.__dict__.get(name)
        if callable(method) and not getattr(method, "__wrapped_in_float32__", False):
            setattr(cls, name, in_float32(method))


@functools.cache
def cpu_rnn_takes(dtype: torch.dtype) -> bool:
    """Whether this CPU's oneDNN builds an LSTM under autocast to ``dtype``. An LSTM under CPU autocast is oneDNN's,
    whose bfloat16 LSTM needs AVX-512: on an AVX2-only CPU it fails ("could not create a primitive descriptor"). A
    one-step probe, once per process and dtype; False logs a warning (the encoder then runs torch's own LSTM)."""
    lstm = torch.nn.LSTM(2, 2)
    try:
        with torch.autocast("cpu", dtype=dtype), torch.no_grad():
            lstm(torch.zeros(1, 1, 2))
    except RuntimeError:
        log.warning(
            "mixed precision on this CPU: its oneDNN has no %s LSTM (that needs AVX-512), so the encoder runs "
            "torch's own LSTM (slower; its products still in %s under autocast)",
            dtype,
            dtype,
        )
        return False
    return True


def lstm_region(device: torch.device) -> AbstractContextManager[Any]:
    """Where an LSTM on ``device`` runs: as it is, except under CPU autocast to a dtype this CPU's oneDNN has no LSTM
    in (``cpu_rnn_takes``), where oneDNN is off for it: torch's own LSTM, whose products autocast casts as any other
    (its output and state float32)."""
    if device.type == "cpu" and torch.is_autocast_enabled("cpu") and not cpu_rnn_takes(torch.get_autocast_dtype("cpu")):
        return torch.backends.mkldnn.flags(enabled=False)
    return nullcontext()

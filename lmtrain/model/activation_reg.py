"""Activation regularization (AR) and temporal activation regularization (TAR) of an LSTM's top-layer outputs
(Merity et al. 2017), the terms a training objective adds to the loss."""

from __future__ import annotations

from torch import Tensor


def activation_penalties(raw: Tensor, dropped: Tensor, ar: float, tar: float) -> dict[str, Tensor]:
    """The penalties of one window's top-layer outputs, raw and after the output dropout, each (B, T, d):
    ``ar`` = alpha * mean(dropped^2) and ``tar`` = beta * mean((h_t - h_{t-1})^2) over the raw outputs within the
    window; a rate of 0 leaves its term out (as does TAR for a window of one step). In float32 under mixed
    precision."""
    penalties = {}
    if ar:
        penalties["ar"] = ar * dropped.float().pow(2).mean()
    if tar and raw.shape[1] > 1:
        h = raw.float()
        penalties["tar"] = tar * (h[:, 1:] - h[:, :-1]).pow(2).mean()
    return penalties

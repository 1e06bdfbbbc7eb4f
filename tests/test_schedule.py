"""Learning-rate schedules: a key left out takes the one default that the config schema also shows."""

from __future__ import annotations

import pytest
import torch

from lmtrain.training.schedule import ScheduleOptions, build_scheduler


@pytest.mark.parametrize("kind", ["step", "plateau"])
def test_a_missing_decay_is_the_schema_default(kind):
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = build_scheduler(optimizer, {"kind": kind, "start": 0})["scheduler"]
    if kind == "step":
        scheduler.step()
        assert optimizer.param_groups[0]["lr"] == pytest.approx(ScheduleOptions().decay ** 2)  # epochs 1 - 0 + 1
    else:
        assert scheduler.factor == ScheduleOptions().decay
    assert build_scheduler(optimizer, {"kind": "none"}) is None


def test_an_unknown_kind_is_refused_in_one_line_without_a_config():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ValueError, match=r"^kind must be one of 'step', 'plateau', 'none', None, got 'cosine'$"):
        build_scheduler(optimizer, {"kind": "cosine"})  # not a silent constant learning rate

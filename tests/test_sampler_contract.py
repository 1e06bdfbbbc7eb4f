"""The Sampler contract, checked for every ``sampler=`` choice in both modes a strategy may ask for: one proposal
per step whose draws carry their exact log q, a log q that is a distribution, and the targets' log q from it."""

from __future__ import annotations

import pytest
import torch

from lmtrain.config import choices, compose_config
from lmtrain.run.build import build_output

N_CLASSES, DIM, POSITIONS, M = 30, 6, 5, 7
CASES = [(name, shared) for name in choices("sampler") for shared in (False, True)]


def sampled_softmax(name: str, shared: bool):
    overrides = ["~data", "output=sampled", f"sampler={name}", f"output.shared_negatives={str(shared).lower()}"]
    cfg = compose_config([*overrides, "sampler.D=16" if name == "rff" else "seed=0", "run_dir=/tmp/unused"])
    counts = torch.arange(N_CLASSES, 0, -1)
    train_ids = torch.randint(N_CLASSES, (2000,), generator=torch.Generator().manual_seed(0))
    return build_output(cfg, N_CLASSES, DIM, counts, train_ids)


@pytest.mark.parametrize(("name", "shared"), CASES, ids=[f"{n}-{'shared' if s else 'per_position'}" for n, s in CASES])
def test_every_sampler_keeps_the_proposal_contract(name, shared):
    torch.manual_seed(0)
    layer = sampled_softmax(name, shared)
    hidden, inputs = torch.randn(POSITIONS, DIM), torch.randint(N_CLASSES, (POSITIONS,))
    target = torch.randint(N_CLASSES, (POSITIONS,))
    proposal = layer.propose(layer.query(hidden), inputs, target)  # one per step
    ids, log_q, target_log_q, _ = proposal.draw(M)
    m = M if not proposal.fixes_num_samples else ids.shape[-1]  # in-batch negatives: the batch's N targets
    expected_shape = (m,) if proposal.shared else (POSITIONS, m)
    assert proposal.shared == layer.sampler.shared  # the mode asked, where the sampler has both (else its own)
    # those have one mode: per position (softmax, bigram, adaptive_ngram, quartic) or one set per batch
    assert proposal.shared == shared or layer.sampler.per_position_only or name in ("inbatch", "target")
    assert ids.shape == log_q.shape == expected_shape and ids.dtype == torch.long
    assert int(ids.min()) >= 0 and int(ids.max()) < N_CLASSES
    torch.testing.assert_close(log_q, proposal.log_q(ids), rtol=1e-4, atol=1e-5)  # the log q of what was drawn
    table = proposal.log_q_all(N_CLASSES)  # (N, n)
    assert table.shape == (POSITIONS, N_CLASSES)
    torch.testing.assert_close(table.double().exp().sum(-1), torch.ones(POSITIONS).double(), atol=1e-4, rtol=0)
    torch.testing.assert_close(target_log_q, table.gather(1, target[:, None]), rtol=1e-4, atol=1e-5)  # (N, 1)
    assert torch.isfinite(layer.loss(hidden, target, inputs))

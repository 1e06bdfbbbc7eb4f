"""The adaptive softmax's fixed-shape loss (a GPU's step forms: no host sync): torch's module's loss and gradients,
the same state."""

from __future__ import annotations

import pytest
import torch
from lab.launches import DispatchCounter

from lmtrain.common.runtime import CPU_FORMS, GPU_FORMS
from lmtrain.output import AdaptiveSoftmax


def loss_and_grads(output: AdaptiveSoftmax, hidden: torch.Tensor, target: torch.Tensor, gpu: bool):
    output.forms = GPU_FORMS if gpu else CPU_FORMS  # one layer in either forms: the same weights for both
    hidden = hidden.clone().requires_grad_(True)
    output.zero_grad(set_to_none=True)
    loss = output.loss(hidden, target)
    loss.backward()
    return loss.detach(), hidden.grad, {k: p.grad.clone() for k, p in output.named_parameters()}


# tails of 70, 110 and 100 words; of 80, 80 (scored as one, ``tail_groups``) and 120
@pytest.mark.parametrize("cutoffs", [[20, 90, 200], [20, 100, 180]])
# dense tail clusters; torch's row chunks (the tails' weights fit 5e-3 MiB, their logits at 40 positions do not); the
# hand-written chunks of a few classes
@pytest.mark.parametrize("logits_mib", [128.0, 5e-3, 1e-4])
def test_the_gpu_path_gives_the_cpu_paths_loss_and_gradients(logits_mib, cutoffs):
    torch.manual_seed(0)
    output = AdaptiveSoftmax(300, 16, cutoffs=cutoffs, div_value=2.0, logits_mib=logits_mib).double()
    hidden = torch.randn(40, 16, dtype=torch.float64)
    edges = [0, *cutoffs, 300]
    # each cluster's first and last word
    ends = torch.tensor([e for a, b in zip(edges[:-1], edges[1:], strict=True) for e in (a, b - 1)])
    target = torch.cat([ends, torch.randint(300, (32,))])
    cpu, gpu = (loss_and_grads(output, hidden, target, on) for on in (False, True))
    torch.testing.assert_close(gpu[0], cpu[0], rtol=1e-12, atol=0)
    torch.testing.assert_close(gpu[1], cpu[1], rtol=1e-10, atol=1e-14)
    assert cpu[2].keys() == gpu[2].keys()
    for name, grad in cpu[2].items():
        torch.testing.assert_close(gpu[2][name], grad, rtol=1e-10, atol=1e-14, msg=name)
    assert all(g.abs().sum() > 0 for g in gpu[2].values())  # every cluster was trained


def test_the_gpu_path_does_not_sync_and_keeps_the_state_and_the_evaluation():
    """Built in a GPU's step forms, the loss reads nothing on the host; its state is a CPU-forms layer's (checkpoints
    load either way) and its evaluation is torch's."""
    torch.manual_seed(1)
    output = AdaptiveSoftmax(1000, 32, forms=GPU_FORMS, cutoffs=[100, 400])
    hidden, target = torch.randn(64, 32), torch.randint(1000, (64,))
    log_p = output.log_prob(hidden, target)
    with DispatchCounter() as counter:
        output.loss(hidden, target).backward()
    assert counter.counts.syncs == 0, dict(counter.counts.sync_ops)
    other = AdaptiveSoftmax(1000, 32, cutoffs=[100, 400])  # a CPU's forms, the default
    with DispatchCounter() as counter:
        other.loss(hidden, target)
    assert counter.counts.sync_ops["nonzero"] >= 1  # the other form: torch's module finds each cluster's positions
    keys = set(output.state_dict())
    assert set(other.state_dict()) == keys and "bounds" not in keys  # checkpoints load on either path
    torch.testing.assert_close(output.log_prob(hidden, target), log_p, rtol=0, atol=0)
    other.load_state_dict(output.state_dict())
    torch.testing.assert_close(other.log_prob(hidden, target), log_p, rtol=0, atol=0)

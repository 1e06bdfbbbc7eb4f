"""The output layers' GPU-path losses (``execution=gpu``: fixed shapes, fewer operators) against their CPU paths:
the same loss and the same gradients, to float rounding, for the same draws."""

from __future__ import annotations

import pytest
import torch
from lab.launches import DispatchCounter, synthetic_counts

from lmtrain.common.execution import set_execution
from lmtrain.output.sampled import cosine
from lmtrain.output.sampled.estimators import (
    accidental_hits,
    exact_logits,
    exact_offsets,
    joint_softmax_nll,
    softmax_nll,
)
from lmtrain.training.build import build_output
from lmtrain.training.optim import merge_repeats
from tests.conftest import make_config

pytestmark = pytest.mark.usefixtures("one_thread")

N, DIM, CLASSES = 48, 12, 300
OUTPUTS = [
    ["output=uniform"],
    ["output=unigram"],
    ["output=exp"],
    ["output=bigram"],
    ["output=nce"],
    ["output=nce", "output.learn_log_z=true"],
    ["output=negative"],
    ["output=hsm"],
    ["output=hsm", "output.tree=two_level"],
    ["output=rff", "sampler=uniform"],  # the cosine softmax
    ["output=quadratic", "sampler=unigram"],  # the absolute softmax
    ["output=rff", "sampler=uniform", "output.shared_negatives=true"],
    ["output=adaptive", "output.cutoffs=[20,100]", "output.div_value=2.0"],
]


def loss_and_grads(output, hidden, target, inputs, execution: str):
    set_execution(output, execution)
    output.zero_grad(set_to_none=True)
    hidden = hidden.clone().requires_grad_(True)
    torch.manual_seed(7)  # the same draws on both paths
    loss = output.loss(hidden, target, inputs)
    loss.backward()
    grads = {k: p.grad.to_dense() if p.grad.is_sparse else p.grad for k, p in output.named_parameters()}
    return loss.detach(), hidden.grad, grads


@pytest.mark.parametrize("overrides", OUTPUTS, ids=lambda o: " ".join(o))
def test_gpu_path_losses_equal_the_cpu_paths(overrides):
    assert_paths_agree(overrides)


@pytest.mark.parametrize("joint", [True, False])
def test_shared_cosine_scores_gather_targets_and_negatives_once_up_to_a_size(joint, monkeypatch):
    """The cosine softmax's shared negatives: up to ``JOINT_POSITIONS`` positions one gather of the targets' and the
    negatives' rows and one product (the targets on its diagonal), beyond it two; both equal the CPU path's."""
    monkeypatch.setattr(cosine, "JOINT_POSITIONS", N if joint else N - 1)
    with DispatchCounter() as counter:
        assert_paths_agree(["output=rff", "sampler=uniform", "output.shared_negatives=true"], paths=("gpu",))
    assert counter.counts.by_op["index"] == (1 if joint else 2)  # building and a step index nothing else
    assert_paths_agree(["output=rff", "sampler=uniform", "output.shared_negatives=true"])


# the lookups of a proposal whose log q is a lookup, in one forward pass on the GPU paths: the targets' log q is looked
# up with the negatives' (``SampledOutput.joint_draw``), one fewer than a lookup each (unigram: the alias table, the
# log q and the rows; bigram: the query's ones column and the joined ids, no join of the draws and the targets)
LOOKUPS = {"unigram": ("index", 3), "exp": ("gather", 1), "bigram": ("cat", 2), "nce": ("index", 3)}


@pytest.mark.parametrize(("output", "lookup"), LOOKUPS.items())
def test_the_targets_log_q_is_looked_up_with_the_negatives(output, lookup):
    module, hidden, target, inputs = built([f"output={output}"])
    set_execution(module, "gpu")
    with DispatchCounter() as counter:
        module.loss(hidden, target, inputs)
    op, expected = lookup
    assert counter.counts.by_op[op] == expected, dict(counter.counts.by_op)


def built(overrides: list[str]):
    """A float64 output layer of ``CLASSES`` classes with random weights, and a batch: hidden, target, inputs."""
    counts = synthetic_counts(CLASSES)
    stream = torch.multinomial(counts.double(), 5000, replacement=True, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    output = build_output(make_config(["~data", *overrides]), CLASSES, DIM, counts, stream).double()
    with torch.no_grad():  # biases away from 0, so the [h, 1] column matters
        for p in output.parameters():
            p.add_(0.3 * torch.randn_like(p))
    hidden = torch.randn(N, DIM, dtype=torch.float64)
    target = torch.multinomial(counts.double(), N, replacement=True)
    inputs = torch.multinomial(counts.double(), N, replacement=True)
    return output, hidden, target, inputs


def assert_paths_agree(overrides: list[str], paths: tuple[str, ...] = ("cpu", "gpu")) -> None:
    """The GPU path's loss and gradients equal the CPU path's (with one path given: only run it)."""
    output, hidden, target, inputs = built(overrides)
    if len(paths) == 1:
        loss_and_grads(output, hidden, target, inputs, paths[0])
        return
    cpu = loss_and_grads(output, hidden, target, inputs, "cpu")
    gpu = loss_and_grads(output, hidden, target, inputs, "gpu")
    torch.testing.assert_close(gpu[0], cpu[0], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(gpu[1], cpu[1], rtol=1e-9, atol=1e-12)
    for name, grad in cpu[2].items():
        torch.testing.assert_close(gpu[2][name], grad, rtol=1e-9, atol=1e-12, msg=name)
    assert cpu[0].abs() > 0.1 and cpu[1].abs().sum() > 0


def test_merged_repeats_put_each_rows_sum_at_its_first_sorted_entry():
    rows = torch.tensor([4, 1, 4, 0, 1, 4])
    values = torch.arange(12.0).view(6, 2)
    merged = merge_repeats(torch.sparse_coo_tensor(rows.unsqueeze(0), values, (6, 2)))
    assert merged._indices()[0].tolist() == [0, 1, 1, 4, 4, 4]
    expected = [[6, 7], [2 + 8, 3 + 9], [0, 0], [0 + 4 + 10, 1 + 5 + 11], [0, 0], [0, 0]]
    assert merged._values().tolist() == expected


def test_the_gpu_sampled_softmax_removes_every_hit_even_when_all_negatives_are_hits():
    """The GPU form (offsets, +inf on the hits, a cross entropy with class 0) against the CPU form (corrected logits,
    -inf on the hits): equal where some negatives are hits, and where all are (k_t = 0, which the offsets take no
    floor for) the row's loss is 0 and its gradient 0, not NaN; per position and as the mean."""
    torch.manual_seed(3)
    n, m = 5, 4
    scores = torch.randn(n, 1 + m, dtype=torch.float64, requires_grad=True)
    target = torch.tensor([0, 1, 2, 3, 4])
    ids = torch.tensor([[0, 0, 0, 0], [1, 5, 1, 6], [7, 8, 9, 5], [3, 3, 3, 3], [4, 6, 7, 8]])
    log_q, log_q_target = torch.full((n, m), -2.0, dtype=torch.float64), torch.full((n,), -2.0, dtype=torch.float64)
    hits = accidental_hits(ids, target)
    gpu = joint_softmax_nll(scores, exact_offsets(log_q, log_q_target, hits, m))
    corrected = exact_logits(scores[:, 1:], log_q, log_q_target, hits, m).masked_fill(hits, float("-inf"))
    cpu = softmax_nll(scores[:, :1], corrected)
    torch.testing.assert_close(gpu, cpu, rtol=1e-12, atol=1e-12)
    assert gpu[0] == 0 and gpu[3] == 0 and bool((gpu[[1, 2, 4]] > 0).all())
    mean = joint_softmax_nll(scores, exact_offsets(log_q, log_q_target, hits, m), mean=True)
    torch.testing.assert_close(mean, cpu.mean(), rtol=1e-12, atol=1e-12)
    (grad,) = torch.autograd.grad(mean, scores)
    assert bool(grad.isfinite().all()) and bool((grad[[0, 3]] == 0).all())

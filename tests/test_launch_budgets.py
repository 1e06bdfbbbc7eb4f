"""What a training step asks of a GPU, counted on the CPU under ``execution=gpu``: at most one host sync, a kernel
sampler's operator count bounded by unigram's and the same whatever the vocabulary size, and the other strategies
within 1.5x the full softmax's operators plus their sampler's draw where that is met (docs/gpu.md).

Counts are exact (``lmtrain.tools.launches``), so they are asserted, not timed. The model is small (16 units,
D = 32) so that a vocabulary of 10^6 builds in seconds: operator counts depend on the tree's depth and the
code paths, not on the widths (``scripts/bench_launches.py`` counts the default model); the 1.5x rule is checked
on the default model, since the number of LSTM layers changes the full softmax's count."""

from __future__ import annotations

import pytest
import torch

from lmtrain.tools.launches import DispatchCounter, count_draw, count_train_step
from lmtrain.training.optim import merge_repeats

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = ["model.emb_dim=16", "model.hidden_dim=16", "model.num_layers=1"]
KERNEL = ["output=rff", "output=quadratic"]
# The budget is 3x unigram's operators, 2x unigram's (about 160 on the default model) beyond unigram's own.
# Counted exactly (no profiler markers or wrappers, the optimizer's multi-tensor step as on CUDA) the kernel samplers
# take up to about 230 beyond it: the budget is not met (docs/gpu.md), and this bound only keeps the count from growing
KERNEL_BEYOND_UNIGRAM = 240


def counts(overrides: list[str], n: int, execution: str = "gpu"):
    extra = ["sampler.D=32"] if "output=rff" in overrides else []
    return count_train_step([*SMALL, *extra, *overrides, f"execution={execution}"], n, batch=(20, 35))


@pytest.mark.parametrize(
    "output",
    ["full", "uniform", "unigram", "bigram", "nce", "negative", "hsm", "exp", "rff", "quadratic", "adaptive"],
)
def test_a_gpu_step_has_at_most_one_host_sync(output):
    step = counts([f"output={output}"], 2000)
    assert step.syncs <= 1, dict(step.sync_ops)


def test_the_other_hsm_tree_and_the_cpu_adaptive_path_sync_as_expected():
    """The two-level tree's GPU path has no unique; torch's adaptive softmax (the CPU path) syncs once per cluster."""
    assert counts(["output=hsm", "output.tree=two_level"], 2000).syncs <= 1
    cpu = counts(["output=adaptive", "output.cutoffs=[200,800]"], 2000, "cpu")
    assert cpu.sync_ops["nonzero"] == 3 and counts(["output=adaptive", "output.cutoffs=[200,800]"], 2000).syncs <= 1


@pytest.fixture(scope="module")
def full_step() -> int:
    """Operators of the full softmax's GPU-path step on the default model (the 1.5x rule's unit)."""
    return count_train_step(["output=full", "execution=gpu"], 2000).launches


@pytest.mark.parametrize("output", ["hsm", "nce"])  # where the rule is met (docs/gpu.md: why not the others)
def test_other_strategies_launch_at_most_one_and_a_half_fulls_plus_their_draw(output, full_step):
    """The default model (the rule is about its step: a smaller model shrinks the full softmax's count more)."""
    step = count_train_step([f"output={output}", "execution=gpu"], 2000)
    draw = count_draw([f"output={output}", "execution=gpu"], 2000).launches
    assert step.syncs <= 1 and step.launches <= 1.5 * full_step + draw, (step.launches, full_step, draw)


def test_a_draw_is_counted_alone():
    """uniform's draw is two operators (the ids and their log q); a strategy without a sampler has none."""
    assert count_draw(["output=uniform", *SMALL, "execution=gpu"], 2000).launches == 2
    assert count_draw(["output=hsm", *SMALL, "execution=gpu"], 2000).launches == 0


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("output", KERNEL)
def test_kernel_samplers_launch_the_same_operators_at_every_size(output, shared):
    options = [output, f"output.shared_negatives={str(shared).lower()}"]
    unigram = counts(["output=unigram"], 10_000).launches
    small, large = (counts(options, n) for n in (10_000, 1_000_000))
    assert small.syncs <= 1 and large.syncs <= 1, (dict(small.sync_ops), dict(large.sync_ops))
    assert max(small.launches, large.launches) - unigram <= KERNEL_BEYOND_UNIGRAM, (small.launches, large.launches)
    assert abs(large.launches - small.launches) <= 0.05 * small.launches, (small.launches, large.launches)


def test_the_cpu_paths_are_the_ones_that_sync():
    """The switch is real: the CPU paths deduplicate with unique (a sync on a GPU), the GPU paths do not."""
    cpu, gpu = counts(["output=rff"], 2000, "cpu"), counts(["output=rff"], 2000, "gpu")
    assert cpu.syncs > 1 and "_unique2" in cpu.sync_ops and gpu.syncs <= 1


def test_the_counter_sees_syncs_and_skips_views():
    x = torch.arange(6.0)
    with DispatchCounter() as counter:
        y = x.view(2, 3).t()  # views: nothing launched
        z = (y * 2).sum()  # two operators
        float(z)  # a host read
        torch.unique(x)  # a data-dependent size
        x[x > 2]  # a boolean mask
    assert counter.counts.launches == 2 + 1 + 1 + 2  # mul, sum, _local_scalar_dense, unique, gt, index
    assert counter.counts.syncs == 3


def test_merged_repeats_equal_the_coalesced_gradient():
    """merge_repeats (the GPU paths' coalesce) keeps the size and sums repeated rows exactly."""
    rows = torch.tensor([4, 1, 4, 0, 1, 4])
    values = torch.arange(12.0).view(6, 2)
    grad = torch.sparse_coo_tensor(rows.unsqueeze(0), values, (6, 2))
    merged = merge_repeats(grad)
    assert merged._values().shape == (6, 2)
    torch.testing.assert_close(merged.to_dense(), grad.to_dense())
    torch.testing.assert_close(merged._values().norm(), grad.coalesce().values().norm())

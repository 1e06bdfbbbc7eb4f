"""What a training step asks of a GPU, counted on the CPU in the forms a GPU takes (``step_forms=gpu``, decided when
the model is built): at most one host sync, a kernel
sampler's operator count bounded by unigram's and not growing with the vocabulary size, and the other strategies
within 1.5x the full softmax's operators plus their sampler's draw where that is met (docs/gpu.md).

Counts are exact (``lab.launches``), so they are asserted, not timed. The model is small (16 units,
D = 32) so that a vocabulary of 10^6 builds in seconds: operator counts depend on the code paths (a kernel tree
scored whole or walked, blocks), not on the widths (``scripts/bench_launches.py`` counts the default model); the
1.5x rule is checked on the default model, since the number of LSTM layers changes the full softmax's count."""

from __future__ import annotations

import pytest
import torch
from bench_launches import OUTPUTS, WITHIN_THE_RULE, overrides
from lab.launches import DispatchCounter, count_draw, count_train_step, counted_step

from lmtrain.training.optim import merge_repeats

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = ["model.emb_dim=16", "model.hidden_dim=16", "model.num_layers=1"]
KERNEL = ["output=rff", "output=quadratic"]
# The budget is 3x unigram's operators on the default model, 2x unigram's (2 x 60 = 120) beyond unigram's own;
# on the small test model (unigram: 58) the kernel samplers take at most 117 beyond it (rff at 10^6 types)
KERNEL_BEYOND_UNIGRAM = 120
# sizes of the small model's trees: 10^4 types are scored whole (per position, the last 3 levels drawn in a stage
# read from the product); 2 x 10^5 and 10^6 are 2^15 and 2^17 buckets of quadratic (scored whole, and a gathered
# stage of 2 levels), 2^16 and 2^18 of rff (gathered stages of 1 and 3 levels): trees of up to 2^15 buckets are
# scored whole (``SCORED_LEVELS``), deeper ones draw their last levels in gathered stages (``STAGE_LEVELS``)
WHOLE, WALKED = 10_000, (200_000, 1_000_000)
SAME_COUNT = 1.05  # the "the same count (+-5%)" at every size: the largest at most 1.05x the smallest


def counts(options: list[str], n: int, forms: str = "gpu"):
    extra = ["sampler.D=32"] if "output=rff" in options else []
    return count_train_step([*SMALL, *extra, *options, f"step_forms={forms}"], n, batch=(20, 35))


@pytest.mark.parametrize("entry", OUTPUTS)
def test_a_gpu_step_has_at_most_one_host_sync(entry):
    """Every strategy the launch script counts (``scripts/bench_launches.py``), the survey's parts and options among
    them: the in-batch and target proposals' fixed-size sets, infrequent normalisation's fixed count of positions."""
    step = counts(overrides(entry), 2000)
    assert step.syncs <= 1, dict(step.sync_ops)


def test_the_other_hsm_tree_and_the_cpu_adaptive_path_sync_as_expected():
    """The two-level tree's GPU path has no unique; torch's adaptive softmax (the CPU path) syncs once per cluster."""
    assert counts(["output=hsm", "output.tree=two_level"], 2000).syncs <= 1
    cpu = counts(["output=adaptive", "output.cutoffs=[200,800]"], 2000, "cpu")
    assert cpu.sync_ops["nonzero"] == 3 and counts(["output=adaptive", "output.cutoffs=[200,800]"], 2000).syncs <= 1


@pytest.fixture(scope="module")
def full_step() -> int:
    """Operators of the full softmax's GPU-path step on the default model (the 1.5x rule's unit)."""
    return count_train_step(["output=full", "step_forms=gpu"], 2000).launches


# unigram, exp and bigram meet it with the targets' log q looked up with the negatives' (``SampledOutput.joint_draw``):
# one operator over it without; adaptive with its equal-size tail clusters scored as one
# (``AdaptiveSoftmax.tails_nll``): two over it without


@pytest.mark.parametrize("output", WITHIN_THE_RULE)
def test_other_strategies_launch_at_most_one_and_a_half_fulls_plus_their_draw(output, full_step):
    """The default model (the rule is about its step: a smaller model shrinks the full softmax's count more)."""
    step = count_train_step([f"output={output}", "step_forms=gpu"], 2000)
    draw = count_draw([f"output={output}", "step_forms=gpu"], 2000).launches
    assert step.syncs <= 1 and step.launches <= 1.5 * full_step + draw, (step.launches, full_step, draw)


def adaptation_launches(overrides: list[str], num_classes: int, positions: int = 700) -> int:
    """Operators of a sampler's adaptation alone: ``Proposal.observe`` of a step's scored draws and the after-step
    ``Sampler.update`` (zero for a sampler that does not adapt), on the default model's shapes."""
    from lab.step_fixture import synthetic_counts

    from lmtrain.config import compose_config
    from lmtrain.run.build import build_module

    cfg = compose_config(["data=synthetic", f"data.vocab_size={num_classes}", "trainer.accelerator=cpu", *overrides])
    torch.manual_seed(0)
    counts = synthetic_counts(num_classes)
    module = build_module(cfg, num_classes, counts, torch.multinomial(counts.double(), 20_000, replacement=True))
    output, hidden = module.output, torch.randn(positions, cfg.model.hidden_dim)
    inputs, target = (torch.multinomial(counts.double(), positions, replacement=True) for _ in range(2))
    with torch.no_grad():
        for _ in range(2):  # the last one is counted
            proposal = output.propose(output.query(hidden), inputs, target)
            drawn = output.draw(proposal)
            scores = torch.randn(drawn.ids.shape if drawn.ids.dim() == 2 else (positions, drawn.ids.numel()))
            with DispatchCounter() as counter:
                proposal.observe(drawn.ids, scores)
                output.sampler.update(output.weight.detach(), None)
    return counter.counts.launches


# the proposals added beside the sampled softmax's, each against the path its output takes with an existing sampler:
# beyond its own draw (and adaptive_ngram's adaptation, its sampler's work too: the importance weights and the SGD
# step of its mixture), target and inbatch pay what the batch-shared path pays (uniform's shared mode),
# adaptive_ngram what the per-position path with one joint lookup pays (bigram), output=quartic what the absolute
# softmax with a dense proposal pays (quadratic with sampler=softmax). Those paths' margins against 1.5x full are
# their own (docs/gpu.md)
SAME_PATH = {
    "target": (["output=sampled", "sampler=target"], ["output=uniform", "output.shared_negatives=true"]),
    "inbatch": (["output=sampled", "sampler=inbatch"], ["output=uniform", "output.shared_negatives=true"]),
    "adaptive_ngram": (["output=sampled", "sampler=adaptive_ngram"], ["output=bigram"]),
    "quartic": (["output=quartic"], ["output=quadratic", "sampler=softmax"]),
}


@pytest.mark.parametrize("proposal", list(SAME_PATH))
def test_the_added_proposals_cost_their_paths_beyond_their_own_work(proposal):
    ours, path = ([*o, "step_forms=gpu"] for o in SAME_PATH[proposal])
    step, reference = count_train_step(ours, 2000), count_train_step(path, 2000)
    own = count_draw(ours, 2000).launches + adaptation_launches(ours, 2000)
    beyond = reference.launches - count_draw(path, 2000).launches
    assert step.syncs <= 1 and step.launches <= beyond + own, (step.launches, beyond, own)


# output=charcnn's step is a sampled softmax's (unigram's) plus a network run on the step's N + m words (character
# embedding, one convolution, the window mask and max, tanh, a highway layer, the projection; forward and backward):
# 47 operators on the small model, which the 1.5x-full rule, made for class vectors stored as a matrix, leaves no room
# for. Its own rule: that network's count on top of unigram's, the same at every vocabulary size
CNN_BEYOND_UNIGRAM = 50


def test_charcnn_launches_unigrams_step_plus_its_network_at_every_size():
    unigram = counts(["output=unigram"], WHOLE).launches
    steps = [counts(["output=charcnn"], n) for n in (2000, 100_000)]
    assert all(step.syncs <= 1 for step in steps), [dict(step.sync_ops) for step in steps]
    launches = [step.launches for step in steps]
    assert launches[0] == launches[1] <= unigram + CNN_BEYOND_UNIGRAM, (launches, unigram)


def test_a_draw_is_counted_alone():
    """uniform's draw is one operator (the ids; their log q is a view of one value); a strategy without a sampler has
    none."""
    assert count_draw(["output=uniform", *SMALL, "step_forms=gpu"], 2000).launches == 1
    assert count_draw(["output=hsm", *SMALL, "step_forms=gpu"], 2000).launches == 0


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("output", KERNEL)
def test_kernel_samplers_launch_the_same_count_whatever_the_tree(output, shared):
    """The same count (+-5%) for a tree scored whole (10^4 types) and deeper ones whose last levels are gathered,
    and every count within 3x unigram's (the margin below, for this small model). Batch-shared, the one query psi
    scores every tree here whole (a matrix-vector product with every node), so its walk launches the same at every
    size; its tree update, on the deeper trees, adds its few rows' deltas along their paths instead of re-summing
    the tree (``FixedUpdate.by_paths``: rff 3 operators fewer, quadratic 6 more, which recomputes the changed
    buckets' leaves from the weights), which the same rule bounds."""
    options = [output, f"output.shared_negatives={str(shared).lower()}"]
    unigram = counts(["output=unigram"], WHOLE).launches
    steps = [counts(options, n) for n in (WHOLE, *WALKED)]
    launches = [step.launches for step in steps]
    assert all(step.syncs <= 1 for step in steps), [dict(step.sync_ops) for step in steps]
    assert max(launches) <= SAME_COUNT * min(launches), launches
    assert max(launches) - unigram <= KERNEL_BEYOND_UNIGRAM, (launches, unigram)


@pytest.mark.parametrize("options", [[], ["output.shared_negatives=true"]])
@pytest.mark.parametrize("output", KERNEL)
def test_kernel_samplers_take_at_most_three_unigrams_at_ten_thousand_types(output, options):
    """The default model at 10^4 types (docs/bench/launches_1e4.md), where every kernel variant meets the budget."""
    unigram = count_train_step(["output=unigram", "step_forms=gpu"], 10_000).launches
    step = count_train_step([output, *options, "step_forms=gpu"], 10_000)
    assert step.syncs <= 1 and step.launches <= 3 * unigram, (step.launches, unigram)


@pytest.mark.parametrize("output", KERNEL)
def test_shared_kernel_samplers_take_at_most_three_unigrams_at_ten_to_the_five_types(output):
    """The default model at 10^5 types (docs/bench/launches_scale.md), batch-shared: psi scores the whole tree (the
    count of 10^4 types), and the cosine softmax scores targets and negatives with one gather."""
    unigram = count_train_step(["output=unigram", "step_forms=gpu"], 100_000).launches
    step = count_train_step([output, "output.shared_negatives=true", "step_forms=gpu"], 100_000)
    assert step.syncs <= 1 and step.launches <= 3 * unigram, (step.launches, unigram)


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


def test_the_counter_leaves_out_the_sparse_gradient_copy_only_counting_causes():
    """Autograd keeps a new sparse gradient as ``.grad`` without a copy unless something else holds its indices; the
    counting mode's own wrapper does, so under it a copy appears that the real step never makes (torch.profiler holds
    nothing and sees none). Counting it put one operator too many in every step with a sparse gradient."""
    emb = torch.nn.Embedding(50, 4, sparse=True)
    ids = torch.randint(0, 50, (6,))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        emb(ids).mul(2).sum().backward()
    assert not [event.name for event in prof.events() if event.name == "aten::clone"]  # the real backward
    emb.weight.grad = None
    with DispatchCounter() as counter:
        emb(ids).mul(2).sum().backward()
    assert "clone" not in counter.counts.by_op and counter.counts.launches == 5, counter.counts.by_op
    with DispatchCounter() as counter:
        emb.weight.grad.clone()  # a copy asked for is counted
    assert counter.counts.by_op["clone"] == 1


class SoftmaxesOverTheClasses(DispatchCounter):
    """Counts the log-softmaxes taken over all ``CLASSES`` classes (the softmax proposal's), besides the rest."""

    CLASSES = 2000

    def __init__(self) -> None:
        super().__init__()
        self.over_classes = 0

    def launched(self, name, args, kwargs, out) -> None:
        self.over_classes += name == "_log_softmax" and args[0].shape[-1] == self.CLASSES


def test_the_softmax_proposal_takes_its_log_softmax_once_a_step():
    """``output=exp``: one (N, n) product and log-softmax a step serve the draws and the targets' log q."""
    step = counted_step(SoftmaxesOverTheClasses, [*SMALL, "output=exp"], 2000, (20, 35), 2, 0)
    assert step.over_classes == 1

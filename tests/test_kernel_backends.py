"""A kernel tree's two backends on the same tree, the fixed one (a GPU's) against the walk (a CPU's): the same log q
for the same ids, the targets' log q computed with the draws equal to the one computed alone, and training steps that
learn alike; and the choice of the step forms, once, when the model is built."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from lab.launches import synthetic_counts

from lmtrain.common.runtime import CPU_FORMS, GPU_FORMS
from lmtrain.sampler import QuadraticSampler, RFFSampler
from lmtrain.sampler.kernel.fixed_backend import FixedBackend
from lmtrain.sampler.kernel.walk_backend import WalkBackend
from tests.conftest import DEVICES
from tests.forced_steps import CASE_IDS, CASES, VOCAB, assert_same_steps, config, two_steps

pytestmark = pytest.mark.usefixtures("one_thread")


def use_backend(made, backend: str) -> None:
    """Switch ``made``'s tree to ``backend`` (``walk`` or ``fixed``), to compare both on one tree."""
    made.tree.use_backend(backend)


def sampler(kind: str, shared: bool, n: int = 300, d: int = 6, device: str = "cpu", **extra):
    counts = synthetic_counts(n)
    options = {"unigram_share": 0.25, "num_classes": n, "counts": counts, **extra}
    made = RFFSampler(D=32, leaf_size=4, **options) if kind == "rff" else QuadraticSampler(leaf_size=4, **options)
    made.share_negatives(shared)
    weight = 0.3 * torch.randn(n, d, generator=torch.Generator().manual_seed(0))
    made.to(device).update(weight.to(device))
    use_backend(made, "walk")
    return made


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("walked", [1, 2, 3, 4, 0])
@pytest.mark.parametrize("shared", [False, True, "whole"])
@pytest.mark.parametrize("kind", ["rff", "quadratic"])
def test_the_fixed_backend_gives_the_walks_log_q_and_the_targets(kind, shared, walked, device):
    """Per position, and batch-shared with psi walking the last levels or (``whole``) scoring the whole tree; the
    last ``walked`` levels drawn in gathered stages (1 to 3: one stage of as many levels; 4: two of two), or none
    (0: a tree scored whole, per position a stage read from the product). On a GPU too, where the walked levels
    with known targets once failed (a bitwise op into a float tensor)."""
    made = sampler(kind, bool(shared), device=device)
    gen = torch.Generator().manual_seed(1)
    query = torch.randn(5, 6, generator=gen).to(device)
    targets = torch.randint(0, 300, (5,), generator=gen).to(device)
    others = torch.randint(0, 300, (5, 7), generator=gen).to(device)
    cpu = made.propose(query)
    expected_targets, expected_others = cpu.log_q(targets[:, None]), cpu.log_q(others)

    use_backend(made, "fixed")
    walk, depth = made.tree.backend.walk, made.tree.depth
    walk.walked, walk.scored = walked, 0  # a tree of 7 levels: the last ``walked`` drawn in gathered stages
    walk.single_reads = walk.single_reads if shared == "whole" else 0  # one query: every level scored at once
    assert (walk.top(1) == depth) == (shared == "whole" or not walked)
    assert walk.top(5) == depth - (walked or 3)  # a tree scored whole: its last 3 levels a stage of the product's
    fixed = made.propose(query, None, targets)
    torch.testing.assert_close(fixed.log_q(others), expected_others, rtol=1e-5, atol=1e-5)
    ids, log_q, target_log_q, _ = fixed.draw(40)
    torch.testing.assert_close(target_log_q, expected_targets, rtol=1e-5, atol=1e-5)  # walked down with the draws
    use_backend(made, "walk")
    cpu = made.propose(query)  # a walk's proposal of the same queries (a proposal follows its tree's backend)
    torch.testing.assert_close(log_q, cpu.log_q(ids), rtol=1e-5, atol=1e-5)  # the draws' log q is the walk's


@pytest.mark.parametrize("scored_levels", [0, 5, 7])
def test_scored_levels_reach_the_fixed_walk_and_keep_the_walks_log_q(scored_levels):
    """``sampler.scored_levels`` sets the levels the fixed backend's product scores (the last 4 walked at most: 3 of
    this 7-level tree at 0, 5, and all 7, a tree scored whole); log q stays the walk's at each."""
    options = {"unigram_share": 0.25, "num_classes": 300, "counts": synthetic_counts(300)}
    made = RFFSampler(D=32, leaf_size=4, scored_levels=scored_levels, **options)
    made.update(0.3 * torch.randn(300, 6, generator=torch.Generator().manual_seed(0)))
    query = torch.randn(5, 6, generator=torch.Generator().manual_seed(1))
    ids = torch.randint(0, 300, (5, 9), generator=torch.Generator().manual_seed(2))
    expected = made.propose(query).log_q(ids)
    use_backend(made, "fixed")
    assert made.tree.depth == 7 and made.tree.backend.walk.scored_level(5) == max(3, scored_levels)
    torch.testing.assert_close(made.propose(query).log_q(ids), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_auto_follows_the_step_forms_and_a_forced_backend_stays(device):
    """``sampler.backend=auto``: the fixed backend in a GPU's step forms, the walk in a CPU's (and for a sampler
    built without any), chosen once when the tree is built: it stays on any device the layer moves to (``follow``);
    ``walk`` and ``fixed`` hold in either forms."""
    weight = 0.3 * torch.randn(300, 6)
    cases = [(backend, forms) for backend in ("auto", "walk", "fixed") for forms in (None, CPU_FORMS, GPU_FORMS)]
    for backend, forms in cases:
        made = RFFSampler(D=32, leaf_size=4, unigram_share=0.0, backend=backend, forms=forms)
        fixed = backend == "fixed" or (backend == "auto" and forms is GPU_FORMS)
        made.update(weight)
        made.follow(weight.to(device))
        assert type(made.tree.backend) is (FixedBackend if fixed else WalkBackend), (backend, forms)
        assert made.tree.store.block_limit == made.tree.backend.block_limit
        ids = made.propose(torch.randn(4, 6).to(device)).draw(5).ids  # draws on the device, in the backend chosen
        assert ids.device.type == device and ids.shape == (4, 5)


@pytest.mark.parametrize("device", DEVICES)
def test_the_fixed_backend_keeps_the_unit_rows_current_through_updates(device):
    """RFF's unit rows, kept beside its feature cache for the fixed backend's in-bucket scores (zero on the padding
    rows), equal the normalized weights after every update: changed rows with repeats, then every row at once; log q
    still equals the walk's. The walk's update does not keep them: it drops them; the fixed backend makes them
    again."""
    made = sampler("rff", False, n=301, device=device)  # 301 classes: the last bucket has padding slots
    cache, weight = made.tree.store.cache, made.tree.store.weight.clone()
    query = torch.randn(5, 6, generator=torch.Generator().manual_seed(2)).to(device)
    others = torch.randint(0, 301, (5, 7), generator=torch.Generator().manual_seed(3)).to(device)
    use_backend(made, "fixed")

    def assert_current() -> None:
        made.propose(query).draw(20)  # in-bucket scores read the unit rows (and make them when dropped)
        rows = cache.rows
        torch.testing.assert_close(rows[:301], torch.nn.functional.normalize(weight, dim=-1), rtol=0, atol=0)
        assert rows.shape[0] > 301 and not rows[301:].any()

    assert_current()
    for changed in (torch.tensor([4, 250, 4, 17, 250]), torch.arange(301).repeat(2)):
        weight[changed] += 0.5 * torch.randn(changed.numel(), 6, generator=torch.Generator().manual_seed(4)).to(device)
        made.update(weight, changed.to(device))
        assert_current()
    expected = made.propose(query).log_q(others)
    use_backend(made, "walk")
    torch.testing.assert_close(made.propose(query).log_q(others), expected, rtol=1e-5, atol=1e-5)
    made.update(weight, torch.tensor([3]).to(device))
    assert cache.rows.numel() == 0
    use_backend(made, "fixed")
    assert_current()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["rff", "quadratic"])
def test_path_deltas_keep_the_walks_log_q(kind, device):
    """The tree update by path deltas (``sampler.tree_update=paths``; ``auto`` takes it at 10^6 classes with
    batch-shared negatives): after updates whose rows repeat and share buckets, and one past ``refresh`` that
    re-sums the tree, every id's log q equals that of a walk's tree built from the final weights."""
    made = sampler(kind, True, device=device, tree_update="paths")
    made.tree.store.refresh = 3
    use_backend(made, "fixed")
    weight = made.tree.store.weight.clone()
    gen = torch.Generator().manual_seed(5)
    query = torch.randn(5, 6, generator=gen).to(device)
    ids = torch.randint(0, 300, (5, 9), generator=gen).to(device)
    assert made.tree.backend.tree_update.by_paths(6)
    for round_ in range(4):
        changed = torch.tensor([7, 8, 7, 120 + round_, 299, 8])  # repeats, and rows of one bucket (leaf size 4)
        weight[changed.to(device)] += 0.2 * torch.randn(changed.numel(), 6, generator=gen).to(device)
        made.update(weight, changed.to(device))  # by paths but the 3rd, which recomputes every leaf and re-sums
        assert made.tree.store.updates == (round_ + 1) % 3
        expected = sampler(kind, True, device=device)
        expected.update(weight)  # a tree built from the final weights
        log_q = made.propose(query).log_q(ids)
        torch.testing.assert_close(log_q, expected.propose(query).log_q(ids), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["rff", "quadratic"])
def test_path_deltas_drift_no_more_than_a_re_sum_over_real_training(kind):
    """63 SGD steps of batch-shared training (the most updates between two refreshes) with each tree update: the
    sampler's log q then against the same tree rebuilt from its weights. The path deltas round at every ancestor
    (the root takes 800 adds a step) where a re-sum rounds only at the leaves; both stay within 1e-3 nats (the
    paths' rounding differs between CPUs' vector widths: 3e-4 on some; a wrong delta drifts by whole nats)."""
    from lab.step_fixture import step_fixture

    drift = {}
    for mode in ("paths", "resum"):
        overrides = [f"output={kind}", "output.shared_negatives=true", "step_forms=gpu"]
        overrides += [f"sampler.tree_update={mode}"]
        overrides += ["model.emb_dim=16", "model.hidden_dim=16", *(["sampler.D=64"] if kind == "rff" else [])]
        fixture = step_fixture(overrides, 20_000, 63)
        output, state = fixture.module.output, None
        assert output.sampler.tree.backend.tree_update.by_paths(800) == (mode == "paths")
        for batch in fixture.batches:
            window = fixture.step(batch, state)
            state = tuple(s.detach() for s in window.state)
        with torch.no_grad():
            query = output.query(window.hidden)
            ids = torch.randint(0, 20_000, (query.shape[0], 50), generator=torch.Generator().manual_seed(1))
            kept = output.sampler.propose(query).log_q(ids)
            output.sampler.tree.rebuild(output.sampler.tree.store.weight)
            drift[mode] = (kept - output.sampler.propose(query).log_q(ids)).abs().max().item()
    assert drift["paths"] < 1e-3 and drift["resum"] < 1e-3, drift


@pytest.mark.parametrize(("output", "extra"), CASES, ids=CASE_IDS)
def test_two_training_steps_in_a_gpus_forms_equal_a_cpus(output, extra):
    """Every strategy in the forms it takes on a GPU (the kernel tree's fixed backend, adaptive's fixed shapes; here
    on the CPU) trains as in a CPU's: two steps on the same windows and forced negatives give the same losses and
    weights (a backend that skipped the forced draw, dropped a log q correction or updated a tree differently would
    not)."""
    cfg = config(output, extra)
    assert_same_steps(two_steps(cfg, "cpu", gpu_forms=True), two_steps(cfg, "cpu", gpu_forms=False))


@pytest.mark.parametrize(
    ("overrides", "on_cuda", "fixed"),
    [
        ("trainer.accelerator=cpu", True, False),
        ("trainer.accelerator=gpu", True, True),
        ("trainer.accelerator=cuda", True, True),
        ("trainer.accelerator=auto", True, True),
        ("trainer.accelerator=auto", False, False),  # no CUDA GPU here: Lightning trains on the CPU
        ("trainer.accelerator=mps", True, False),
        ("trainer.accelerator=cpu step_forms=gpu", False, True),  # forced: a GPU's forms on the CPU
        ("trainer.accelerator=gpu step_forms=cpu", True, False),
    ],
)
def test_the_step_forms_are_decided_once_from_the_config_and_reach_every_part(overrides, on_cuda, fixed, monkeypatch):
    """``step_forms=auto`` takes a GPU's forms where the run trains on a CUDA GPU (``trainer.accelerator``, as
    Lightning picks it), ``cpu`` or ``gpu`` forces them on any machine; the decision reaches the kernel tree (its
    backend, unless ``sampler.backend`` forces one) and the adaptive softmax's loss."""
    from lmtrain.run.build import build_module, step_forms

    monkeypatch.setattr(torch.cuda, "is_available", lambda: on_cuda)
    assert step_forms(config("rff", overrides)).fixed_shapes == fixed
    kernel = build_module(config("rff", overrides), VOCAB, synthetic_counts(VOCAB), None)
    assert kernel.output.sampler.tree.backend.name == ("fixed" if fixed else "walk")
    forced = build_module(config("rff", f"{overrides} sampler.backend=walk"), VOCAB, synthetic_counts(VOCAB), None)
    assert forced.output.sampler.tree.backend.name == "walk"  # sampler.backend overrides the forms
    adaptive = build_module(config("adaptive", overrides), VOCAB, synthetic_counts(VOCAB), None)
    assert adaptive.output.forms.fixed_shapes == fixed


def test_the_tools_decide_the_forms_by_the_device_they_run_on(monkeypatch):
    """A tool names the device it runs a trained model on (``build_module(..., device=...)``): a GPU's forms there on
    a CUDA GPU, a CPU's on the CPU, whatever accelerator the run trained with; a forced ``step_forms`` still holds."""
    from lmtrain.run.build import step_forms

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert not step_forms(config("rff", "trainer.accelerator=gpu"), "cpu").fixed_shapes
    assert step_forms(config("rff", "trainer.accelerator=cpu"), "cuda").fixed_shapes
    assert step_forms(config("rff", "step_forms=gpu"), "cpu").fixed_shapes


def test_the_kernel_trees_modules_import_no_cycle_and_neither_backend_the_other():
    """Each module of ``sampler/kernel/`` imports only modules below it (imports inside functions and under
    TYPE_CHECKING count: the fixed update and the store once imported each other that way), and the two backends
    meet only in the tree that holds one."""
    root = Path(__file__).resolve().parents[1] / "lmtrain" / "sampler" / "kernel"
    graph: dict[str, set[str]] = {p.stem: set() for p in root.glob("*.py") if p.stem != "__init__"}
    for name in graph:
        for node in ast.walk(ast.parse((root / f"{name}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lmtrain.sampler.kernel."):
                graph[name].add(node.module.rsplit(".", 1)[1])

    def below(name: str, path: tuple[str, ...] = ()) -> set[str]:
        assert name not in path, f"import cycle: {' -> '.join((*path, name))}"
        return set().union(*({dep} | below(dep, (*path, name)) for dep in graph[name]))

    assert "fixed_backend" not in below("walk_backend") and "walk_backend" not in below("fixed_backend")
    assert {"walk_backend", "fixed_backend", "backend"} <= below("tree")

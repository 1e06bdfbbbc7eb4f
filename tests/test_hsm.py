"""Hierarchical softmax: exact normalization, Huffman optimality, tree structure, gradients, sparse rows."""

from __future__ import annotations

import heapq
import math
from collections import Counter

import numpy as np
import pytest
import torch

from lmtrain.config import ConfigError, compose_config
from lmtrain.output import HierarchicalSoftmax
from lmtrain.output.trees import TreePaths, balanced_tree, huffman_tree, two_level_tree
from lmtrain.run.build import build_output
from lmtrain.training.optim import build_optimizer
from tests.conftest import SHARED_DATA, make_config

TREES = ["huffman", "balanced", "two_level"]


def zipf_counts(n: int, seed: int = 0) -> torch.Tensor:
    """Descending Zipf-like counts with some noise and a few zeros at the tail."""
    g = torch.Generator().manual_seed(seed)
    counts = (1000.0 / torch.arange(1, n + 1) * (1 + 0.3 * torch.rand(n, generator=g))).floor().long()
    return counts.sort(descending=True).values


def make_hsm(tree: str, n: int, d: int, init_range: float = 1.0, **kw: object) -> HierarchicalSoftmax:
    torch.manual_seed(0)
    return HierarchicalSoftmax(n, d, zipf_counts(n), tree=tree, init_range=init_range, **kw).double()


def all_class_log_probs(output: HierarchicalSoftmax, hidden: torch.Tensor) -> torch.Tensor:
    """(N, d) -> (N, n) via log_prob on every (position, class) pair."""
    n, rows = output.num_classes, hidden.shape[0]
    h = hidden.repeat_interleave(n, dim=0)  # (N n, d)
    c = torch.arange(n).repeat(rows)  # (N n,)
    return output.log_prob(h, c).reshape(rows, n)


def reference_huffman_lengths(weights: list[float]) -> list[int]:
    """Textbook heapq Huffman: merge the two lightest subtrees until one is left; depth = code length."""
    heap = [(w, i, [i]) for i, w in enumerate(weights)]
    heapq.heapify(heap)
    lengths = [0] * len(weights)
    tie = len(weights)
    while len(heap) > 1:
        w1, _, a = heapq.heappop(heap)
        w2, _, b = heapq.heappop(heap)
        for leaf in a + b:
            lengths[leaf] += 1
        heapq.heappush(heap, (w1 + w2, tie, a + b))
        tie += 1
    return lengths


def check_is_binary_tree(paths: TreePaths) -> None:
    """Every path starts at the root, consecutive nodes are parent -> child, and codes are prefix-free."""
    nodes, signs, mask = paths.nodes.numpy(), paths.signs.numpy(), paths.mask.numpy()
    child_of: dict[tuple[int, int], object] = {}
    for c in range(nodes.shape[0]):
        length = int(mask[c].sum())
        assert mask[c, :length].all() and not mask[c, length:].any()
        assert length >= 1 and nodes[c, 0] == 0
        steps = list(zip(nodes[c, :length].tolist(), signs[c, :length].tolist(), strict=True))
        targets = [n for n, _ in steps[1:]] + [("leaf", c)]
        for step, child in zip(steps, targets, strict=True):
            assert child_of.setdefault(step, child) == child  # one child per (node, branch)
    assert len(child_of) == 2 * paths.num_nodes  # every internal node has exactly two children
    assert {n for n, _ in child_of} == set(range(paths.num_nodes))


@pytest.mark.parametrize("tree", TREES)
@pytest.mark.parametrize("n", [2, 37])
def test_probabilities_over_all_classes_sum_to_one(tree, n):
    output = make_hsm(tree, n, d=8, num_bins=6 if tree == "two_level" and n > 6 else None)
    hidden = torch.randn(5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        log_p = all_class_log_probs(output, hidden)  # (5, n)
    torch.testing.assert_close(log_p.exp().sum(1), torch.ones(5, dtype=torch.float64), rtol=0, atol=1e-12)
    assert log_p.max() < 0 and log_p.std() > 0.1  # a real, non-uniform distribution


@pytest.mark.parametrize("tree", TREES)
def test_loss_is_the_mean_nll_and_every_class_scores_alike_in_both_paths(tree):
    """The training loss is -mean log p(target) of the exact distribution, and ``log_probs_all`` (all classes at
    once, for evaluation and generation) equals ``log_prob`` class by class. Binary trees: log p(c | h) is the
    sum over c's path of log sigmoid(sign * ([h, 1] . row)), computed here from the tree's paths with a loop."""
    n, d = 37, 6
    output = make_hsm(tree, n, d=d, num_bins=6 if tree == "two_level" else None)
    gen = torch.Generator().manual_seed(2)
    hidden = torch.randn(5, d, dtype=torch.float64, generator=gen)
    target = torch.randint(n, (5,), generator=gen)
    with torch.no_grad():
        every = output.log_probs_all(hidden)  # (5, n)
        torch.testing.assert_close(every, all_class_log_probs(output, hidden), rtol=0, atol=1e-12)
        loss = output.loss(hidden, target)
    torch.testing.assert_close(loss, -every.gather(1, target[:, None]).mean(), rtol=0, atol=1e-12)
    if tree == "two_level":
        return
    paths = (huffman_tree if tree == "huffman" else balanced_tree)(zipf_counts(n))  # as make_hsm builds it
    weight = output.weight.detach()
    for row in range(5):
        query = torch.cat([hidden[row], torch.ones(1, dtype=torch.float64)])
        for c in range(n):
            expected = sum(
                math.log(
                    1 / (1 + math.exp(-int(paths.signs[c, step]) * float(query @ weight[int(paths.nodes[c, step])])))
                )
                for step in range(int(paths.mask[c].sum()))
            )
            assert float(every[row, c]) == pytest.approx(expected, rel=1e-10, abs=1e-12)


def test_huffman_code_lengths_match_the_textbook_example():
    # CLRS 16.3: a:45 b:13 c:12 d:16 e:9 f:5 -> a=0, b=101, c=100, d=111, e=1101, f=1100
    paths = huffman_tree(torch.tensor([45, 13, 12, 16, 9, 5]))
    assert paths.mask.sum(1).tolist() == [1, 3, 3, 3, 4, 4]
    check_is_binary_tree(paths)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_huffman_code_lengths_match_a_reference_construction(seed):
    rng = np.random.default_rng(seed)
    weights = (rng.pareto(1.0, size=300) * 100 + 1).tolist()  # distinct real weights: a unique Huffman tree
    paths = huffman_tree(torch.tensor(weights, dtype=torch.float64))
    assert paths.mask.sum(1).tolist() == reference_huffman_lengths(weights)
    check_is_binary_tree(paths)
    assert sum(2.0**-length for length in paths.mask.sum(1).tolist()) == pytest.approx(1.0)  # Kraft equality


@pytest.mark.parametrize("n", [2, 3, 8, 37, 1000])
def test_balanced_tree_depths_and_frequent_classes_shallower(n):
    counts = torch.randperm(n, generator=torch.Generator().manual_seed(n))  # unordered counts
    paths = balanced_tree(counts)
    depth = paths.mask.sum(1)
    assert set(depth.tolist()) <= {math.floor(math.log2(n)), math.ceil(math.log2(n))}
    assert (depth[counts.argsort(descending=True)].diff() >= 0).all()  # more frequent -> never deeper
    check_is_binary_tree(paths)


def test_two_level_bins_are_frequency_ranges_of_about_sqrt_n():
    counts = torch.randperm(1000, generator=torch.Generator().manual_seed(0))
    bins = two_level_tree(counts)
    assert bins.num_bins == round(math.sqrt(1000))
    rank = counts.argsort(descending=True)
    flat = bins.members[bins.member_mask]  # real members in bin order
    assert torch.equal(flat, rank)  # bin 0 holds the most frequent classes, and so on
    assert torch.equal(bins.members[bins.bin_of, bins.offset], torch.arange(1000))
    with pytest.raises(ValueError, match="num_bins"):
        two_level_tree(counts, num_bins=0)


def test_huffman_expected_code_length_on_ptb_is_within_one_bit_of_the_entropy():
    path = SHARED_DATA / "ptb" / "train.txt"
    if not path.is_file():
        pytest.skip(f"{path} not found (set LMTRAIN_DATA_DIR)")
    with path.open() as f:
        freq = Counter(w for line in f for w in [*line.split(), "<eos>"])
    assert len(freq) == 10_000
    counts = torch.tensor(sorted(freq.values(), reverse=True), dtype=torch.float64)
    p = counts / counts.sum()
    entropy = float(-(p * p.log2()).sum())
    lengths = huffman_tree(counts).mask.sum(1).double()
    expected_length = float((p * lengths).sum())
    print(
        f"\nPTB train: unigram entropy H = {entropy:.4f} bits, Huffman expected path length L = "
        f"{expected_length:.4f} bits (max depth {int(lengths.max())})"
    )
    assert entropy <= expected_length < entropy + 1


@pytest.mark.parametrize("tree", TREES)
def test_gradients_match_finite_differences(tree):
    output = make_hsm(tree, n=11, d=3, num_bins=3 if tree == "two_level" else None)
    gen = torch.Generator().manual_seed(2)
    hidden = torch.randn(6, 3, dtype=torch.float64, generator=gen).requires_grad_()
    target = torch.randint(11, (6,), generator=gen)
    output.loss(hidden, target).backward()
    assert output.weight.grad.is_sparse
    analytic = [output.weight.grad.to_dense(), hidden.grad]
    eps = 1e-6
    for param, grad in zip([output.weight, hidden], analytic, strict=True):
        flat = param.data.view(-1)
        numeric = torch.zeros_like(flat)
        for i in range(flat.numel()):
            old = flat[i].item()
            flat[i] = old + eps
            up = output.loss(hidden, target).item()
            flat[i] = old - eps
            down = output.loss(hidden, target).item()
            flat[i] = old
            numeric[i] = (up - down) / (2 * eps)
        torch.testing.assert_close(grad.reshape(-1), numeric, rtol=1e-6, atol=1e-8)
    assert analytic[0].abs().sum() > 0 and analytic[1].abs().sum() > 0


@pytest.mark.parametrize("tree", TREES)
def test_a_step_touches_only_the_rows_on_the_target_paths(tree):
    output = make_hsm(tree, n=200, d=4)
    gen = torch.Generator().manual_seed(3)
    hidden = torch.randn(7, 4, dtype=torch.float64, generator=gen)
    target = torch.randint(200, (7,), generator=gen)
    output.loss(hidden, target).backward()
    touched = set(output.weight.grad.coalesce().indices()[0].tolist())
    if tree == "two_level":
        bins = output.layout.bin_of[target]
        expected = set(output.layout.members[bins].reshape(-1).tolist()) | set(output.layout.bin_rows.tolist())
    else:
        expected = set(output.layout.nodes[target][output.layout.mask[target]].tolist())
    assert touched == expected
    assert len(touched) < output.weight.shape[0] // 2


@pytest.mark.parametrize("tree", TREES)
def test_sparse_sgd_steps_lower_the_loss_and_only_weights_are_saved(tree):
    output = make_hsm(tree, n=50, d=6, init_range=0.1)
    gen = torch.Generator().manual_seed(4)
    hidden = torch.randn(32, 6, dtype=torch.float64, generator=gen)
    target = torch.randint(50, (32,), generator=gen)
    optimizer = build_optimizer("sgd", [], output.sparse_parameters(), lr=0.5)
    first = output.loss(hidden, target).item()
    for _ in range(20):
        optimizer.zero_grad(set_to_none=True)
        output.loss(hidden, target).backward()
        optimizer.step()
        output.after_optimizer_step()
    assert output.loss(hidden, target).item() < first - 0.5
    assert list(output.state_dict()) == ["weight"]  # the tree is derived from counts, never saved
    fresh = make_hsm(tree, n=50, d=6)
    fresh.load_state_dict(output.state_dict())
    torch.testing.assert_close(fresh.log_prob(hidden, target), output.log_prob(hidden, target))


def test_config_builds_every_tree_and_rejects_a_bad_one():
    counts = zipf_counts(100)
    for tree in TREES:
        cfg = make_config(["~data", "output=hsm", f"output.tree={tree}"])
        output = build_output(cfg, 100, 16, counts)
        assert isinstance(output, HierarchicalSoftmax) and output.tree == tree
        assert output.sparse_parameters() == [output.weight]
    depth = build_output(make_config(["~data", "output=hsm"]), 100, 16, counts).path_lengths()
    assert depth[0] < depth[-1]  # Huffman by default: frequent classes get short codes
    with pytest.raises(ConfigError, match=r"output\.tree must be one of 'huffman', 'balanced', 'two_level'"):
        compose_config(["output=hsm", "output.tree=binary"])  # the schema's check, before anything is built
    with pytest.raises(ValueError, match="counts"):
        HierarchicalSoftmax(100, 16, counts[:50])


@pytest.mark.parametrize("tree", TREES)
def test_sparse_flag_decides_the_gradient_layout_and_the_sparse_parameters(tree):
    """Sparse row gradients by default (SparseAdam / sparse SGD need them); ``sparse=False`` gives a dense one."""
    kw = {"num_bins": 3} if tree == "two_level" else {}
    hidden, target = torch.randn(5, 3, dtype=torch.float64), torch.arange(5)
    default = make_hsm(tree, n=11, d=3, **kw)
    default.loss(hidden, target).backward()
    assert default.weight.grad.is_sparse and default.sparse_parameters() == [default.weight]
    dense = make_hsm(tree, n=11, d=3, sparse=False, **kw)
    dense.loss(hidden, target).backward()
    assert not dense.weight.grad.is_sparse and dense.sparse_parameters() == []
    torch.testing.assert_close(dense.weight.grad, default.weight.grad.to_dense())  # same numbers, other layout


def test_two_level_takes_the_configured_number_of_bins():
    """``output.num_bins`` reaches the layout: 2 bins of 6 classes for n = 11, not the default round(sqrt(11)) = 3."""
    output = make_hsm("two_level", n=11, d=3, num_bins=2)
    assert output.layout.num_bins == 2 and output.weight.shape[0] == 11 + 2
    assert make_hsm("two_level", n=11, d=3).layout.num_bins == 3

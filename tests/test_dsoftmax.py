"""The differentiated softmax (``output=dsoftmax``) against the dense softmax over its zero-padded (n, d) matrix, its
derived blocks, its cost, and its refusals."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from lmtrain.config import ConfigError, compose_config
from lmtrain.output.dsoftmax import DifferentiatedSoftmax, block_layout, cost_ratio
from lmtrain.output.full import FullSoftmax
from lmtrain.run.build import build_output
from tests.cli_runs import TINY, run_cli
from tests.command_line import refusal

# the tiny case: 13 classes in 3 blocks [0, 3), [3, 7), [7, 13) of widths 3, 2, 1 (hidden size 6)
N_CLASSES, DIM, CUTOFFS, WIDTHS = 13, 6, [3, 7], [3, 2, 1]


def tiny(**options) -> DifferentiatedSoftmax:
    torch.manual_seed(0)
    layer = DifferentiatedSoftmax(N_CLASSES, DIM, cutoffs=CUTOFFS, widths=WIDTHS, init_range=0.8, **options).double()
    with torch.no_grad():
        layer.bias.normal_()  # other biases per class, so a bias read at the wrong class shows
    return layer


def padded(layer: DifferentiatedSoftmax) -> torch.Tensor:
    """The equivalent (n, d) output matrix, written out entry by entry: block k's rows hold W_k in its own columns
    (the hidden slice it reads), zeros elsewhere. Differentiable in the blocks' weights."""
    rows = []
    for c in range(N_CLASSES):
        k = sum(c >= cut for cut in CUTOFFS)  # the block of class c
        start, offset = [0, *CUTOFFS][k], sum(WIDTHS[:k])
        row = [torch.zeros((), dtype=torch.float64) for _ in range(DIM)]
        for j in range(WIDTHS[k]):
            row[offset + j] = layer.weights[k][c - start, j]
        rows.append(torch.stack(row))
    return torch.stack(rows)  # (n, d)


def dense_log_probs(layer: DifferentiatedSoftmax, hidden: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(hidden @ padded(layer).T + layer.bias, dim=1)  # (N, n)


@pytest.mark.parametrize("eval_chunk", [65536, 2])  # the blocks side by side / chunks of 2 classes per block
def test_log_probs_and_loss_equal_a_dense_softmax_over_the_padded_matrix(eval_chunk):
    layer = tiny(eval_chunk=eval_chunk)
    hidden = torch.randn(40, DIM, dtype=torch.float64)
    target = torch.arange(40) % N_CLASSES  # every class, every block
    with torch.no_grad():
        expected = dense_log_probs(layer, hidden)  # (N, n)
        torch.testing.assert_close(layer.log_probs_all(hidden), expected)
        torch.testing.assert_close(layer.log_prob(hidden, target), expected[torch.arange(40), target])
        torch.testing.assert_close(layer.loss(hidden, target), -expected[torch.arange(40), target].mean())
    assert layer.loss_is_nll


def test_gradients_equal_the_padded_references_and_a_block_reaches_only_its_slice():
    layer = tiny()
    hidden = torch.randn(30, DIM, dtype=torch.float64, requires_grad=True)
    target = torch.randint(N_CLASSES, (30,), generator=torch.Generator().manual_seed(3))
    layer.loss(hidden, target).backward()
    got = [hidden.grad.clone(), *(w.grad.clone() for w in layer.weights), layer.bias.grad.clone()]
    hidden.grad = None
    layer.zero_grad()
    F.nll_loss(dense_log_probs(layer, hidden), target).backward()  # autograd through the padded matrix
    expected = [hidden.grad, *(w.grad for w in layer.weights), layer.bias.grad]
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e)
    offsets = [0, 3, 5, 6]
    for k, (start, end) in enumerate([(0, 3), (3, 7), (7, 13)]):
        hidden.grad = None
        layer.logits(hidden)[:, start:end].pow(2).sum().backward()  # block k's logits alone
        outside = torch.ones(DIM, dtype=torch.bool)
        outside[offsets[k] : offsets[k + 1]] = False
        assert hidden.grad[:, ~outside].abs().sum() > 0 and not hidden.grad[:, outside].any(), k


def test_one_block_is_the_full_softmax():
    torch.manual_seed(1)
    layer = DifferentiatedSoftmax(N_CLASSES, DIM, cutoffs=[], widths=[DIM])
    full = FullSoftmax(N_CLASSES, DIM)
    full.load_state_dict({"weight": layer.weights[0].detach(), "bias": torch.randn(N_CLASSES)})
    layer.bias.data.copy_(full.bias.data)
    hidden = torch.randn(8, DIM)
    with torch.no_grad():
        torch.testing.assert_close(layer.log_probs_all(hidden), full.log_probs_all(hidden))


@pytest.mark.parametrize(("n", "ratio"), [(10_000, 0.30), (33_278, 0.1626)])  # the numbers in docs/strategies.md
def test_the_default_blocks_at_ptb_and_wikitext2_sizes_save_multiply_adds(n, ratio):
    cutoffs, widths = block_layout(n, 200)
    assert sum(widths) == 200 and all(w >= 1 for w in widths) and len(widths) == len(cutoffs) + 1
    assert cutoffs == sorted(set(cutoffs)) and cutoffs[0] >= 1 and cutoffs[-1] < n
    assert widths == sorted(widths, reverse=True) and widths[0] == 100  # the frequent words the widest
    assert cost_ratio(n, 200) == pytest.approx(ratio, abs=5e-5) and cost_ratio(n, 200) < 0.5
    assert DifferentiatedSoftmax(n, 200).multiply_adds == round(cost_ratio(n, 200) * n * 200)


def test_scoring_every_class_costs_the_blocks_multiply_adds_not_n_d():
    """The products that log_probs_all and log_prob run: 2 sum(n_k d_k) flops per position (a padded (n, d) product
    would be 2 n d), counted by torch's own flop counter."""
    layer = tiny()
    hidden, target = torch.randn(5, DIM, dtype=torch.float64), torch.arange(5)
    assert layer.multiply_adds == 3 * 3 + 4 * 2 + 6 * 1 < N_CLASSES * DIM
    for score in (lambda: layer.log_probs_all(hidden), lambda: layer.log_prob(hidden, target)):
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            score()
        assert counter.get_total_flops() == 2 * 5 * layer.multiply_adds


def test_derived_blocks_fit_small_models():
    """The halved widths keep >= 1 dimension: fewer blocks for a narrow hidden state or a small vocabulary."""
    assert block_layout(60, 8) == ([12, 36], [4, 2, 2])
    assert block_layout(13, 2) == ([3], [1, 1])
    assert block_layout(2, 1) == ([], [1])
    assert block_layout(13, 6, cutoffs=[3, 7]) == ([3, 7], [3, 1, 2])
    assert block_layout(10_000, 200, widths=[150, 50]) == ([2000], [150, 50])


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"widths": [3, 2, 2]}, r"output\.widths must sum to the hidden size 6, got \[3, 2, 2\]"),
        ({"widths": [6, 0]}, r"output\.widths must be one width >= 1 per block"),
        ({"widths": []}, r"output\.widths must be one width >= 1 per block"),
        ({"cutoffs": [7, 3]}, r"output\.cutoffs must be strictly increasing"),
        ({"cutoffs": [3, 3]}, r"output\.cutoffs must be strictly increasing"),
        ({"cutoffs": [0, 3]}, r"output\.cutoffs must be strictly increasing"),
        ({"cutoffs": [3, 13]}, r"output\.cutoffs must lie below the vocabulary size 13"),
        ({"cutoffs": [3, 7], "widths": [4, 2]}, r"output\.widths has 2 entries but output\.cutoffs makes 3 blocks"),
        ({"cutoffs": [1, 2, 3, 4]}, r"halving the hidden size 6 leaves a block no dimension"),
        ({"widths": [1, 1, 1, 1, 1, 1]}, r"13 classes give only 3 derived blocks; set output\.cutoffs"),
    ],
)
def test_bad_blocks_raise_one_sentence_naming_the_key(options, match):
    with pytest.raises(ValueError, match=match) as err:
        DifferentiatedSoftmax(N_CLASSES, DIM, **options)
    assert len(str(err.value).splitlines()) == 1


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["output.cutoffs=[7,3]"], r"output\.cutoffs must be strictly increasing"),
        (["output.widths=[100,0]"], r"output\.widths must be one width >= 1"),
        (["output.cutoffs=[10,20]", "output.widths=[100,100]"], r"output\.widths has 2 entries but output\.cutoffs"),
    ],
)
def test_the_config_check_refuses_bad_blocks_before_anything_is_built(args, match, tmp_path, monkeypatch, capsys):
    with pytest.raises(ConfigError, match=match):
        compose_config(["output=dsoftmax", *args])
    assert refusal(["output=dsoftmax", *args], tmp_path, monkeypatch, capsys)  # one line, exit 2, nothing written


def test_widths_that_miss_the_hidden_size_stop_the_command_line_with_one_line(tmp_path):
    result = run_cli([*TINY, "output=dsoftmax", "output.widths=[8,4]"], tmp_path, check=False)
    assert result.returncode == 2, result.stderr[-3000:]
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("lmtrain: error: output.widths must sum to the hidden size"), line


def test_tying_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    with pytest.raises(ConfigError, match="model.tie_weights=true cannot apply to output=dsoftmax: .*widths") as err:
        compose_config(["data=synthetic", "output=dsoftmax", "model.tie_weights=true"])  # checked as composed
    assert len(str(err.value).splitlines()) == 1
    line = refusal(["output=dsoftmax", "model.tie_weights=true"], tmp_path, monkeypatch, capsys)
    assert line.startswith("model.tie_weights=true cannot apply to output=dsoftmax")


def test_built_from_a_config_with_log_unigram_biases():
    counts = torch.arange(60, 0, -1).float() * 10
    layer = build_output(compose_config(["output=dsoftmax", "output.bias_init=log_unigram"]), 60, 8, counts)
    smoothed = counts.double() + 1
    torch.testing.assert_close(layer.bias.detach().double(), (smoothed / smoothed.sum()).log(), rtol=1e-6, atol=1e-6)
    assert [tuple(w.shape) for w in layer.weights] == [(12, 4), (24, 2), (24, 2)]

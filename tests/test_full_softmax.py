"""The full softmax: exact log-probabilities, and the chunked training loss equal to the dense one."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from lmtrain.config import ConfigError
from lmtrain.model import LSTMEncoder
from lmtrain.output import FullSoftmax, chunked_softmax
from lmtrain.training.step import window_loss
from tests.conftest import make_config


def test_log_prob_matches_direct_log_softmax_and_is_chunk_invariant():
    torch.manual_seed(0)
    out = FullSoftmax(num_classes=37, dim=8, init_range=0.5)
    torch.nn.init.normal_(out.bias)
    hidden, target = torch.randn(11, 8), torch.randint(0, 37, (11,))
    direct = F.log_softmax(hidden @ out.weight.T + out.bias, dim=1).gather(1, target[:, None])[:, 0]
    torch.testing.assert_close(out.log_prob(hidden, target), direct)
    out.eval_chunk = 5  # 8 chunks, the last one partial
    torch.testing.assert_close(out.log_prob(hidden, target), direct)
    torch.testing.assert_close(out.loss(hidden, target), -direct.mean())


@pytest.mark.parametrize("eval_chunk", [65536, 5])  # one logits matrix (gather) / 8 chunks and a row gather
def test_log_prob_gradients_equal_the_dense_log_softmax(eval_chunk):
    """What dynamic evaluation steps on: d log p / d (hidden, weight, bias) of both forms of ``log_prob``. A
    target gathered from the wrong row or column of the logits, or a normalizer without the bias, fails."""
    torch.manual_seed(0)
    out = FullSoftmax(num_classes=37, dim=8, init_range=0.5, eval_chunk=eval_chunk)
    torch.nn.init.normal_(out.bias)
    hidden, target = torch.randn(11, 8, requires_grad=True), torch.randint(0, 37, (11,))
    weights = torch.rand(11)  # a different weight per position: a transposed gather shows
    got = torch.autograd.grad((out.log_prob(hidden, target) * weights).sum(), [hidden, out.weight, out.bias])
    direct = F.log_softmax(hidden @ out.weight.T + out.bias, dim=1).gather(1, target[:, None])[:, 0]
    expected = torch.autograd.grad((direct * weights).sum(), [hidden, out.weight, out.bias])
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e)


def loss_and_grads(out: FullSoftmax, hidden: torch.Tensor, target: torch.Tensor, scale: float = 1.0):
    """The loss (times ``scale``) and the gradients of hidden, weight and bias."""
    out.zero_grad()
    hidden = hidden.detach().clone().requires_grad_(True)
    loss = out.loss(hidden, target) * scale
    loss.backward()
    return loss.detach(), hidden.grad, out.weight.grad, out.bias.grad


def layer_pair(dtype: torch.dtype, num_classes: int = 37, dim: int = 8) -> tuple[FullSoftmax, FullSoftmax]:
    """A dense layer and a chunked copy of it (5 classes per chunk: 37 is not a multiple)."""
    torch.manual_seed(0)
    dense = FullSoftmax(num_classes=num_classes, dim=dim, init_range=2.0, train_chunk=0).to(dtype)
    torch.nn.init.normal_(dense.bias, std=3.0)  # peaked, varied rows: a wrong normalization shows
    chunked = FullSoftmax(num_classes=num_classes, dim=dim, train_chunk=5).to(dtype)
    chunked.load_state_dict(dense.state_dict())
    return dense, chunked


@pytest.mark.parametrize(("dtype", "rtol"), [(torch.float64, 1e-10), (torch.float32, 1e-5)])
@pytest.mark.parametrize("scale", [1.0, 35.0])  # loss_reduction mean, and sum (the caller's x T)
def test_chunked_loss_and_gradients_equal_the_dense_path(dtype, rtol, scale):
    dense, chunked = layer_pair(dtype)
    hidden = torch.randn(23, 8, dtype=dtype)
    target = torch.tensor([3, 3, 3, 36, 0, 4, 5, 35, 36, 3] + [7] * 13)  # repeats; first, last and chunk-edge ids
    for want, got in zip(
        loss_and_grads(dense, hidden, target, scale), loss_and_grads(chunked, hidden, target, scale), strict=True
    ):
        assert got.dtype == want.dtype and not got.is_sparse
        torch.testing.assert_close(got, want, rtol=rtol, atol=rtol * want.abs().max().item())
    assert chunked.sparse_parameters() == []  # dense SGD on the class matrix, as before


def test_only_the_hidden_states_need_a_gradient():
    dense, chunked = layer_pair(torch.float64)
    for layer in (dense, chunked):
        layer.requires_grad_(False)
    hidden, target = torch.randn(9, 8, dtype=torch.float64), torch.randint(0, 37, (9,))
    torch.testing.assert_close(loss_and_grads(chunked, hidden, target)[1], loss_and_grads(dense, hidden, target)[1])


@pytest.mark.parametrize("loss_reduction", ["mean", "sum"])
def test_a_window_through_the_encoder_trains_the_same_with_either_path(loss_reduction):
    dense, chunked = layer_pair(torch.float32, num_classes=50, dim=12)
    torch.manual_seed(1)
    encoder = LSTMEncoder(50, emb_dim=6, hidden_dim=12, num_layers=1)
    batch = torch.randint(0, 50, (4, 5)), torch.randint(0, 50, (4, 5))
    grads = []
    for layer in (dense, chunked):
        encoder.zero_grad()
        window = window_loss(encoder, layer, batch, None, loss_reduction)
        window.objective.backward()
        grads.append((window.objective.detach(), *(p.grad for p in (*encoder.parameters(), *layer.parameters()))))
    for want, got in zip(*grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_bf16_autocast_on_cpu_runs_and_stays_close_to_dense():
    dense, chunked = layer_pair(torch.float32, num_classes=300, dim=16)
    chunked.train_chunk = 64
    hidden, target = torch.randn(40, 16), torch.randint(0, 300, (40,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want, got = loss_and_grads(dense, hidden, target), loss_and_grads(chunked, hidden, target)
    for w, g in zip(want, got, strict=True):
        assert g.dtype == w.dtype and torch.isfinite(g).all()
        assert (g - w).norm() <= 0.02 * w.norm()  # bf16 products on both paths


class ShapeLog(TorchDispatchMode):
    """Every operator's name and the largest element count among its outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        outs = result if isinstance(result, (tuple, list)) else (result,)
        self.ops.append((str(func), max((t.numel() for t in outs if isinstance(t, torch.Tensor)), default=0)))
        return result


def logged_step(num_positions: int, num_classes: int = 1000, chunk: int = 64) -> ShapeLog:
    layer = FullSoftmax(num_classes=num_classes, dim=8, train_chunk=chunk)
    hidden = torch.randn(num_positions, 8, requires_grad=True)
    target = torch.randint(0, num_classes, (num_positions,))
    with ShapeLog() as log:
        layer.loss(hidden, target).backward()
    return log


def test_the_chunked_path_never_builds_the_logit_matrix_and_its_ops_do_not_grow_with_n_positions():
    log = logged_step(50)
    largest = max(size for _, size in log.ops)
    assert largest <= max(50 * 64, 1000 * 8)  # a chunk's logits or the weight gradient, never (N, n) = 50,000
    assert [op for op, _ in logged_step(7).ops] == [op for op, _ in log.ops]  # no loop over positions
    assert not any("nonzero" in op or "unique" in op or "item" in op for op, _ in log.ops)  # no host syncs


def test_the_default_is_dense_for_small_logits_and_chunked_for_large():
    layer = FullSoftmax(num_classes=10_000, dim=8)  # PTB's vocabulary, batch 20 x 35: 27 MiB of logits
    assert layer.loss_chunk(700) >= 10_000
    big = FullSoftmax(num_classes=1, dim=8)
    big.num_classes = 1_000_000  # the rule only reads the size
    assert big.loss_chunk(700) == 128 * 2**20 // (4 * 700)  # on a CPU: 47,934 classes, 21 chunks
    big.logits_mib = 4096.0
    assert big.loss_chunk(700) >= 1_000_000  # a bigger budget: dense again
    big.train_chunk = 0
    assert big.loss_chunk(10**6) >= 1_000_000  # 0: always dense
    big.train_chunk = 1000
    assert big.loss_chunk(1) == 1000


def test_on_a_gpu_the_default_budget_is_a_share_of_the_device_memory(monkeypatch):
    """An 80 GiB GPU: 5 GiB of logits, so 10^6 classes at 700 positions (2.6 GiB) are dense, 4,000 positions are
    chunked; a fraction of 0 takes logits_mib there too. Which bug: a GPU that chunks what fits, 2.3x slower."""
    properties = SimpleNamespace(total_memory=80 * 2**30)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: properties)
    chunked_softmax._cuda_memory_mib.cache_clear()
    try:
        gpu = torch.device("cuda", 0)
        big = FullSoftmax(num_classes=1, dim=8)
        big.num_classes = 1_000_000
        assert big.loss_chunk(700, gpu) >= 1_000_000
        assert big.loss_chunk(4000, gpu) == 5 * 2**30 // (4 * 4000)
        assert big.loss_chunk(700, torch.device("cpu")) == 128 * 2**20 // (4 * 700)
        big.gpu_logits_fraction = 0.0
        assert big.loss_chunk(700, gpu) == 128 * 2**20 // (4 * 700)
    finally:
        chunked_softmax._cuda_memory_mib.cache_clear()


def test_the_config_carries_the_rule_and_refuses_a_negative_chunk():
    output = make_config(["output=full"]).output
    assert output.train_chunk is None and output.logits_mib == 128 and output.gpu_logits_fraction == 1 / 16
    with pytest.raises(ConfigError, match=r"output\.train_chunk must be >= 0"):
        make_config(["output=full", "output.train_chunk=-1"])
    with pytest.raises(ConfigError, match=r"output\.gpu_logits_fraction must be < 1"):
        make_config(["output=full", "output.gpu_logits_fraction=1.5"])


# exact_softmax_nll's two forms on a tiny case: 37 classes of 8 (a weight of 37 x 8 x 4 = 1,184 bytes) at 23
# positions, whose dense logits (3,404 bytes) fit neither budget. The first holds the weight-sized buffer: torch's
# op, row chunks of 13 (two chunks); the second does not: the hand-written form, chunks of 10 classes (four)
TORCH_BUDGET, HAND_BUDGET = 2048 / 2**20, 1000 / 2**20
FORMS = {"torch": TORCH_BUDGET, "hand-written": HAND_BUDGET}
needs_torch_op = pytest.mark.skipif(not chunked_softmax.HAS_TORCH_LINEAR_CE, reason="torch has no linear_cross_entropy")


def written_out_nll(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, target: torch.Tensor):
    """(N,) -log softmax(h W^T + b)[t] from the dense logits, in the inputs' dtype."""
    logits = hidden @ weight.T + (0.0 if bias is None else bias)  # (N, n)
    return -torch.log_softmax(logits, dim=1).gather(1, target[:, None])[:, 0]


@needs_torch_op
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("form", list(FORMS))
def test_both_forms_give_the_dense_nll_and_gradients_in_float64(form, with_bias, reduction):
    torch.manual_seed(0)
    hidden, weight = torch.randn(23, 8, dtype=torch.float64), torch.randn(37, 8, dtype=torch.float64) * 2
    bias = torch.randn(37, dtype=torch.float64) * 3 if with_bias else None
    target = torch.tensor([3, 3, 3, 36, 0, 4, 5, 35, 36, 3] + [7] * 13)  # repeats, first and last ids
    # a non-uniform upstream gradient per row, or a scale of the reduced loss: the gradients must carry it
    upstream = torch.rand(23, dtype=torch.float64) + 0.5 if reduction == "none" else torch.tensor(3.0).double()
    reduce = {"none": lambda x: x, "mean": torch.mean, "sum": torch.sum}[reduction]
    assert chunked_softmax.takes_torch_linear_ce(hidden, weight, FORMS[form]) == (form == "torch")
    found = []
    for loss in (
        lambda h, w, b: reduce(written_out_nll(h, w, b, target)),
        lambda h, w, b: chunked_softmax.exact_softmax_nll(h, w, b, target, FORMS[form], reduction=reduction),
    ):
        leaves = [x.clone().requires_grad_() if x is not None else None for x in (hidden, weight, bias)]
        value = loss(*leaves)
        (value * upstream).sum().backward()
        found.append([value.detach(), *(x.grad for x in leaves if x is not None)])
    want, got = found
    assert got[0].shape == want[0].shape == ((23,) if reduction == "none" else ())
    for w, g in zip(want, got, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


@needs_torch_op
def test_the_rule_takes_torchs_op_only_where_its_weight_buffer_fits_and_products_are_float32_or_wider():
    """docs/bench/linear_ce_cpu.json: torch's op holds one more weight-sized float32 buffer and returns a bfloat16
    input's loss in bfloat16; those cases keep the hand-written form."""
    takes = chunked_softmax.takes_torch_linear_ce
    hidden, weight = torch.randn(23, 8), torch.randn(37, 8)
    assert takes(hidden, weight, TORCH_BUDGET) and takes(hidden.double(), weight.double(), TORCH_BUDGET)
    assert takes(hidden, weight, 37 * 8 * 4 / 2**20)  # the buffer exactly fits
    assert not takes(hidden, weight, (37 * 8 * 4 - 1) / 2**20)  # a byte short
    assert not takes(hidden, weight, TORCH_BUDGET, chunk=5)  # a fixed vocabulary chunk (output.train_chunk)
    assert not takes(hidden.bfloat16(), weight.bfloat16(), TORCH_BUDGET)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not takes(hidden, weight, TORCH_BUDGET)  # float32 inputs, bfloat16 products
    # the record's shapes at output=full's CPU budget (128 MiB): a 10^5 x 200 weight (76 MiB) takes torch's op,
    # a 10^6 x 200 one (763 MiB) the hand-written chunks
    meta = torch.empty(700, 200, device="meta")
    assert takes(meta, torch.empty(10**5, 200, device="meta"), 128.0)
    assert not takes(meta, torch.empty(10**6, 200, device="meta"), 128.0)
    assert chunked_softmax.budget_rows(128.0, 10**5) == 335  # the record's torch_budget rows at 10^5 classes


def spied_forms(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """The forms exact_softmax_nll runs, in call order, each with its chunk: torch's rows, the hand-written classes."""
    calls: list[tuple[str, int]] = []
    torch_op, hand = F.linear_cross_entropy, chunked_softmax.chunked_softmax_nll

    def spied_torch_op(*args, **kwargs):
        calls.append(("torch", kwargs["options"].batch_chunk_size))
        return torch_op(*args, **kwargs)

    def spied_hand(*args):
        calls.append(("hand-written", args[4]))
        return hand(*args)

    monkeypatch.setattr(F, "linear_cross_entropy", spied_torch_op)
    monkeypatch.setattr(chunked_softmax, "chunked_softmax_nll", spied_hand)
    return calls


@needs_torch_op
@pytest.mark.parametrize("form", list(FORMS))
def test_full_trains_through_the_form_the_rule_picks_for_its_budget(monkeypatch, form):
    dense, layer = layer_pair(torch.float64)
    layer.train_chunk, layer.logits_mib = None, FORMS[form]  # chunks from the budget, as by default
    calls = spied_forms(monkeypatch)
    hidden, target = torch.randn(23, 8, dtype=torch.float64), torch.randint(0, 37, (23,))
    for want, got in zip(loss_and_grads(dense, hidden, target), loss_and_grads(layer, hidden, target), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(layer.position_nll(hidden, target), dense.position_nll(hidden, target))
    # the chunks from the budget: 2,048 bytes over 37 x 4 per row, 1,000 bytes over 23 x 4 per class
    assert calls == [{"torch": ("torch", 13), "hand-written": ("hand-written", 10)}[form]] * 2
    with torch.autocast("cpu", dtype=torch.bfloat16):
        layer.float().loss(hidden.float(), target)
    assert calls[-1][0] == "hand-written"  # bfloat16 products: whatever the budget


@needs_torch_op
def test_torchs_form_takes_repeated_calls_on_one_leaf():
    """tests/test_repeated_calls.py's contract on torch's form (the contract's tiny layers go dense): each call
    builds its own graph, so calling ``loss`` again on one leaf gives the same loss and gradients."""
    _, layer = layer_pair(torch.float32)
    layer.train_chunk, layer.logits_mib = None, TORCH_BUDGET
    hidden, target = torch.randn(23, 8, requires_grad=True), torch.randint(0, 37, (23,))
    found = []
    for _ in range(3):
        hidden.grad = None
        layer.zero_grad(set_to_none=True)
        loss = layer.loss(hidden, target)
        loss.backward()
        found.append([loss.detach(), hidden.grad.clone(), layer.weight.grad.clone(), layer.bias.grad.clone()])
    for again in found[1:]:
        for got, first in zip(again, found[0], strict=True):
            torch.testing.assert_close(got, first, rtol=0, atol=0)

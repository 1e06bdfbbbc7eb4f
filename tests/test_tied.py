"""Tied weights (``model.tie_weights``): one matrix for the input embedding and the output's class vectors, its
gradients from both sides in one (sparse) update, every strategy with class vectors training and evaluating exactly,
a kernel tree that follows the input side's rows too, checkpoints with one copy, and the refusals."""

from __future__ import annotations

import copy
import io

import pytest
import torch
import torch.nn.functional as F
from lab.step_fixture import synthetic_counts

from lmtrain.config import ConfigError, compose_config
from lmtrain.output import AbsoluteSampledSoftmax, CosineSampledSoftmax, FullSoftmax
from lmtrain.output.base import changed_rows
from lmtrain.run.build import build_module
from lmtrain.run.run import train
from lmtrain.run_folder.checkpoints import check_compatible
from lmtrain.run_folder.ckpt_path import CheckpointError
from lmtrain.training.step import train_step
from tests.cli_runs import TINY, run_cli

pytestmark = pytest.mark.usefixtures("one_thread")
N = 60  # classes

STRATEGIES = {
    "full": ["output=full"],
    "full_chunked": ["output=full", "output.train_chunk=7"],
    "uniform": ["output=uniform"],
    "unigram": ["output=unigram"],
    "unigram_dense": ["output=unigram", "output.sparse=false"],
    "uniform_shared": ["output=uniform", "output.shared_negatives=true"],
    "bigram": ["output=bigram"],
    "exp": ["output=exp"],
    "inbatch": ["output=sampled", "sampler=inbatch"],
    "rff": ["output=rff", "sampler.D=32"],
    "quadratic": ["output=quadratic"],
    "nce": ["output=nce"],
    "negative": ["output=negative"],
}
SAMPLED = [name for name in STRATEGIES if not name.startswith("full")]


def tied(*overrides: str, n: int = N, emb: int = 8, hidden: int = 8, seed: int = 0, layers: int = 1):
    """A tied module for ``n`` classes with Zipf counts, the training stream ``markov_batches``'."""
    cfg = compose_config(
        ["data=synthetic", f"model.num_layers={layers}", f"model.emb_dim={emb}", f"model.hidden_dim={hidden}"]
        + ["model.tie_weights=true", *overrides]
    )  # checked as composed
    torch.manual_seed(seed)
    counts = synthetic_counts(n)
    stream = torch.cat([x.reshape(-1) for x, _ in markov_batches(20, n)])  # what a bigram proposal counts
    return build_module(cfg, n, counts, stream), cfg


def markov_batches(steps: int, n: int = N, rows: int = 8, cols: int = 10, seed: int = 1):
    """Windows of a chain whose next token is a fixed permutation of the previous one (else uniform, 1 in 5)."""
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(n, generator=gen)
    tokens = [torch.randint(0, n, (rows,), generator=gen)]
    for _ in range(steps * cols):
        keep = torch.rand(rows, generator=gen) < 0.8
        tokens.append(torch.where(keep, perm[tokens[-1]], torch.randint(0, n, (rows,), generator=gen)))
    stream = torch.stack(tokens, 1)  # (rows, steps * cols + 1)
    return [(stream[:, i : i + cols], stream[:, i + 1 : i + cols + 1]) for i in range(0, steps * cols, cols)]


def written_out_log_probs(module, hidden):
    """log softmax over every class, written out with the encoder's input embedding as the class vectors."""
    out = module.output
    emb = module.encoder.tied(torch.arange(out.num_classes))  # (n, d): the input embedding of every class
    if isinstance(out, CosineSampledSoftmax):
        unit = hidden / (hidden.pow(2).sum(1, keepdim=True) + out.norm_eps**2).sqrt()
        return torch.log_softmax(out.tau * (unit @ emb.T) / emb.norm(dim=1), dim=1)
    bias = out.bias if isinstance(out, FullSoftmax) else out.weight[:, -1] if out.has_bias else 0.0
    logits = hidden @ emb.T + bias
    return torch.log_softmax(logits.abs() if isinstance(out, AbsoluteSampledSoftmax) else logits, dim=1)


def test_the_tied_matrix_is_one_parameter_read_by_both_sides():
    module, _ = tied("output=unigram")
    weight = module.output.weight
    assert module.encoder.embedding is None
    assert sum(p is weight for p in module.parameters()) == 1 and weight in module.sparse_parameters()
    assert not any("embedding" in key for key in module.state_dict())
    with torch.no_grad():
        weight[5, :8] = 7.0  # in place: the encoder reads the same storage
    assert torch.equal(module.encoder.tied(torch.tensor([[5]]))[0, 0], torch.full((8,), 7.0))
    optimizer = module.configure_optimizers()["optimizer"]
    assert sum(p is weight for g in optimizer.param_groups for p in g["params"]) == 1


def test_a_tied_models_top_layer_is_emb_dim_wide_only_when_the_sizes_differ():
    module, _ = tied("output=full", emb=6, hidden=10, layers=3)
    assert [layer.hidden_size for layer in module.encoder.lstm.layers] == [10, 10, 6]
    assert module.output.weight.shape == (N, 6)
    hidden, (h, c) = module.encoder(torch.randint(0, N, (2, 3)))
    assert hidden.shape == (2, 3, 6) and h.shape == c.shape == (3, 2, 10)  # the state as one nn.LSTM's
    assert not h[2, :, 6:].any() and h[2, :, :6].abs().sum() > 0  # the narrow top layer: its first entries
    torch.testing.assert_close(h[2, :, :6], hidden[:, -1])  # the top layer's last hidden state is its output
    untied = compose_config(["data=synthetic", "model.emb_dim=6", "model.hidden_dim=10"])
    plain = build_module(untied, N, synthetic_counts(N), None)
    assert isinstance(plain.encoder.lstm, torch.nn.LSTM) and plain.output.weight.shape == (N, 10)
    with pytest.raises(ValueError, match="its own input embedding"):
        plain.encoder.tie(plain.output.embed)


@pytest.mark.parametrize("chunk", [0, 7])
def test_full_softmax_gradients_equal_a_hand_written_tied_model(chunk):
    """Both sides' gradients add up in the one matrix: the hand-written model indexes and multiplies one tensor."""
    module, _ = tied("output=full", f"output.train_chunk={chunk}", emb=6, hidden=10, layers=2)
    enc, out = module.encoder, module.output
    x, y = markov_batches(1)[0]
    hidden, _ = enc(x)
    out.loss(hidden.reshape(-1, 6), y.reshape(-1)).backward()
    grads = {}
    for side in ("both", "output only"):
        emb = out.weight.detach().clone().requires_grad_()
        rows = emb[x] if side == "both" else emb.detach()[x]
        top = copy.deepcopy(enc.lstm).requires_grad_(False)  # the same layers, 6 -> 10 -> 6
        logits = top(rows, None)[0] @ emb.T + out.bias.detach()
        F.cross_entropy(logits.reshape(-1, N), y.reshape(-1)).backward()
        grads[side] = emb.grad
    torch.testing.assert_close(out.weight.grad, grads["both"], atol=1e-6, rtol=1e-5)
    assert not torch.allclose(grads["both"], grads["output only"], atol=1e-6)  # the input side counted


@pytest.mark.parametrize("name", SAMPLED)
def test_sampled_row_gradients_of_both_sides_are_one_gradient(name):
    """The tied step's gradient is the untied step's output gradient plus its embedding's (same draws), and it is
    one sparse gradient (with ``output.sparse``) that names the input rows."""
    module, _ = tied(*STRATEGIES[name], "output.num_samples=4")
    enc, out = module.encoder, module.output
    x, y = markov_batches(1)[0]

    def loss():
        torch.manual_seed(3)
        hidden, _ = enc(x)
        return out.loss(hidden.reshape(-1, 8), y.reshape(-1), x.reshape(-1))

    loss().backward()
    grad = out.weight.grad
    assert grad.is_sparse == out.sparse
    if grad.is_sparse:
        assert set(x.reshape(-1).tolist()) <= set(changed_rows(out.weight).tolist())
    tied_grad, out.weight.grad = grad.to_dense(), None
    own = out.weight.detach()[:, :8].clone().requires_grad_()  # the same step, untied: a copy as the embedding
    enc.tied = lambda tokens: own[tokens]
    loss().backward()
    expected = out.weight.grad.to_dense()
    expected[:, :8] += own.grad
    torch.testing.assert_close(tied_grad, expected, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_every_strategy_with_class_vectors_trains_tied_and_evaluates_exactly(name):
    extra = [] if name.startswith("full") else ["output.num_samples=20"]
    module, cfg = tied(*STRATEGIES[name], *extra, "model.init_range=0.5", emb=16, hidden=24)  # one layer, emb_dim wide
    optimizer = module.configure_optimizers()["optimizer"]
    batches = markov_batches(41)
    held, batches = batches[0], batches[1:]

    def held_nll():
        with torch.no_grad():
            hidden = module.encoder(held[0])[0].reshape(-1, 16)
            log_p = module.output.log_prob(hidden, held[1].reshape(-1))
            expected = written_out_log_probs(module, hidden).gather(1, held[1].reshape(-1, 1))[:, 0]
        torch.testing.assert_close(log_p, expected, atol=1e-5, rtol=1e-5)  # exact evaluation, the tied matrix
        return -log_p.mean().item()

    before = held_nll()
    losses = [train_step(module.encoder, module.output, b, None, optimizer, 5.0, "sum").value for b in batches]
    after = held_nll()
    assert after < before - 0.3, (before, after)
    assert sum(losses[-5:]) < sum(losses[:5]), losses


@pytest.mark.parametrize("kind", ["rff", "quadratic"])
def test_the_kernel_tree_follows_the_rows_the_input_side_changed(kind):
    """After tied steps whose input tokens are rows no target names, the tree equals one rebuilt from the weights
    within float rounding; the same tree with those rows left as they were is far outside that bound (so a tree
    that followed only the output's rows would fail)."""
    extra = ["sampler.D=32"] if kind == "rff" else []
    module, _ = tied(f"output={kind}", *extra, "output.num_samples=2", "sampler.leaf_size=4", "optim.lr=5", n=400)
    out, optimizer = module.output, module.configure_optimizers()["optimizer"]
    gen = torch.Generator().manual_seed(4)
    for _ in range(3):
        x, y = torch.randint(0, 40, (4, 5), generator=gen), torch.randint(200, 400, (4, 5), generator=gen)
        old = out.weight.detach().clone()
        train_step(module.encoder, out, (x, y), None, optimizer, None, "sum")
        tree, weight = out.sampler.tree, out.weight.detach()
        kept = tree.nodes.clone()
        tree.rebuild(weight)
        fresh, scale = tree.nodes.clone(), tree.nodes.abs().max()
        stale = weight.clone()
        inputs = torch.unique(x)
        stale[inputs] = old[inputs]
        tree.rebuild(stale)
        assert (tree.nodes - fresh).abs().max() / scale > 1e-4  # the input rows moved the tree
        assert (kept - fresh).abs().max() / scale < 1e-5
        tree.rebuild(weight)


def test_a_checkpoint_holds_the_tied_matrix_once_and_loads_into_a_tied_model():
    module, cfg = tied("output=rff", "sampler.D=32")
    state = module.state_dict()
    assert sum(value.shape[0] == N for value in state.values() if value.dim() == 2) == 1
    buffer = io.BytesIO()
    torch.save(state, buffer)
    fresh = build_module(cfg, N, synthetic_counts(N), None)  # other random weights until loaded
    fresh.load_state_dict(torch.load(io.BytesIO(buffer.getvalue()), weights_only=True))
    x, y = markov_batches(1)[0]
    with torch.no_grad():
        hidden, loaded = module.encoder(x)[0].reshape(-1, 8), fresh.encoder(x)[0].reshape(-1, 8)
        torch.testing.assert_close(loaded, hidden)  # the encoder reads the loaded matrix
        log_p = fresh.output.log_prob(loaded, y.reshape(-1))
        torch.testing.assert_close(log_p, module.output.log_prob(hidden, y.reshape(-1)))
    saved = {"lmtrain": {"signature": module.signature}}
    with pytest.raises(CheckpointError, match="saved with model.tie_weights=true and this config has") as err:
        check_compatible(saved, {**module.signature, "tied": False}, "run/last.ckpt")
    assert len(str(err.value).splitlines()) == 1
    older = {"lmtrain": {"signature": {k: v for k, v in module.signature.items() if k != "tied"}}}
    check_compatible(older, {**module.signature, "tied": False}, "run/last.ckpt")  # untied before the key


def test_a_tied_run_saves_one_matrix_and_an_untied_config_refuses_its_checkpoint(tiny_config, tmp_path):
    run, other = tmp_path / "tied", tmp_path / "untied"
    overrides = ["model.tie_weights=true", "output=unigram", "trainer.max_steps=3", "test_after_fit=false"]
    train(tiny_config(*overrides, run_dir=run))
    ckpt = run / "checkpoints" / "last.ckpt"
    state = torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]
    assert "output.weight" in state and not any("embedding" in key for key in state)
    with pytest.raises(CheckpointError, match="tie_weights=true and this config has model.tie_weights=false"):
        train(tiny_config("output=unigram", f"ckpt_path={ckpt}", run_dir=other))
    assert not other.exists()


@pytest.mark.parametrize(
    ("output", "why"),
    [("hsm", "no class vectors to tie"), ("adaptive", "tail clusters"), ("charcnn", "character CNN")],
)
def test_outputs_without_class_vectors_refuse_to_tie_in_one_line(output, why):
    with pytest.raises(ConfigError, match=f"model.tie_weights=true cannot apply to output={output}: .*{why}") as err:
        compose_config(["data=synthetic", f"output={output}", "model.tie_weights=true"])  # checked as composed
    assert len(str(err.value).splitlines()) == 1


def test_the_command_line_refuses_a_tied_hsm_with_exit_2_and_writes_nothing(tmp_path):
    result = run_cli([*TINY, "output=hsm", "model.tie_weights=true"], tmp_path, check=False)
    assert result.returncode == 2, result.stderr[-3000:]
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("lmtrain: error: model.tie_weights=true cannot apply to output=hsm")
    assert not (tmp_path / "outputs").exists()

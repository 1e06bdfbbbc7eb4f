"""Dynamic evaluation (lmtrain/tools/dynamic_eval.py): its steps against a hand computation, SGD mode against
torch's SGD, exact causal scoring, the gradient statistics, every strategy through python -m lmtrain.score, the
trained weights untouched on disk and restored in memory, the lr searched on the validation split (and a search or
statistics reused only for the same inputs), and the seeded draws of the training objective."""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf
from torch import nn

from lmtrain.data import batchify
from lmtrain.output.cache import THETAS, ppl, read_stream
from lmtrain.tools import dynamic_eval, score_extras
from lmtrain.tools.dynamic_eval import DynamicEvaluation, DynamicOptions, Method, adapted, gradient_rms, rms_step
from lmtrain.tools.score import main as score_main
from lmtrain.tools.score import score
from lmtrain.tools.score_extras import Computed, describe, extra_log_probs, extras_from, json_ready
from lmtrain.tools.trained import load_trained
from lmtrain.training.step import carry

STRATEGIES = ["full", "unigram", "rff", "nce", "hsm", "adaptive", "bigram"]
CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def fresh_process():
    """Each test starts as a fresh process would: no lr search or gradient statistics kept from another."""
    Computed.forget()
    yield
    Computed.forget()


def segments(stream, size):
    """(inputs, targets) (1, T) of stream in segments of ``size`` predicted tokens."""
    for start in range(0, stream.numel() - 1, size):
        targets = stream[start + 1 : start + size + 1]
        yield stream[start : start + targets.numel()][None], targets[None]


def exact_gradients(module, inputs, targets, state):
    """Written out: the encoder from ``state``, the mean exact -log p of the segment, its gradients."""
    hidden, state = module.encoder(inputs, state)
    log_p = module.output.log_prob(hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1))
    grads = torch.autograd.grad(-log_p.mean(), adapted(module), allow_unused=True)
    grads = [torch.zeros_like(p) if g is None else g.to_dense() for p, g in zip(adapted(module), grads, strict=True)]
    return log_p.detach(), grads, (state[0].detach(), state[1].detach())


def trained_model(trained_run, output="full"):
    run, _ = trained_run(output)
    return load_trained(str(run), [], "cpu").module


def test_the_rms_step_with_its_decay_in_numbers():
    """θ = (1, 2), g = (0.5, -1), θ_0 = (1, -1), RMS = (0.1, 0.4) (mean 0.25), lr 0.1, eps 0.1, decay 1: the rates
    RMS / mean = (0.4, 1.6) clip at 1 / decay = 1; θ - lr g / (RMS + eps) + decay rate (θ_0 - θ) = (0.75, -0.8),
    through the step's factors keep = 1 - pull, anchor = pull θ_0 and scale = -lr / (RMS + eps)."""
    toy = nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        toy.weight.copy_(torch.tensor([[1.0, -1.0]]))
    evaluation = DynamicEvaluation(toy, DynamicOptions(lr=0.1, eps=0.1, decay=1.0), [torch.tensor([[0.1, 0.4]])])
    torch.testing.assert_close(evaluation.keeps[0], torch.tensor([[0.6, 0.0]]))
    torch.testing.assert_close(evaluation.anchors[0], torch.tensor([[0.4, -1.0]]))
    torch.testing.assert_close(evaluation.scales[0], torch.tensor([[-0.5, -0.2]]))
    theta = torch.tensor([[1.0, 2.0]])
    rms_step([theta], [torch.tensor([[0.5, -1.0]])], evaluation.keeps, evaluation.anchors, evaluation.scales)
    torch.testing.assert_close(theta, torch.tensor([[0.75, -0.8]]))


@pytest.mark.parametrize("sparse", [True, False])  # the embedding gradient: sparse rows (the row path) or dense
def test_each_segment_is_scored_then_takes_the_hand_computed_step(trained_run, sparse):
    """Three segments of a trained model: each scored with the weights the segments before left, then
    θ <- θ - lr g / (RMS + eps) + decay min(RMS / mean RMS, 1 / decay) (θ_0 - θ), g of the segment's mean -log p.
    A sparse embedding decays lazily: its rows are compared once every step's decay is applied (``current``), after
    rows that no segment read again have missed steps (the stream's first rows)."""
    module = trained_model(trained_run)
    module.encoder.embedding.sparse = sparse
    hand = copy.deepcopy(module)
    gen = torch.Generator().manual_seed(0)
    rms = [torch.rand(p.shape, generator=gen).pow(3) * 0.01 + 1e-5 for p in adapted(module)]  # some rates clip
    options = DynamicOptions(lr=0.003, decay=0.5, eps=1e-3, segment=4)
    evaluation = DynamicEvaluation(module, options, rms)
    mean = torch.cat([r.reshape(-1) for r in rms]).mean()
    assert any(bool((r / mean > 1 / options.decay).any()) for r in rms)  # the clip matters here
    start = [p.detach().clone() for p in adapted(hand)]
    stream = torch.randint(0, 100, (13,), generator=gen)
    stream[2] = stream[1]  # one input row twice in a segment: a sparse gradient names it twice
    stream[9] = stream[0]  # a row read by the first and the third segment: it missed the second step's decay
    state = hand_state = None
    for inputs, targets in segments(stream, 4):
        log_p, _, state = evaluation((inputs, targets), state)
        expected, grads, hand_state = exact_gradients(hand, inputs, targets, hand_state)
        torch.testing.assert_close(log_p, expected)
        with torch.no_grad():
            for p, g, p0, r in zip(adapted(hand), grads, start, rms, strict=True):
                rate = torch.minimum(r / mean, torch.tensor(1 / options.decay))
                p.copy_(p - options.lr * g / (r + options.eps) + options.decay * rate * (p0 - p))
        for p, q in zip(adapted(module), adapted(hand), strict=True):
            if evaluation.lazy is None or p is not evaluation.lazy.param:
                torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-7)
    embedding, by_hand = module.encoder.embedding.weight, hand.encoder.embedding.weight
    assert (evaluation.lazy is not None) == sparse
    if sparse:  # rows read by the first segment only are behind by the later steps' decay until caught up
        assert not torch.allclose(embedding, by_hand, rtol=1e-5, atol=1e-7)
        evaluation.lazy.current()
    torch.testing.assert_close(embedding, by_hand, rtol=1e-5, atol=1e-7)
    assert not torch.equal(adapted(module)[0], start[0])
    evaluation.restore()
    assert all(torch.equal(p, p0) for p, p0 in zip(adapted(module), start, strict=True))


def test_sgd_mode_is_plain_sgd(trained_run):
    module = trained_model(trained_run)
    hand = copy.deepcopy(module)
    sgd = torch.optim.SGD(adapted(hand), lr=0.5)
    evaluation = DynamicEvaluation(module, DynamicOptions(method="sgd", lr=0.5, segment=3))
    stream, state, hand_state = torch.randint(0, 100, (10,), generator=torch.Generator().manual_seed(3)), None, None
    for inputs, targets in segments(stream, 3):
        log_p, _, state = evaluation((inputs, targets), state)
        expected, grads, hand_state = exact_gradients(hand, inputs, targets, hand_state)
        torch.testing.assert_close(log_p, expected)
        for p, g in zip(adapted(hand), grads, strict=True):
            p.grad = g
        sgd.step()
        for p, q in zip(adapted(module), adapted(hand), strict=True):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-7)


def test_a_training_loss_that_is_the_exact_nll_steps_as_the_exact_objective(trained_run, monkeypatch):
    """objective=train on full (its training loss is the exact NLL) resolves to exact and never calls ``loss``: the
    scores are the exact pass's to the bit. With a self-normalization penalty, or on a sampled softmax, it stays
    train (a different gradient)."""
    module = trained_model(trained_run)
    penalized = load_trained(str(trained_run("full", "synthetic", "output.self_normalize=0.1")[0]), [], "cpu").module
    assert dynamic_eval.resolved(DynamicOptions(objective="train"), module).objective == "exact"
    assert dynamic_eval.resolved(DynamicOptions(objective="train"), penalized).objective == "train"
    assert (
        dynamic_eval.resolved(DynamicOptions(objective="train"), trained_model(trained_run, "unigram")).objective
        == "train"
    )
    stream = torch.randint(0, 100, (16,), generator=torch.Generator().manual_seed(5))
    rms = [torch.full_like(p, 1e-3) for p in adapted(module)]
    scores = {}
    for objective in ("exact", "train"):
        evaluation = DynamicEvaluation(module, DynamicOptions(objective=objective, lr=1e-3, segment=3), rms)
        with monkeypatch.context() as patch:
            patch.setattr(module.output, "loss", lambda *a, **k: pytest.fail("the training loss was computed"))
            scores[objective] = read_stream(evaluation, stream, 1, (), CPU, 3)[0]
        evaluation.restore()
    assert torch.equal(scores["exact"], scores["train"])


def test_a_token_never_changes_its_own_score_or_any_before_it(trained_run):
    """Two streams that differ in the token at target position 12 (segment 10-14): the scores before it are
    equal, later ones differ, and both scores at 12 are the distribution of the model that the first two segments
    left (they read nothing of position 12); cutting the stream after 12 changes no score up to it (beyond the
    rounding of a shorter matmul)."""
    module = trained_model(trained_run)
    rms = [torch.full_like(p, 1e-3) for p in adapted(module)]
    evaluation = DynamicEvaluation(module, DynamicOptions(lr=0.01, segment=5), rms)
    first = torch.randint(0, 100, (24,), generator=torch.Generator().manual_seed(4))
    second = first.clone()
    second[13] = (first[13] + 1) % 100

    def scores(stream):
        log_p, _, _ = read_stream(evaluation, stream, 1, (), CPU, segment=5)
        evaluation.restore()
        return log_p

    a, b = scores(first), scores(second)
    assert torch.equal(a[:12], b[:12]) and not torch.equal(a[12:], b[12:]) and not torch.equal(a[15:], b[15:])
    # the last segment has 3 rows instead of 5: float32 matmuls of other shapes may round differently (an ulp)
    torch.testing.assert_close(scores(first[:14]), a[:13], rtol=0, atol=1e-5)
    state = None
    for inputs, targets in list(segments(first, 5))[:2]:  # the first two segments adapt the model
        _, _, state = evaluation((inputs, targets), state)
    with torch.no_grad():
        hidden, _ = carry(module.encoder, first[None, 10:13], state)
        log_probs = module.output.log_probs_all(hidden).double()  # (3, n): positions 10, 11, 12
    torch.testing.assert_close(a[12], log_probs[2, first[13]])
    torch.testing.assert_close(b[12], log_probs[2, second[13]])


def kernel_log_q(module, ids, seed=8):
    """The rff tree's log q (via its node sums and buckets) of ``ids`` for a few fixed random queries."""
    query = torch.randn(3, module.output.weight.shape[1], generator=torch.Generator().manual_seed(seed))  # (3, d')
    return module.output.sampler.propose(query).log_q(ids.expand(3, -1))  # (3, k)


@pytest.mark.parametrize("proposal", ["trained", "current"])
def test_the_training_objectives_proposal_is_the_trained_tree_or_refreshed(trained_run, proposal):
    """objective=train on rff: with proposal=trained the tree stays the one built from θ_0 (its log q equal a copy of
    the trained model's, and its buckets read a copy, not the moving parameter); with proposal=current it is the
    tree of the adapted weights after every step."""
    module = trained_model(trained_run, "rff")
    trained = copy.deepcopy(module)
    options = DynamicOptions(method="sgd", objective="train", proposal=proposal, lr=0.5, segment=4)
    evaluation = DynamicEvaluation(module, options)
    stream, state = torch.randint(0, 100, (13,), generator=torch.Generator().manual_seed(7)), None
    for inputs, targets in segments(stream, 4):
        _, _, state = evaluation((inputs, targets), state)
    weight = module.output.weight
    assert not torch.allclose(weight, trained.output.weight)  # the steps moved the class vectors
    ids = torch.arange(weight.shape[0])[None]  # every class
    if proposal == "trained":
        assert module.output.sampler.tree.weight.data_ptr() != weight.data_ptr()
        torch.testing.assert_close(kernel_log_q(module, ids), kernel_log_q(trained, ids), rtol=0, atol=0)
    else:
        trained.output.sampler.rebuild(weight.detach().clone())  # a tree built afresh from the adapted weights
        torch.testing.assert_close(kernel_log_q(module, ids), kernel_log_q(trained, ids), rtol=1e-4, atol=1e-5)
        assert not torch.allclose(kernel_log_q(module, ids), kernel_log_q(trained_model(trained_run, "rff"), ids))
    evaluation.restore()  # the parameter itself again, and the tree rebuilt from it
    assert module.output.sampler.tree.weight.data_ptr() == weight.data_ptr()
    torch.testing.assert_close(kernel_log_q(module, ids), kernel_log_q(trained_model(trained_run, "rff"), ids))


@pytest.mark.parametrize("proposal", ["trained", "current"])
def test_a_learning_proposal_is_fixed_or_learns_and_is_restored(trained_run, proposal):
    """adaptive_ngram's mixture logits (a persistent buffer, not a parameter): proposal=trained leaves them as
    trained, proposal=current steps them as training does; restore puts them back either way."""
    run, _ = trained_run("sampled", "synthetic", "sampler=adaptive_ngram", "sampler.lr=0.5")
    module = load_trained(str(run), [], "cpu").module
    logits = module.output.sampler.logits
    start = logits.clone()
    options = DynamicOptions(method="sgd", objective="train", proposal=proposal, lr=0.1, segment=4)
    evaluation = DynamicEvaluation(module, options)
    stream = torch.randint(0, 100, (21,), generator=torch.Generator().manual_seed(9))
    read_stream(evaluation, stream, 1, (), CPU, segment=4)
    assert torch.equal(logits, start) == (proposal == "trained")
    evaluation.restore()
    assert torch.equal(logits, start)


def test_the_gradient_statistics_are_the_rms_over_training_batches(trained_run):
    module = trained_model(trained_run)
    train_ids = torch.randint(0, 100, (400,), generator=torch.Generator().manual_seed(5))
    options = DynamicOptions(stat_batch=4, stat_batches=3, segment=6)
    rms, count = gradient_rms(module, train_ids, options, CPU)
    layout, squares, state = batchify(train_ids, 4), [torch.zeros_like(p) for p in adapted(module)], None
    for index in range(3):
        window = layout[:, 6 * index : 6 * index + 7]
        _, grads, state = exact_gradients(module, window[:, :-1], window[:, 1:], state)
        squares = [s + g * g for s, g in zip(squares, grads, strict=True)]
    assert count == 3
    for got, total in zip(rms, squares, strict=True):
        torch.testing.assert_close(got, (total / 3).sqrt(), rtol=1e-5, atol=1e-9)


def digest(run):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted((run / "checkpoints").glob("*.ckpt"))}


@pytest.mark.parametrize("output", STRATEGIES)
@pytest.mark.parametrize("objective", ["exact", "train"])
def test_every_strategy_scores_dynamically_and_the_checkpoint_stays(trained_run, tmp_path, capsys, output, objective):
    """With a vanishing lr and no decay, dynamic evaluation in segments of 3 is the exact score; with a real lr
    (and the cache) it prints its settings and writes them beside the CSV; the checkpoint never changes."""
    run, _ = trained_run(output)
    text = tmp_path / "text.txt"
    text.write_text(" ".join(f"w{i % 7}" for i in range(60)) + "\n")
    before = digest(run)
    plain = score([f"ckpt_path={run}", f"file={text}", f"out={tmp_path / 'plain.csv'}"])
    stats = ["dynamic.stat_batch=4", "dynamic.stat_batches=2", f"dynamic.objective={objective}", "dynamic.segment=3"]
    still = score([f"ckpt_path={run}", f"file={text}", "dynamic=true", *stats, "dynamic.lr=1e-12", "dynamic.decay=0"])
    assert still.ppl == pytest.approx(plain.ppl, rel=1e-5)
    args = [f"ckpt_path={run}", f"file={text}", "dynamic=true", *stats, "dynamic.lr=0.01", "cache=true"]
    assert score_main([*args, "cache.theta=0.3", "cache.lam=0.1", f"out={tmp_path / 'dyn.csv'}"]) == 0
    out = capsys.readouterr().out
    held = ", the last 2,000 tokens' targets held exactly" if output in ("unigram", "rff", "bigram") else ""
    exact_loss = output in ("full", "hsm", "adaptive")  # a training loss that is the exact NLL: objective exact
    shown = f"train (proposal trained{held})" if objective == "train" and not exact_loss else "exact"
    assert f"dynamic: method rms, objective {shown}, lr 0.01" in out and "cache: window 500, theta 0.3" in out
    written = json.loads((tmp_path / "dyn.json").read_text())
    assert written["dynamic"]["statistics_batches"] == 2 and written["ppl"] != pytest.approx(plain.ppl, rel=1e-4)
    assert digest(run) == before


def test_the_weights_in_memory_are_restored(trained_run, tmp_path):
    run, _ = trained_run("unigram")
    trained = load_trained(str(run), [], "cpu")
    before = {k: v.clone() for k, v in trained.module.state_dict().items()}
    args = {"cache": "true", "dynamic": "true", "ckpt_path": str(run)}
    overrides = {"data.": [], "cache.": ["cache.window=20"], "dynamic.": ["dynamic.stat_batches=2", "dynamic.lr=0.01"]}
    stream = torch.randint(0, 100, (40,), generator=torch.Generator().manual_seed(6))
    log_p, report = extra_log_probs(trained, extras_from(args, overrides), stream)
    assert report["cache"]["searched"] == ["theta", "lambda"] and log_p.shape == (39,)
    after = trained.module.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_bad_dynamic_options_are_one_line(trained_run, tmp_path, capsys):
    run, _ = trained_run("full")
    (tmp_path / "text.txt").write_text("w1 w2 w3\n")
    for args, expected in [
        (["dynamic=true", "dynamic.lr=fast"], "dynamic.lr"),
        (["dynamic=true", "dynamic.method=adam"], "dynamic.method"),
        (["dynamic=true", "dynamic.segment=0"], "dynamic.segment must be >= 1"),
        (["dynamic=true", "dynamic.search_tokens=10"], "dynamic.search_tokens must be >= 100"),
        (["dynamic.lr=0.1"], "needs dynamic=true"),
    ]:
        with pytest.raises(SystemExit):
            score_main([f"ckpt_path={run}", f"file={tmp_path / 'text.txt'}", *args])
        err = capsys.readouterr().err
        assert expected in err and len(err.strip().splitlines()) == 1, err


def counted(monkeypatch, module, name):
    """Replace ``module.name`` by a wrapper that records each call's arguments; the list of them."""
    calls, original = [], getattr(module, name)

    def wrapper(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapper)
    return calls


def test_a_left_out_lr_is_the_grid_lr_with_the_lowest_validation_prefix_perplexity(trained_run, monkeypatch):
    """lr left out: one dynamic pass per grid lr over the validation split's first search_tokens tokens (here the
    middle of three lrs wins: the first reads as diverged, the last is far worse, so no lr past an end is tried),
    each pass's perplexity the one a DynamicEvaluation at that lr gives on that prefix, the gradient statistics
    computed once; the file is scored as with the winning lr given."""
    run, _ = trained_run("full")
    trained = load_trained(str(run), [], "cpu")
    monkeypatch.setitem(dynamic_eval.LRS, Method.rms, (1e-7, 1e-3, 1e3))
    measured = []

    def nan_first(log_p, real=score_extras.ppl):  # the first lr's (diverged: inf) read as nan, as weights gone nan give
        measured.append(log_p)
        return math.nan if len(measured) == 1 else real(log_p)

    monkeypatch.setattr(score_extras, "ppl", nan_first)
    statistics = counted(monkeypatch, score_extras, "gradient_rms")
    reads = counted(monkeypatch, score_extras, "read_stream")
    args = {"cache": "false", "dynamic": "true", "ckpt_path": str(run)}
    keys = ["dynamic.stat_batch=4", "dynamic.stat_batches=2", "dynamic.search_tokens=150"]
    stream = torch.randint(0, 100, (40,), generator=torch.Generator().manual_seed(7))
    log_p, report = extra_log_probs(trained, extras_from(args, {"data.": [], "cache.": [], "dynamic.": keys}), stream)
    found = report["dynamic"]
    assert (found["lr"], found["searched"], found["search_tokens_read"]) == (1e-3, ["lr"], 150)
    assert [t["lr"] for t in found["lr_tried"]] == [1e-7, 1e-3, 1e3] and len(statistics) == 1
    datamodule = instantiate(OmegaConf.load(run / "config.yaml").data)
    datamodule.setup()
    assert len(reads) == 4 and all(torch.equal(r[1], datamodule.valid_ids[:151]) for r in reads[:3])  # then the file
    options = DynamicOptions(lr=1e-3, stat_batch=4, stat_batches=2)
    evaluation = DynamicEvaluation(
        trained.module, options, gradient_rms(trained.module, datamodule.train_ids, options, CPU)[0]
    )
    with torch.no_grad():
        expected = ppl(read_stream(evaluation, datamodule.valid_ids[:151], 1, (), CPU, options.segment)[0])
    evaluation.restore()
    ppls = [t["ppl"] for t in found["lr_tried"]]
    assert ppls[1] == pytest.approx(expected, rel=1e-6) and ppls[0] is None  # diverged: null, strict JSON
    assert ppls[2] is None or ppls[2] > 2 * ppls[1]
    json.dumps(report, allow_nan=False)
    text = describe({**report, "seconds": 1.0, "seconds_per_1k_tokens": 1.0, "cpu_seconds_per_1k_tokens": 1.0})
    assert (
        "lr 0.001 (searched)" in text
        and f"dynamic lr search: 150 validation tokens, ppl diverged at lr 1e-07, {ppls[1]:.6g}" in text
    )
    given = ["dynamic.lr=0.001", *keys]
    again, _ = extra_log_probs(trained, extras_from(args, {"data.": [], "cache.": [], "dynamic.": given}), stream)
    torch.testing.assert_close(log_p, again)
    # with the cache searched too: the lr first (dynamic alone: this process's search and statistics, taken over),
    # then the cache's search adapting at the chosen lr
    del reads[:]
    both = extras_from({**args, "cache": "true"}, {"data.": [], "cache.": ["cache.window=20"], "dynamic.": keys})
    _, report = extra_log_probs(trained, both, stream)
    assert [len(r[3]) for r in reads] == [len(THETAS), 1] and reads[0][0].options.lr == 1e-3
    assert len(statistics) == 1 and report["dynamic"]["reused"] == ["statistics", "lr search"]
    assert report["dynamic"]["lr_tried"] == found["lr_tried"]
    assert "dynamic: statistics and lr search as this process computed them before" in describe(
        {**report, "seconds": 1.0, "seconds_per_1k_tokens": 1.0, "cpu_seconds_per_1k_tokens": 1.0}
    )


@pytest.mark.parametrize(
    ("best", "expected", "at_end"),
    [
        (2.5, [1.0, 2.0, 4.0], False),  # inside the grid: nothing more
        (8.0, [1.0, 2.0, 4.0, 8.0, 16.0], False),  # past the top: doubled until worse
        (0.3, [1.0, 2.0, 4.0, 0.5, 0.25, 0.125], False),  # past the bottom: halved until worse
        (1e6, [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0], True),  # BEYOND doublings, still the best: said so
    ],
)
def test_a_best_lr_at_an_end_of_the_grid_is_searched_past(monkeypatch, best, expected, at_end):
    """The lr search goes on past a grid end that is the best (doubling or halving, up to BEYOND times) and stops
    at the first worse lr; a pass that diverges there stops it too. Perplexity here: a bowl in log lr."""
    monkeypatch.setitem(dynamic_eval.LRS, Method.rms, (1.0, 2.0, 4.0))
    monkeypatch.setattr(score_extras, "BEYOND", 4)
    monkeypatch.setattr(score_extras, "DynamicEvaluation", lambda module, options, rms: options)

    def read(options, ids, window, thetas, device, segment, what):  # the pass's log p: ppl = e^(1 + log(lr/best)^2)
        return (torch.full((4,), -(1 + math.log(options.lr / best) ** 2)),)

    monkeypatch.setattr(score_extras, "read", read)
    data, trained = SimpleNamespace(valid_ids=torch.arange(300)), SimpleNamespace(module=None, device=CPU)
    found = score_extras.search_lr(trained, DynamicOptions(search_tokens=200), None, data)
    assert [t["lr"] for t in found["lr_tried"]] == expected and found["at_end"] == at_end
    assert found["lr"] == min(found["lr_tried"], key=lambda t: t["ppl"])["lr"] and found["search_tokens_read"] == 200
    text = describe({"dynamic": {**json_ready(DynamicOptions()), **found, "statistics_batches": 1}, "seconds": 1.0,
                     "seconds_per_1k_tokens": 1.0, "cpu_seconds_per_1k_tokens": 1.0})  # fmt: skip
    assert ("the best lr is still the end" in text) == at_end

    def diverging(options, *rest):  # better and better up to 8, then gone
        return (torch.full((4,), -math.inf if options.lr > 8 else math.log(options.lr)),)

    monkeypatch.setattr(score_extras, "read", diverging)
    found = score_extras.search_lr(trained, DynamicOptions(search_tokens=200), None, data)
    assert [t["lr"] for t in found["lr_tried"]][-2:] == [8.0, 16.0] and found["lr_tried"][-1]["ppl"] is None
    assert found["lr"] == 8.0 and not found["at_end"]


def test_a_search_is_reused_only_for_the_same_inputs_and_gives_what_searching_again_gives(trained_run, monkeypatch):
    """A second search of the same checkpoint, options and data reads no text and gives the first one's numbers,
    which a fresh process's search gives too; another decay, search prefix or checkpoint file searches again."""
    run, _ = trained_run("unigram")
    trained = load_trained(str(run), [], "cpu")
    monkeypatch.setitem(dynamic_eval.LRS, Method.rms, (1e-3, 1e-2))
    reads = counted(monkeypatch, score_extras, "read_stream")
    args = {"cache": "false", "dynamic": "true", "ckpt_path": str(run)}
    keys = ["dynamic.stat_batch=4", "dynamic.stat_batches=2", "dynamic.search_tokens=120", "dynamic.objective=train"]
    stream = torch.randint(0, 100, (30,), generator=torch.Generator().manual_seed(3))

    def search(*more):
        del reads[:]
        extras = extras_from(args, {"data.": [], "cache.": [], "dynamic.": [*keys, *more]})
        return extra_log_probs(trained, extras, stream)[1]["dynamic"], len(reads) - 1  # the searching passes

    first, searching = search()
    assert searching == len(first["lr_tried"]) >= 2 and first["reused"] == []
    again, passes = search()
    assert passes == 0 and again["reused"] == ["statistics", "lr search"] and again["lr_tried"] == first["lr_tried"]
    Computed.forget()  # as a fresh process: the seeded draws give the same numbers
    fresh, passes = search()
    assert passes == searching and fresh["lr_tried"] == first["lr_tried"]
    assert search("dynamic.decay=0")[1] >= 2 and search("dynamic.search_tokens=110")[1] >= 2
    checkpoint = trained.checkpoint.resolve()
    stamp = checkpoint.stat().st_mtime_ns
    os.utime(checkpoint, ns=(stamp + 10**9, stamp + 10**9))  # the file saved again
    assert search()[1] == searching


@pytest.mark.parametrize("method", ["rms", "sgd"])
def test_the_training_objectives_draws_are_seeded(trained_run, method):
    """objective=train draws negatives: the same dynamic.seed gives the same scores in a later call of the process
    (each pass starts from the seed, whatever drew before), another seed other ones; a scorer restored reads a text
    again exactly as the first time."""
    run, _ = trained_run("unigram")
    trained = load_trained(str(run), [], "cpu")
    args = {"cache": "false", "dynamic": "true", "ckpt_path": str(run)}
    keys = ["dynamic.stat_batch=4", "dynamic.stat_batches=2", "dynamic.objective=train", f"dynamic.method={method}"]
    keys.append("dynamic.lr=0.01" if method == "rms" else "dynamic.lr=0.5")
    stream = torch.randint(0, 100, (40,), generator=torch.Generator().manual_seed(4))

    def scored(*more):
        Computed.forget()  # the statistics computed again: their draws are seeded too
        extras = extras_from(args, {"data.": [], "cache.": [], "dynamic.": [*keys, *more]})
        return extra_log_probs(trained, extras, stream)[0]

    first = scored()
    torch.rand(5)  # the global generator moved on
    torch.testing.assert_close(scored(), first, rtol=0, atol=0)
    assert not torch.equal(scored("dynamic.seed=1"), first)
    evaluation = DynamicEvaluation(trained.module, DynamicOptions(method="sgd", objective="train", lr=0.5))
    passes = []
    for _ in range(2):
        with torch.no_grad():
            passes.append(read_stream(evaluation, stream, 1, (), CPU, 5)[0])
        evaluation.restore()
    torch.testing.assert_close(passes[0], first if method == "sgd" else passes[0], rtol=0, atol=0)
    torch.testing.assert_close(passes[1], passes[0], rtol=0, atol=0)


def test_a_given_lr_is_used_with_no_search(trained_run, tmp_path, monkeypatch, capsys):
    """dynamic.lr given: the statistics once, one pass (the file's), the report says lr not searched; with the cache
    searched too, the lr is still not searched (cache search + file: two passes, the statistics taken over).
    DynamicEvaluation refuses no lr."""
    run, _ = trained_run("full")
    (tmp_path / "text.txt").write_text(" ".join(f"w{i % 7}" for i in range(30)) + "\n")
    statistics = counted(monkeypatch, score_extras, "gradient_rms")
    reads = counted(monkeypatch, score_extras, "read_stream")
    args = [f"ckpt_path={run}", f"file={tmp_path / 'text.txt'}", "dynamic=true", "dynamic.lr=0.002"]
    args += ["dynamic.stat_batches=2", "dynamic.stat_batch=4"]
    assert score_main([*args, f"out={tmp_path / 'given.csv'}"]) == 0
    out = capsys.readouterr().out
    assert "lr 0.002, " in out and "searched" not in out and "lr search" not in out
    written = json.loads((tmp_path / "given.json").read_text())["dynamic"]
    assert (written["lr"], written["searched"], written["lr_tried"]) == (0.002, [], [])
    assert (len(statistics), len(reads)) == (1, 1)
    score([*args, "cache=true", "cache.window=20", f"out={tmp_path / 'both.csv'}"])
    assert (len(statistics), len(reads)) == (1, 3)  # the statistics this process computed: taken over
    with pytest.raises(ValueError, match="concrete lr"):
        DynamicEvaluation(trained_model(trained_run), DynamicOptions(method="sgd"))


def test_the_dynamic_bench_times_every_mode_from_the_trained_weights(trained_run, tmp_path, monkeypatch):
    """scripts/bench_dynamic.py on a tiny rff run: each mode's seconds and perplexity, ``exact`` the ratios' base,
    the record written as returned and rendered as the docs quote it (a row per mode with its ratio)."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "scripts"))
    import bench_dynamic

    run, _ = trained_run("rff")
    out = tmp_path / "dynamic.json"
    argv = ["--runs", f"rff={run}", "--tokens", "40", "--rounds", "1", "--stat-batches", "2", "--lr", "0.01"]
    argv += ["--warmup-tokens", "10"]
    record = bench_dynamic.main([*argv, "--threads", "1", "--json", str(out)])
    table = record["runs"]["rff"]
    assert set(table["seconds_per_1k_tokens"]) == {"exact", "train:trained", "train:trained:0", "train:current"}
    assert table["ppl"]["train:trained"] != table["ppl"]["train:trained:0"]  # the recent targets held, or not
    assert table["ratio_to_exact"]["exact"] == 1.0 and all(math.isfinite(p) for p in table["ppl"].values())
    assert json.loads(out.read_text()) == record and record["command"].startswith("python scripts/bench_dynamic.py")
    from records.bench import render_bench

    rows = [line.split(" | ") for line in render_bench(out).splitlines() if line.startswith("| rff |")]
    assert [row[2] for row in rows] == ["`exact`", "`train:trained`", "`train:trained:0`", "`train:current`"]
    ratios = [f"{table['ratio_to_exact'][mode]:.2f}" for mode in table["seconds_per_1k_tokens"]]
    assert [row[4] for row in rows] == ratios and rows[0][4] == "1.00"


@pytest.mark.cuda
@pytest.mark.parametrize("objective", ["exact", "train"])
def test_dynamic_evaluation_on_cuda_scores_what_the_cpu_scores(trained_run, objective):
    """rff's run read dynamically on a GPU: with the exact objective every score (so every step before it) is the
    CPU's to float32 rounding; with the training objective the pinned tree lives on the GPU, over a copy of θ_0."""
    run, _ = trained_run("rff")
    stream = torch.randint(0, 100, (16,), generator=torch.Generator().manual_seed(10))
    scores = {}
    for device in ("cpu", "cuda"):
        module = load_trained(str(run), [], device).module
        evaluation = DynamicEvaluation(module, DynamicOptions(method="sgd", objective=objective, lr=0.1, segment=5))
        scores[device] = read_stream(evaluation, stream, 1, (), torch.device(device), segment=5)[0]
        if objective == "train":
            pinned = module.output.sampler.tree.weight
            assert pinned.device.type == device and pinned.data_ptr() != module.output.weight.data_ptr()
        evaluation.restore()
    if objective == "exact":
        torch.testing.assert_close(scores["cuda"], scores["cpu"], rtol=1e-4, atol=1e-4)
    assert torch.isfinite(scores["cuda"]).all()

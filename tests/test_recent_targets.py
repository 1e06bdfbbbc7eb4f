"""The recent targets a dynamic pass's sampled loss holds exactly (lmtrain/tools/recent_targets.py and
SampledSoftmax.loss's ``exact``): the ring against a written-out window, the loss against the exact NLL when it
holds every class, its normalizer unbiased when it holds some, which options are refused, and a pass that starts
with an empty window after ``restore``."""

from __future__ import annotations

import math

import pytest
import torch

import lmtrain.output as outputs
from lmtrain.output.base import ExactClasses
from lmtrain.output.cache import read_stream
from lmtrain.sampler import UniformSampler, UnigramSampler
from lmtrain.tools.dynamic_eval import RECENT_WINDOW, DynamicEvaluation, DynamicOptions, adapted, resolved
from lmtrain.tools.recent_targets import RecentTargets
from lmtrain.tools.score import main as score_main
from lmtrain.tools.trained import load_trained

N_CLASSES, DIM = 12, 5
CPU = torch.device("cpu")


def test_the_ring_holds_each_class_of_the_last_window_tokens_once():
    """After every segment (the last one short) the included slots are the distinct classes of the last ``window``
    targets, each once, and ``member`` marks exactly them; ``clear`` empties it."""
    window, stream = 7, torch.randint(0, N_CLASSES, (40,), generator=torch.Generator().manual_seed(3))
    ring = RecentTargets(window, N_CLASSES, CPU)
    for start in range(0, stream.numel(), 3):
        ring.push(stream[start : start + 3])
        end = min(start + 3, stream.numel())
        held = set(stream[max(0, end - window) : end].tolist())  # written out: the window's classes
        classes = ring.classes()
        included = classes.ids[classes.include].tolist()
        assert sorted(included) == sorted(held)  # each class once
        assert classes.member.tolist() == [c in held for c in range(N_CLASSES)]
    ring.clear()
    assert not ring.classes().include.any() and not ring.classes().member.any()
    with pytest.raises(ValueError, match="does not fit a window of 7"):
        ring.push(stream[:8])


def every_class(target: torch.Tensor) -> ExactClasses:
    """All classes, one of them twice (the repeat excluded) and an empty slot (its id 0, excluded)."""
    ids = torch.cat([torch.arange(N_CLASSES), torch.tensor([3, 0])])  # (n + 2,)
    include = torch.cat([torch.ones(N_CLASSES, dtype=torch.bool), torch.zeros(2, dtype=torch.bool)])
    return ExactClasses(ids, include, torch.ones(N_CLASSES, dtype=torch.bool))


@pytest.mark.parametrize(
    "kind, options",
    [
        ("SampledSoftmax", {"correction": "exact"}),
        ("SampledSoftmax", {"correction": "classic", "remove_accidental_hits": False}),
        ("SampledSoftmax", {"shared_negatives": False}),
        ("SampledSoftmax", {"unique": True, "shared_negatives": True}),
        ("CosineSampledSoftmax", {}),
        ("AbsoluteSampledSoftmax", {}),
    ],
)
def test_holding_every_class_exactly_gives_the_exact_nll(kind, options):
    """Every draw is then a copy of a held class and leaves the sample; each class is in the normalizer once, the
    target once: the loss is the exact mean -log p, whatever the correction, the draws and the logit."""
    torch.manual_seed(0)
    counts = torch.arange(N_CLASSES, 0, -1) ** 2
    layer = getattr(outputs, kind)(N_CLASSES, DIM, UnigramSampler(N_CLASSES, counts), num_samples=6, **options)
    hidden, target = torch.randn(9, DIM), torch.randint(N_CLASSES, (9,))
    exact = -layer.log_prob(hidden, target).mean()
    for seed in range(3):
        torch.manual_seed(seed)
        torch.testing.assert_close(layer.loss(hidden, target, exact=every_class(target)), exact)
    assert float(layer.loss(hidden, target)) != pytest.approx(float(exact), rel=1e-4)  # without it: sampled


@pytest.mark.parametrize("correction", ["exact", "classic"])
def test_the_normalizer_stays_unbiased_with_some_classes_held(correction):
    """One position, classes {1, 4, 5, 9} held (the target 4 among them): exp(loss + s_t) is the estimated
    normalizer; over 4,000 draws its mean is the exact normalizer within 4 standard errors. Counting a drawn copy
    of a held class again, or correcting a held class, moves it off by far more."""
    torch.manual_seed(1)
    layer = outputs.SampledSoftmax(N_CLASSES, DIM, UniformSampler(N_CLASSES), num_samples=4, correction=correction)
    with torch.no_grad():
        layer.weight.mul_(4)  # spread logits: the held classes carry much of the normalizer
    hidden, target = torch.randn(1, DIM), torch.tensor([4])
    held = torch.tensor([1, 4, 5, 9])
    member = torch.zeros(N_CLASSES, dtype=torch.bool)
    member[held] = True
    classes = ExactClasses(held, torch.ones(4, dtype=torch.bool), member)
    logits = (layer.query(hidden) @ layer.weight.T)[0].detach()  # (n,)
    torch.manual_seed(2)
    with torch.no_grad():
        estimates = torch.stack([(layer.loss(hidden, target, exact=classes) + logits[4]).exp() for _ in range(4000)])
    error = estimates.std() / math.sqrt(estimates.numel())
    assert abs(float(estimates.mean() - logits.exp().sum())) < 4 * float(error)


def test_a_window_is_the_default_only_where_a_sampled_softmax_is_stepped_on(trained_run, tmp_path, capsys):
    """Left out, recent is RECENT_WINDOW for objective=train on a sampled softmax and 0 elsewhere; asked of nce or
    of objective=exact it is refused in one line, and shorter than a segment too."""
    modules = {name: load_trained(str(trained_run(name)[0]), [], "cpu").module for name in ("unigram", "rff", "nce")}
    for name, module in modules.items():
        expected = 0 if name == "nce" else RECENT_WINDOW
        assert resolved(DynamicOptions(objective="train"), module).recent == expected
        assert resolved(DynamicOptions(), module).recent == 0
    with pytest.raises(ValueError, match="shorter than a segment"):
        resolved(DynamicOptions(objective="train", recent=3), modules["unigram"])
    (tmp_path / "text.txt").write_text("w1 w2 w3 w4 w5 w6\n")
    for output, args, expected in [
        ("nce", ["dynamic.objective=train", "dynamic.recent=100"], "output=nce's training loss has no sampled"),
        ("full", ["dynamic.objective=train", "dynamic.recent=100"], "output=full's training loss is its exact"),
        ("unigram", ["dynamic.recent=100"], "dynamic.objective=exact steps on the exact loss"),
    ]:
        run, _ = trained_run(output)
        with pytest.raises(SystemExit):
            score_main([f"ckpt_path={run}", f"file={tmp_path / 'text.txt'}", "dynamic=true", "dynamic.lr=0.01", *args])
        err = capsys.readouterr().err
        assert expected in err and len(err.strip().splitlines()) == 1, err


def test_a_pass_holds_its_recent_targets_and_restore_empties_them(trained_run):
    """On unigram's sampled loss the window changes the steps (scores differ from recent=0 after the first
    segment, not in it); a second pass after ``restore`` repeats the first (the window starts empty again)."""
    module = load_trained(str(trained_run("unigram")[0]), [], "cpu").module
    rms = [torch.full_like(p, 1e-3) for p in adapted(module)]
    stream = torch.randint(0, 100, (31,), generator=torch.Generator().manual_seed(9))

    def scores(recent):
        evaluation = DynamicEvaluation(module, DynamicOptions(objective="train", lr=0.01, recent=recent), rms)
        passes = []
        for _ in range(2):
            passes.append(read_stream(evaluation, stream, 1, (), CPU, segment=5)[0])
            evaluation.restore()
        return passes

    held, plain = scores(20), scores(0)
    assert torch.equal(held[0], held[1]) and torch.equal(plain[0], plain[1])
    assert torch.equal(held[0][:5], plain[0][:5]) and not torch.allclose(held[0][5:], plain[0][5:])

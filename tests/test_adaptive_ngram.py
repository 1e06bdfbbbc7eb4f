"""``sampler=adaptive_ngram`` (Bengio & Senécal 2008): the unigram-bigram mixture with weights per frequency bin of the
previous word, against written-out references: its bins, its log q (a loop over positions on dense count matrices),
its draws (chi-square), one adaptation step (a hand-written loss differentiated by autograd), the KL it lowers
where the bigram is right, its checkpointed state and the refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from lab.launches import DispatchCounter

from lmtrain.config import ConfigError, compose_config
from lmtrain.output.sampled import SampledSoftmax
from lmtrain.run.build import build_module, build_output
from lmtrain.sampler.adaptive_ngram import AdaptiveNgramSampler
from tests.power import ALPHA, chi_square_pvalue, draws_for
from tests.test_bigram import LAST, UNSEEN, N, markov_stream

pytestmark = pytest.mark.usefixtures("one_thread")

BINS = 4


def made(stream: torch.Tensor | None = None, seed: int = 0, **options) -> AdaptiveNgramSampler:
    """A sampler over the bigram tests' Markov stream whose mixture logits are random (every bin different)."""
    sampler = AdaptiveNgramSampler(N, markov_stream() if stream is None else stream, num_bins=BINS, **options)
    sampler.logits.copy_(torch.randn(BINS, generator=torch.Generator().manual_seed(seed)))
    return sampler


def dense_tables(stream: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The smoothed unigram u (n,), the bigram B (n, n) (row p: c(p, .) / c(p), u where c(p) = 0) and c(p) (n,),
    from dense count matrices in float64."""
    pairs = torch.zeros(N, N, dtype=torch.float64)
    for p, j in zip(stream[:-1].tolist(), stream[1:].tolist(), strict=True):
        pairs[p, j] += 1
    unigram = torch.bincount(stream, minlength=N).double() + 1.0
    unigram /= unigram.sum()
    rows = pairs.sum(1)
    bigram = torch.stack([pairs[p] / rows[p] if rows[p] > 0 else unigram for p in range(N)])
    return unigram, bigram, rows


def written_bins(rows: torch.Tensor, bins: int) -> list[int]:
    """Each word's bin: words by descending count (ties by id), bin = floor(bins x the token share before it)."""
    order = sorted(range(N), key=lambda p: (-float(rows[p]), p))
    out, before = [0] * N, 0.0
    for p in order:
        out[p] = min(int(bins * before / float(rows.sum())), bins - 1)
        before += float(rows[p])
    return out


def written_q(sampler: AdaptiveNgramSampler, stream: torch.Tensor, p: int, j: int) -> float:
    unigram, bigram, rows = dense_tables(stream)
    pi = 1 / (1 + math.exp(-float(sampler.logits[written_bins(rows, BINS)[p]])))  # the bigram's weight
    return (1 - pi) * float(unigram[j]) + pi * float(bigram[p, j])


def test_the_bins_hold_equal_token_shares_by_frequency_rank():
    stream = markov_stream()
    _, _, rows = dense_tables(stream)
    assert made(stream).bins.tolist() == written_bins(rows, BINS)
    assert len(set(written_bins(rows, BINS))) == BINS  # every bin is used on this stream


def test_log_q_of_the_draws_and_the_targets_is_the_written_out_mixture():
    stream = markov_stream()
    sampler = made(stream)
    prev = torch.tensor([0, 3, 7, 0, LAST, UNSEEN, 12])
    targets = torch.tensor([1, 2, 3, 4, 5, 6, 7])
    torch.manual_seed(0)
    ids, log_q, target_log_q, joint = sampler.propose(None, prev, targets).draw(9)
    assert ids.shape == log_q.shape == (7, 9) and target_log_q.shape == (7, 1) and joint.shape == (7, 10)
    for i, p in enumerate(prev.tolist()):
        expected = [math.log(written_q(sampler, stream, p, j)) for j in ids[i].tolist()]
        torch.testing.assert_close(log_q[i].double(), torch.tensor(expected, dtype=torch.float64), rtol=1e-6, atol=0)
        target_q = math.log(written_q(sampler, stream, p, int(targets[i])))
        assert float(target_log_q[i, 0]) == pytest.approx(target_q, rel=1e-6)
    every = sampler.propose(None, prev).log_q_all(N)  # (N, n) a distribution at every position
    torch.testing.assert_close(every.double().exp().sum(1), torch.ones(7, dtype=torch.float64))


@pytest.mark.parametrize("previous", [0, 3, LAST])
def test_draws_follow_log_q(previous):
    """Per previous word (3 is in another bin than 0; LAST has no successor: the unigram alone)."""
    sampler = made()
    prev = torch.tensor([previous])
    q = sampler.propose(None, prev).log_q(torch.arange(N).view(1, N))[0].double().exp().numpy()
    torch.manual_seed(6)
    ids = sampler.propose(None, prev).draw(draws_for(N)).ids
    assert chi_square_pvalue(torch.bincount(ids.reshape(-1), minlength=N).numpy(), q) > ALPHA


def test_one_adaptation_step_is_sgd_on_the_hand_written_importance_weighted_loss():
    """The logits move by -lr x the gradient of (1/N) sum_i -sum_j r_ij log q(s_ij | p_i), r detached, which autograd
    computes here from a loop over positions and draws."""
    stream = markov_stream()
    sampler = made(stream, lr=0.7)
    unigram, bigram, rows = dense_tables(stream)
    bins = written_bins(rows, BINS)
    prev = torch.tensor([0, 3, 7, 0, LAST, 12, 20, 5])
    scores = torch.randn(8, 6, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(2)
    proposal = sampler.propose(None, prev, torch.zeros(8, dtype=torch.long))
    ids, log_q, _, _ = proposal.draw(6)
    before = sampler.logits.clone().double().requires_grad_(True)
    loss = torch.zeros((), dtype=torch.float64)
    for i, p in enumerate(prev.tolist()):
        r = torch.softmax(scores[i].double() - log_q[i].double(), 0)
        pi = torch.sigmoid(before[bins[p]])
        for j, w in enumerate(ids[i].tolist()):
            loss = loss - r[j] * torch.log((1 - pi) * unigram[w] + pi * bigram[p, w])
    (loss / len(prev)).backward()
    proposal.observe(ids, scores)
    sampler.update(torch.zeros(N, 3))  # the after-step hook
    expected = before.detach() - 0.7 * before.grad
    torch.testing.assert_close(sampler.logits.double(), expected, rtol=1e-5, atol=1e-7)
    assert before.grad.abs().sum() > 0 and not torch.equal(sampler.logits.double(), before.detach())
    assert sampler.pending.abs().sum() == 0  # used once


def test_adaptation_lowers_the_kl_where_the_bigram_is_right():
    """The model is the bigram itself: steps drive every used bin towards the bigram and KL(p || q) down."""
    stream = markov_stream()
    sampler = made(stream, lr=2.0)
    _, bigram, _ = dense_tables(stream)
    log_p = bigram.clamp(min=1e-12).log()  # (n, n) the model's log p(. | p): the bigram
    contexts = torch.arange(N - 2)  # the words with successors

    def kl() -> float:
        log_q = sampler.propose(None, contexts).log_q(torch.arange(N)).double()  # (N - 2, n)
        p = bigram[contexts]
        return float((p * (log_p[contexts] - log_q)).sum(1).mean())

    start, weight_before = kl(), torch.sigmoid(sampler.logits)
    torch.manual_seed(3)
    for _ in range(40):
        prev = stream[torch.randint(stream.numel() - 1, (64,))]
        proposal = sampler.propose(None, prev)
        ids = proposal.draw(20).ids
        proposal.observe(ids, log_p[prev.unsqueeze(1), ids].float())
        sampler.update(torch.zeros(N, 3))
    assert kl() < 0.5 * start, (start, kl())
    assert (torch.sigmoid(sampler.logits) > weight_before).all()


def test_the_mixture_is_checkpointed_and_outside_the_models_optimizer():
    cfg = compose_config(["data=synthetic", "output=sampled", "sampler=adaptive_ngram", "sampler.num_bins=3"])
    counts = torch.ones(N)
    module = build_module(cfg, N, counts, markov_stream())
    names = [name for name, _ in module.named_parameters()]
    assert not any("logits" in name or "pending" in name for name in names), names
    optimizer = module.configure_optimizers()["optimizer"]
    params = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert id(module.output.sampler.logits) not in params
    state = module.state_dict()
    assert {"output.sampler.logits", "output.sampler.pending"} <= set(state)

    module.output.sampler.logits.add_(torch.randn(3))
    module.output.sampler.pending.add_(0.1)
    fresh = build_module(cfg, N, counts, markov_stream())
    fresh.load_state_dict(module.state_dict())
    first, second = module.output.sampler, fresh.output.sampler
    assert torch.equal(first.logits, second.logits) and torch.equal(first.pending, second.pending)
    prev, scores = torch.tensor([0, 3, 7, 1]), torch.randn(4, 5)
    runs = []
    for sampler in (first, second):  # the same draws and steps from the same random state
        torch.manual_seed(4)
        proposal = sampler.propose(None, prev)
        drawn = proposal.draw(5)
        proposal.observe(drawn.ids, scores)
        sampler.update(torch.zeros(N, 3))
        runs.append((drawn.ids, drawn.log_q, sampler.logits.clone()))
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)


def test_a_step_draws_and_adapts_without_host_syncs_reusing_the_draws_mixture():
    sampler = made()
    prev, targets, weight = torch.randint(N, (50,)), torch.randint(N, (50,)), torch.zeros(N, 3)
    with DispatchCounter() as counter:
        proposal = sampler.propose(None, prev, targets)
        drawn = proposal.draw(10)
        scores = torch.randn(50, 10)
        with DispatchCounter() as adaptation:
            proposal.observe(drawn.ids, scores)
            sampler.update(weight)
    assert counter.counts.syncs == 0, dict(counter.counts.sync_ops)
    # the importance weights, their sum against B / q, the bins' step: the draws' q is not looked up again
    assert adaptation.counts.launches <= 10, dict(adaptation.counts.by_op)


def test_it_trains_inside_the_sampled_softmax_and_refuses_what_it_cannot_serve():
    sampler = AdaptiveNgramSampler(N, markov_stream(), num_bins=BINS)
    layer = SampledSoftmax(N, 5, sampler, num_samples=6)
    hidden, target, inputs = torch.randn(10, 5), torch.randint(N, (10,)), torch.randint(N - 2, (10,))
    start = sampler.logits.clone()
    layer.loss(hidden, target, inputs).backward()  # observe gathers the step
    assert sampler.pending.abs().sum() > 0 and torch.equal(sampler.logits, start)
    layer.after_optimizer_step()
    assert not torch.equal(sampler.logits, start)
    with pytest.raises(ValueError, match="previous word"):
        sampler.propose(torch.randn(3, 6), None, target[:3])
    with pytest.raises(ValueError, match="train_ids"):
        AdaptiveNgramSampler(N, None)
    with pytest.raises(ConfigError, match="sampler.num_bins must be >= 1"):
        compose_config(["~data", "output=sampled", "sampler=adaptive_ngram", "sampler.num_bins=0"])
    with pytest.raises(Exception, match="unique"):  # per position only: distinct draws need one set per batch
        cfg = compose_config(["~data", "output=sampled", "sampler=adaptive_ngram", "output.unique=true"])
        build_output(cfg, N, 5, torch.ones(N), markov_stream())


def test_it_is_an_option_of_the_config():
    cfg = compose_config(["~data", "output=sampled", "sampler=adaptive_ngram", "sampler.lr=0.5"])
    assert cfg.sampler._target_ == "lmtrain.sampler.adaptive_ngram.AdaptiveNgramSampler" and cfg.sampler.lr == 0.5
    assert np.isclose(cfg.sampler.unigram_weight, 0.25)

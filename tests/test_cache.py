"""The neural cache (lmtrain/output/cache.py): the mixture against a written-out loop over positions and window
entries, its ring buffer's size, the search over (θ, λ), the run config's eval.cache, score's cache=true."""

from __future__ import annotations

import json
import math

import pytest
import torch

from lmtrain.output.cache import LAMBDAS, THETAS, CacheOptions, NeuralCache, choose, mix, mixes, read_stream
from lmtrain.tools.score import main as score_main
from lmtrain.tools.score import score
from tests.conftest import make_config


def loop_log_probs(hidden, ids, log_p_model, window, theta, lam, warmup):
    """log p of every target, written out: position t reads the positions i in [t - window, t), each followed by
    ids[i]; softmax over them of theta * h_t . h_i; the mass on ids[t]; the mixture where the warm-up allows."""
    out = []
    for t in range(len(ids)):
        held = list(range(max(0, t - window), t))
        full = len(held) == window if warmup == "full" else len(held) > 0
        if not full:
            out.append(float(log_p_model[t]))
            continue
        scores = [theta * sum(float(hidden[t, k] * hidden[i, k]) for k in range(hidden.shape[1])) for i in held]
        top = max(scores)
        weights = [math.exp(s - top) for s in scores]
        p_cache = sum(w for w, i in zip(weights, held, strict=True) if ids[i] == ids[t]) / sum(weights)
        p = (1 - lam) * math.exp(float(log_p_model[t])) + lam * p_cache
        out.append(math.log(p))
    return torch.tensor(out, dtype=torch.float64)


def tiny_stream(length=23, dim=3, classes=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(length, dim, generator=gen)  # (L, d)
    ids = torch.randint(0, classes, (length,), generator=gen)  # (L,) the word after each position
    log_p_model = torch.randn(length, generator=gen).mul(0.5).sub(1.5).clamp(max=-0.01)  # (L,) some log p < 0
    return hidden, ids, log_p_model


@pytest.mark.parametrize("warmup", ["full", "partial"])
@pytest.mark.parametrize("chunks", [[23], [3, 1, 7, 5, 7], [1] * 23])
def test_mixture_equals_the_written_out_loop(warmup, chunks):
    """Chunks shorter and longer than the window, read one after the other through the ring buffer."""
    hidden, ids, log_p_model = tiny_stream()
    window, thetas, lam = 5, (0.0, 0.7, 2.0), 0.3
    cache, parts = NeuralCache(window, hidden.shape[1]), []
    starts = [0, *torch.tensor(chunks).cumsum(0).tolist()]
    for a, b in zip(starts, starts[1:], strict=False):
        parts.append(cache.read(hidden[a:b], ids[a:b], thetas))
    log_mass, held = torch.cat([p[0] for p in parts], 1), torch.cat([p[1] for p in parts])
    assert held.tolist() == [min(t, window) for t in range(len(ids))]
    for k, theta in enumerate(thetas):
        got = mix(log_p_model, log_mass[k], lam, mixes(held, window, warmup))
        expected = loop_log_probs(hidden, ids.tolist(), log_p_model, window, theta, lam, warmup)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_a_target_the_cache_does_not_hold_keeps_only_the_models_share():
    cache = NeuralCache(3, 2)
    log_mass, held = cache.read(torch.randn(4, 2), torch.tensor([0, 1, 2, 3]), (1.0,))
    assert held.tolist() == [0, 1, 2, 3] and torch.isneginf(log_mass).all()  # no word ever repeats
    log_p = torch.full((4,), -2.0)
    mixed = mix(log_p, log_mass[0], 0.25, mixes(held, 3, "partial"))
    torch.testing.assert_close(mixed, torch.tensor([-2.0, *[-2.0 + math.log(0.75)] * 3], dtype=torch.float64))


@pytest.mark.parametrize("classes", [10, 10**6])
def test_the_buffers_are_window_by_d_whatever_the_vocabulary(classes):
    window, dim = 7, 4
    cache = NeuralCache(window, dim)
    gen = torch.Generator().manual_seed(1)
    for _ in range(5):
        cache.read(torch.randn(6, dim, generator=gen), torch.randint(0, classes, (6,), generator=gen), THETAS)
    buffers = {name: tuple(t.shape) for name, t in vars(cache).items() if isinstance(t, torch.Tensor)}
    assert buffers == {"hidden": (window, dim), "ids": (window,), "position": (window,)}
    assert cache.position.sort().values.tolist() == list(range(30 - window, 30))  # the last window positions


def test_the_search_takes_the_best_pair_of_the_grid():
    """One read with every θ gives what one read per θ gives, and the search's pair is the grid's best."""
    hidden, ids, log_p_model = tiny_stream(length=60, classes=3, seed=2)
    options = CacheOptions(window=8)
    masses, held = NeuralCache(8, 3).read(hidden, ids, THETAS)
    chosen = choose(log_p_model, masses, held, options)
    on = mixes(held, 8, options.warmup)
    grid = {}
    for theta in THETAS:
        one, _ = NeuralCache(8, 3).read(hidden, ids, (theta,))
        for lam in LAMBDAS:
            grid[theta, lam] = math.exp(-float(mix(log_p_model, one[0], lam, on).mean()))
    best = min(grid, key=grid.get)
    assert (chosen.theta, chosen.lam) == best and chosen.val_ppl == pytest.approx(grid[best], rel=1e-9)
    assert chosen.searched == ("theta", "lambda")
    given = choose(log_p_model, masses[THETAS.index(0.5)][None], held, CacheOptions(window=8, theta=0.5))
    assert given.theta == 0.5 and given.lam == min(LAMBDAS, key=lambda lam: grid[0.5, lam])


def test_read_stream_is_the_model_scored_in_segments_with_a_cache():
    """Segments of 4 with the state carried: the scorer sees the stream in order, the cache reads each segment."""
    stream = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5])
    seen, table = [], torch.randn(10, 2)

    def scorer(batch, state):
        inputs, targets = batch
        seen.append((inputs.tolist(), targets.tolist(), state))
        return -torch.ones(targets.shape[1]), table[inputs[0]], len(seen)

    log_p, log_mass, held = read_stream(scorer, stream, 3, (0.5,), torch.device("cpu"), segment=4)
    assert [s[0][0] for s in seen] == [[3, 1, 4, 1], [5, 9, 2, 6], [5, 3]] and [s[2] for s in seen] == [None, 1, 2]
    expected, _ = NeuralCache(3, 2).read(table[stream[:-1]], stream[1:], (0.5,))
    torch.testing.assert_close(log_mass, expected)
    torch.testing.assert_close(log_p, -torch.ones(10, dtype=torch.float64))
    assert held.tolist() == [0, 1, 2, 3, 3, 3, 3, 3, 3, 3]


def test_the_awd_presets_carry_the_published_settings():
    ptb = make_config(["experiment=awd_lstm_ptb", "run_dir=/tmp/unused"]).eval.cache
    wt2 = make_config(["experiment=awd_lstm_wt2", "run_dir=/tmp/unused"]).eval.cache
    assert (ptb.window, ptb.theta, ptb.lam) == (500, 1.0, 0.1)
    assert (wt2.window, wt2.theta, wt2.lam) == (3785, 0.662, 0.1279)
    assert make_config(["run_dir=/tmp/unused"]).eval.cache == CacheOptions()


CACHED = ["eval.cache.window=40", "eval.cache.theta=0.5", "eval.cache.lam=0.2", "eval.cache.test=true"]


@pytest.fixture(scope="module")
def cached_run(tmp_path_factory):
    """A tiny synthetic run whose config holds eval.cache settings and tests with them."""
    from lmtrain.run.run import train
    from tests.conftest import TINY

    root = tmp_path_factory.mktemp("cached")
    small = ["data.train_tokens=6000", "data.valid_tokens=600", "data.test_tokens=600", "data.eval_batch_size=1"]
    cfg = make_config([*TINY, *small, "trainer.max_steps=8", *CACHED, f"run_dir={root / 'run'}"])
    return root / "run", train(cfg)


def test_a_runs_cached_test_is_what_score_gives_with_the_runs_settings(cached_run, tmp_path, capsys):
    """The training run's test with eval.cache, and score's cache=true over the test split, which takes the run's
    eval.cache as its defaults: one number; the settings print and go into the JSON beside the CSV."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    run, metrics = cached_run
    assert json.loads((run / "run.json").read_text())["metrics"]["test/ppl_cache"] == metrics["test/ppl_cache"]
    assert metrics["test/ppl_cache"] != pytest.approx(metrics["test/ppl"], rel=1e-3)
    datamodule = instantiate(OmegaConf.load(run / "config.yaml").data)
    datamodule.setup()
    text = tmp_path / "test.txt"
    text.write_text(" ".join(datamodule.vocab[i] for i in datamodule.test_ids.tolist()) + "\n")
    assert score_main([f"ckpt_path={run}", f"file={text}", "device=cpu", "cache=true"]) == 0
    out = capsys.readouterr().out
    assert "cache: window 40, theta 0.5, lambda 0.2, warmup partial" in out
    written = json.loads((run / "score" / "test.json").read_text())
    assert written["ppl"] == pytest.approx(metrics["test/ppl_cache"], rel=1e-6)
    assert written["cache"] | {"searched": []} == written["cache"] and written["cache"]["window"] == 40
    # left out on the command line: searched on the validation split, the run's value for the rest
    searched = score([f"ckpt_path={run}", f"file={text}", "cache=true", "cache.theta=null"])
    assert searched.extras["cache"]["searched"] == ["theta"] and searched.extras["cache"]["theta"] in THETAS
    assert searched.extras["cache"]["lam"] == 0.2 and searched.extras["cache"]["val_ppl"] > 1


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["cache=true", "cache.window=0"], "cache.window must be >= 1, got 0"),
        (["cache=true", "cache.lambda=0.1"], "lambda is spelled cache.lam"),
        (["cache=true", "cache.warmup=half"], "cache.warmup"),
        (["cache.window=10"], "cache.window=10 needs cache=true"),
        (["cache=yes"], "pass cache=true or cache=false"),
    ],
)
def test_bad_cache_options_are_one_line(cached_run, tmp_path, capsys, args, expected):
    run, _ = cached_run
    (tmp_path / "text.txt").write_text("w1 w2 w3\n")
    with pytest.raises(SystemExit) as exit_info:
        score_main([f"ckpt_path={run}", f"file={tmp_path / 'text.txt'}", *args])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and expected in err and len(err.strip().splitlines()) == 1, err

"""AWD-LSTM's regularizers as options of model=lstm: locked dropout, word dropout, weight drop, AR / TAR; and that
with all of them off the encoder is the plain one."""

from __future__ import annotations

import csv
import math
import warnings

import pytest
import torch
from torch import nn

from lmtrain.model.dropout import LockedDropout
from lmtrain.model.lstm import LSTMEncoder, LSTMOptions
from lmtrain.model.stack import LayerStack
from lmtrain.model.weight_drop import dropped_recurrent_weights
from lmtrain.output.full import FullSoftmax
from lmtrain.run_folder.checkpoints import same
from lmtrain.training.step import evaluate, window_loss
from tests.cli_runs import TINY, run_cli, run_info

N, B, T, D = 50, 6, 12, 16


def encoder(seed: int = 0, **options: object) -> LSTMEncoder:
    torch.manual_seed(seed)
    return LSTMEncoder(N, emb_dim=D, hidden_dim=D, **options)


def tokens(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, N, (B, T), generator=torch.Generator().manual_seed(seed))


def io_of(module: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(input, output) of each call of ``module`` from now on."""
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    module.register_forward_hook(lambda _m, args, out: seen.append((args[0].detach(), out.detach())))
    return seen


def test_locked_dropout_keeps_one_mask_per_sequence_over_time_and_is_off_in_eval():
    drop = LockedDropout(0.5)
    x = torch.rand(8, 20, 64) + 0.5
    torch.manual_seed(0)
    mask = drop(x) / x  # (B, T, d)
    assert torch.equal(mask, mask[:, :1].expand_as(mask))  # the same at every time step
    assert set(mask.unique().tolist()) <= {0.0, 2.0} and 0.3 < (mask == 0).float().mean() < 0.7
    assert not torch.equal(mask[0, 0], mask[1, 0])  # sequences draw their own
    assert not torch.equal(drop(x), drop(x))  # and every call draws anew
    assert torch.equal(drop.eval()(x), x)


def test_the_encoders_three_dropout_sites_are_locked():
    enc = encoder(num_layers=3, dropout=0.5, locked_dropout=True)
    assert isinstance(enc.lstm, LayerStack)
    sites = [io_of(m) for m in (enc.drop_input, enc.lstm.drop, enc.drop_output)]
    enc(tokens())
    assert [len(s) for s in sites] == [1, 2, 1]  # between layers: after each but the last
    for calls in sites:
        for x, y in calls:
            ratio = torch.where(x == 0, torch.zeros_like(x), y / x)
            assert torch.allclose(ratio, ratio[:, :1].expand_as(ratio))
            assert (ratio == 0).any() and not torch.equal(ratio[0, 0], ratio[1, 0])
    enc.eval()
    for calls in sites:
        calls.clear()
    enc(tokens())
    assert all(torch.equal(x, y) for calls in sites for x, y in calls)


def test_unset_site_rates_take_dropout_and_set_ones_their_own():
    enc = encoder(num_layers=2, dropout=0.4, dropout_input=0.1, dropout_output=0.0)
    assert (enc.drop_input.p, enc.lstm.dropout, enc.drop_output.p) == (0.1, 0.4, 0.0)
    with pytest.raises(ValueError, match="weight_drop must be < 1"):
        LSTMOptions(weight_drop=1.0)


def test_word_dropout_zeroes_whole_words_scales_the_rest_and_keeps_sparse_rows():
    enc = encoder(word_dropout=0.5, sparse_embedding=True)
    ids = torch.randint(0, 8, (B, T))  # 8 words, each many times
    torch.manual_seed(3)
    emb = enc.word_drop(enc.embedding(ids), ids, enc.num_classes)
    kept = set()
    for word in ids.unique().tolist():
        rows = emb[ids == word]
        if torch.equal(rows, torch.zeros_like(rows)):
            continue
        kept.add(word)
        assert torch.allclose(rows, (enc.embedding.weight[word] / 0.5).expand_as(rows))  # every occurrence scaled
    assert 0 < len(kept) < 8
    emb.sum().backward()
    grad = enc.embedding.weight.grad
    assert grad.is_sparse
    dense = grad.to_dense()
    assert all((dense[w] != 0).all() == (w in kept) for w in ids.unique().tolist())
    enc.eval()
    assert torch.equal(enc.word_drop(enc.embedding(ids), ids, enc.num_classes), enc.embedding(ids))


def test_weight_drop_masks_weight_hh_per_forward_without_touching_the_parameter():
    enc = encoder(num_layers=2, weight_drop=0.5)
    params = dict(enc.named_parameters())
    before = {k: v.detach().clone() for k, v in params.items()}
    dropped = dropped_recurrent_weights(enc.lstm, 0.5)
    assert sorted(dropped) == ["weight_hh_l0", "weight_hh_l1"]
    w, d = enc.lstm.weight_hh_l0, dropped["weight_hh_l0"]
    assert torch.equal(d[d != 0], (w / 0.5)[d != 0]) and 0.3 < (d == 0).float().mean() < 0.7
    ids = tokens()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.manual_seed(5)
        out_a, _ = enc(ids)
        out_b, _ = enc(ids)
        out_a.pow(2).sum().backward()
    assert not caught, [str(w.message) for w in caught]
    assert not torch.equal(out_a, out_b)  # a new mask for each forward
    assert all(p is params[k] for k, p in enc.named_parameters()) and len(params) == len(list(enc.parameters()))
    assert all(torch.equal(v, before[k]) for k, v in params.items())
    grad = enc.lstm.weight_hh_l0.grad
    assert grad is not None and 0.3 < (grad == 0).float().mean() < 0.7  # zero where the mask dropped
    # the forward is the LSTM with the dropped matrices: redraw them from the same seed
    torch.manual_seed(5)
    again = dropped_recurrent_weights(enc.lstm, 0.5)
    expected, _ = torch.func.functional_call(enc.lstm, again, (enc.embedding(ids), None))
    assert torch.equal(out_a, expected)
    plain = encoder(num_layers=2)
    plain.load_state_dict(enc.state_dict())
    enc.eval(), plain.eval()
    assert torch.equal(enc(ids)[0], plain(ids)[0])  # off in eval


def test_the_layer_stack_is_the_multi_layer_lstm_run_layer_by_layer():
    torch.manual_seed(0)
    lstm = nn.LSTM(D, D, 3, batch_first=True)
    torch.manual_seed(0)
    stack = LayerStack(D, [D] * 3, nn.Identity(), weight_drop=0.0)
    assert [p.shape for p in lstm.parameters()] == [p.shape for p in stack.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(lstm.parameters(), stack.parameters(), strict=True))
    x, state = torch.randn(B, T, D), (torch.randn(3, B, D), torch.randn(3, B, D))
    (y, (h, c)), (y2, (h2, c2)) = lstm(x, state), stack(x, state)
    for a, b in ((y, y2), (h, h2), (c, c2)):
        torch.testing.assert_close(a, b)
    # built by the encoder, it starts from the weights the single LSTM would have
    single, stacked = encoder(num_layers=3), encoder(num_layers=3, dropout=0.3, locked_dropout=True)
    assert all(torch.equal(a, b) for a, b in zip(single.parameters(), stacked.parameters(), strict=True))


def test_activation_penalties_equal_a_hand_computation_and_stay_out_of_evaluation():
    alpha, beta = 2.0, 1.5
    enc = encoder(dropout=0.3, activation_reg=alpha, temporal_activation_reg=beta)
    plain = encoder(dropout=0.3)
    out = FullSoftmax(N, D)
    top = io_of(enc.drop_output)
    batch = (tokens(1), tokens(2))
    for reduction, factor in (("mean", 1), ("sum", T)):
        top.clear()
        torch.manual_seed(7)
        window = window_loss(enc, out, batch, None, reduction)
        raw, dropped = top[0]
        ar = alpha * dropped.pow(2).mean()
        tar = beta * (raw[:, 1:] - raw[:, :-1]).pow(2).mean()
        torch.testing.assert_close(enc.penalties["ar"], ar)
        torch.testing.assert_close(enc.penalties["tar"], tar)
        torch.manual_seed(7)
        unregularized = window_loss(plain, out, batch, None, reduction)
        assert torch.equal(window.loss, unregularized.loss)  # train/loss is the output's loss alone
        torch.testing.assert_close(window.objective, (window.loss + ar + tar) * factor)
        assert window.reading.extra() == pytest.approx({"ar": float(ar), "tar": float(tar)})
    enc.eval(), plain.eval()
    batches = [(tokens(3), tokens(4)), (tokens(5), tokens(6))]
    assert evaluate(enc, out, batches).nll == evaluate(plain, out, batches).nll  # no penalty in perplexity
    assert enc.penalties == {}


def test_with_every_option_off_the_encoder_is_todays():
    """Today's encoder written out: embedding, one nn.LSTM with its own dropout, nn.Dropout on both sides, built
    and run from the same seed; the new encoder must give bit-identical weights, outputs and states."""
    torch.manual_seed(0)
    emb, lstm, drop = nn.Embedding(N, D), nn.LSTM(D, D, 2, dropout=0.3, batch_first=True), nn.Dropout(0.3)
    for p in [*emb.parameters(), *lstm.parameters()]:
        nn.init.uniform_(p, -0.1, 0.1)
    enc = encoder(num_layers=2, dropout=0.3)
    assert isinstance(enc.lstm, nn.LSTM)
    assert list(enc.state_dict()) == [f"embedding.{k}" for k in emb.state_dict()] + [
        f"lstm.{k}" for k in lstm.state_dict()
    ]
    ids = tokens()
    torch.manual_seed(9)
    out, (h, c) = lstm(drop(emb(ids)))
    expected = drop(out)
    torch.manual_seed(9)
    got, (h2, c2) = enc(ids)
    assert torch.equal(got, expected) and torch.equal(h, h2) and torch.equal(c, c2)
    assert enc.penalties == {}


def test_a_checkpoint_from_before_the_new_keys_matches_them_at_their_defaults():
    old = {"_target_": "lmtrain.model.lstm.LSTMEncoder", "emb_dim": 8, "dropout": 0.1}
    now = {**old, "locked_dropout": False, "dropout_input": None, "weight_drop": 0.0}
    assert same("model", old, now)
    assert not same("model", old, {**now, "weight_drop": 0.5})
    assert not same("model", {**old, "emb_dim": 9}, now)


AWD = ["model.num_layers=2", "model.locked_dropout=true", "model.dropout=0.2", "model.dropout_input=0.3",
       "model.dropout_between=0.25", "model.dropout_output=0.4", "model.word_dropout=0.1", "model.weight_drop=0.5",
       "model.activation_reg=2", "model.temporal_activation_reg=1", "model.sparse_embedding=true"]  # fmt: skip


def with_awd(tiny: list[str]) -> list[str]:
    return [o for o in tiny if not o.startswith("model.num_layers")] + AWD


@pytest.mark.slow  # one command-line run, ~15 s
def test_a_short_cli_run_with_every_regularizer_on(tmp_path):
    run = tmp_path / "run"
    run_cli([*with_awd(TINY), "logger=csv", "trainer.max_steps=12", f"hydra.run.dir={run}"], tmp_path)
    metrics = run_info(run)["metrics"]
    assert math.isfinite(metrics["val/ppl"]) and math.isfinite(metrics["test/ppl"])
    with open(run / "metrics.csv", newline="") as f:
        rows = [row for row in csv.DictReader(f) if row.get("train/loss")]
    assert len(rows) == 12 and all(float(r["train/ar"]) > 0 and float(r["train/tar"]) > 0 for r in rows)


def test_resume_with_every_regularizer_on_is_bit_equal_to_the_uninterrupted_run(tmp_path, monkeypatch):
    """The masks of every dropout and of weight drop come from the RNG a checkpoint restores."""
    from lmtrain.run.run import train
    from tests.conftest import TINY as IN_PROCESS
    from tests.conftest import make_config
    from tests.helpers import SimulatedCrash

    monkeypatch.setenv("LMTRAIN_CACHE_DIR", str(tmp_path / "cache"))
    common = [*with_awd(IN_PROCESS), "data.train_tokens=10000", "trainer.max_epochs=2", "checkpoint_every_n_steps=4",
              "test_after_fit=false"]  # fmt: skip
    straight, split = tmp_path / "straight", tmp_path / "split"
    expected = train(make_config([*common, f"run_dir={straight}"]))
    crash = ["+callbacks.crash._target_=tests.helpers.CrashAtStep", "+callbacks.crash.step=45"]  # in epoch 2
    with pytest.raises(SimulatedCrash):
        train(make_config([*common, *crash, f"run_dir={split}"]))
    resumed = train(make_config([*common, "ckpt_path=last", f"run_dir={split}"]))
    a, b = (torch.load(d / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"] for d in (straight, split))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert resumed["val/ppl"] == expected["val/ppl"]


def test_a_stack_of_layers_of_different_widths_carries_its_state_across_windows():
    """Two windows, the state carried between them, equal one window of both: the narrow layer's state is read back
    from the first entries of its padded row, as written."""
    torch.manual_seed(0)
    stack = LayerStack(D, [2 * D, 2 * D, D], nn.Identity(), weight_drop=0.0)
    x = torch.randn(B, 2 * T, D)
    whole, (h, c) = stack(x, None)
    first, state = stack(x[:, :T], None)
    second, (h2, c2) = stack(x[:, T:], state)
    assert whole.shape == (B, 2 * T, D) and h.shape == (3, B, 2 * D)
    torch.testing.assert_close(torch.cat([first, second], dim=1), whole)
    torch.testing.assert_close(h2, h)
    torch.testing.assert_close(c2, c)


def test_each_layer_of_a_stack_of_different_widths_gets_a_contiguous_state():
    """cuDNN's LSTM refuses a strided state ("rnn: hx is not contiguous"); the CPU's accepts it, so this checks what
    each layer receives: the narrow layer's slice of the padded state is made contiguous."""
    torch.manual_seed(0)
    stack = LayerStack(D, [2 * D, D], nn.Identity(), weight_drop=0.0)
    seen: list[bool] = []
    for layer in stack.layers:
        layer.register_forward_pre_hook(lambda _m, args: seen.extend(s.is_contiguous() for s in args[1] or ()))
    _, state = stack(torch.randn(B, T, D), None)
    stack(torch.randn(B, T, D), state)
    assert seen == [True] * 4

"""lab.traffic: the bytes an operator reads and writes at least, as the model says, on small cases."""

from __future__ import annotations

import torch
from lab.traffic import TrafficCounter, count_step_traffic, tensor_bytes

F32 = 4


def moved(fn) -> int:
    with TrafficCounter() as counter:
        fn()
    return counter.traffic.bytes


def test_a_product_reads_its_inputs_and_writes_its_output():
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    assert moved(lambda: a @ b) == (8 * 16 + 16 * 4 + 8 * 4) * F32


def test_in_place_and_out_operators_count_what_they_read_and_write_once():
    x, y = torch.randn(100), torch.randn(100)
    assert moved(lambda: x.add_(y)) == 3 * 100 * F32  # x read, y read, x written
    out = torch.empty(100)
    assert moved(lambda: torch.add(x, y, out=out)) == 3 * 100 * F32  # out written, not read


def test_a_gather_reads_the_rows_it_picks_not_its_whole_source():
    """Which bug: counting the (n, F) source of every gather, which made the walk look 50x heavier than it is."""
    table, ids = torch.randn(100_000, 8), torch.tensor([3, 3, 7])
    assert moved(lambda: table.index_select(0, ids)) == 2 * 3 * 8 * F32 + 3 * 8  # picked rows twice, int64 ids


def test_the_nll_loss_reads_the_targets_entries_and_its_gradient_writes_without_reading():
    """Which bug: counting the (N, C) log-probabilities as read by the loss and by its gradient, which only pick N
    entries and take the shape: 2 N C values at 10^6 classes that no kernel moves."""
    log_probs, target = torch.randn(4, 1000).log_softmax(1), torch.tensor([1, 2, 3, 4])
    assert moved(lambda: torch.ops.aten.nll_loss_forward(log_probs, target, None, 1, -100)) == (
        4 * F32 + 4 * 8 + 2 * F32  # the picked entries, the int64 targets; the loss and its total weight written
    )
    grad, weight = torch.ones(()), torch.tensor(4.0)
    backward = lambda: torch.ops.aten.nll_loss_backward(grad, log_probs, target, None, 1, -100, weight)  # noqa: E731
    assert moved(backward) == F32 + 4 * 8 + F32 + 4 * 1000 * F32  # grad, targets, total weight; the gradient written


def test_a_scatter_reads_and_writes_the_rows_it_touches():
    table, ids, rows = torch.zeros(100_000, 8), torch.tensor([1, 5]), torch.randn(2, 8)
    assert moved(lambda: table.index_add_(0, ids, rows)) == 2 * 8 + 3 * 2 * 8 * F32  # ids, rows, touched rows r+w


def test_a_sparse_tensor_counts_its_entries_not_its_dense_shape():
    sparse = torch.sparse_coo_tensor(torch.tensor([[0, 9]]), torch.randn(2, 8), (1_000_000, 8))
    assert tensor_bytes(sparse) == 2 * 8 + 2 * 8 * F32
    csr = torch.eye(1000).to_sparse_csr()
    assert tensor_bytes(csr) == 1001 * 8 + 1000 * 8 + 1000 * F32


def test_a_step_of_a_larger_vocabulary_moves_more_for_the_full_softmax_and_names_where():
    small_counts, small = count_step_traffic(["output=full", "model.hidden_dim=16", "step_forms=gpu"], 300, (4, 5))
    _, large = count_step_traffic(["output=full", "model.hidden_dim=16", "step_forms=gpu"], 3000, (4, 5))
    assert small_counts.syncs == 1
    assert large.bytes > small.bytes  # the (N, n) logits and the (n, d) class matrix grow with n
    assert any(site["where"].startswith("output/full.py") for site in large.top(10))


def test_the_script_writes_a_record_and_its_table(monkeypatch, tmp_path):
    import importlib
    import json
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "scripts"))
    bench_traffic = importlib.import_module("bench_traffic")
    out = tmp_path / "traffic.json"
    args = ["--sizes", "300", "--outputs", "full:model.hidden_dim=16,unigram:model.hidden_dim=16", "--batch", "4x5"]
    assert bench_traffic.main([*args, "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert [(r["output"], r["n"], r["syncs"]) for r in record["rows"]] == [
        ("full:model.hidden_dim=16", 300, 1),
        ("unigram:model.hidden_dim=16", 300, 1),
    ]
    table = out.with_suffix(".md").read_text()
    row = next(r for r in record["rows"] if r["output"].startswith("unigram"))
    cell = f"{row['bytes'] / 2**30:.2f} / {row['macs'] / 1e9:.1f} / {row['launches']} / 1"
    assert f"| unigram:model.hidden_dim=16 | {cell} |" in table and row["macs"] > 0


def test_products_count_their_multiply_adds_and_a_sparse_factor_its_entries():
    """Which bugs: a sparse factor counted at its dense shape (the walk's 0/1 ancestor matrix would look 2^t / t
    times heavier than its product is), a batched product counted as one, elementwise work counted as products."""

    def macs(fn) -> int:
        with TrafficCounter() as counter:
            fn()
        return counter.traffic.macs

    a, b, bias = torch.randn(8, 16), torch.randn(16, 4), torch.randn(4)
    assert macs(lambda: a @ b) == macs(lambda: torch.addmm(bias, a, b)) == 8 * 16 * 4
    assert macs(lambda: torch.bmm(a.expand(3, 8, 16), b.expand(3, 16, 4))) == 3 * 8 * 16 * 4
    assert macs(lambda: a @ b[:, 0]) == 8 * 16
    ones = torch.zeros(8, 16)
    ones[torch.arange(8), torch.arange(8)] = 1.0  # 8 entries
    sparse = ones.to_sparse_csr()
    assert macs(lambda: torch.mm(sparse, b)) == 8 * 4
    assert macs(lambda: (a * 2).exp().sum()) == 0


def test_a_sparse_update_of_a_dense_matrix_touches_only_its_rows():
    """Which bug: a sparse SGD step on a 10^6-row embedding counted as a pass over the whole matrix (3 GiB)."""
    weight = torch.zeros(100_000, 8)
    grad = torch.sparse_coo_tensor(torch.tensor([[2, 7, 9]]), torch.randn(3, 8), (100_000, 8))
    assert moved(lambda: weight.add_(grad, alpha=-1.0)) == 3 * 8 + 3 * 8 * F32 + 2 * 3 * 8 * F32

"""A kernel tree carried as kept (``KernelSampler.kept_state``) and put back over a tree rebuilt from the same weights
(``restore_kept_state``) is the kept tree bit for bit: node sums, delta counts, the GPU paths' update count and the
cached features, also a cached row that a fresh computation would round differently. What a checkpoint written off
the run's schedule (a stop's, a timed one) relies on; tests/test_stop.py runs it end to end."""

from __future__ import annotations

import pytest
import torch

from lmtrain.sampler import QuadraticSampler, RFFSampler

N_CLASSES, DIM = 40, 6


def make(kind: str, backend: str):
    if kind == "rff":
        return RFFSampler(D=16, leaf_size=4, unigram_share=0.0, backend=backend, feature_cache="full")
    return QuadraticSampler(leaf_size=4, unigram_share=0.0, backend=backend)


def trained(kind: str, backend: str) -> tuple[object, torch.Tensor]:
    """A sampler taken through 12 sparse updates (a single row, a few, a repeat) of drifting weights."""
    torch.manual_seed(0)
    sampler, weight = make(kind, backend), torch.randn(N_CLASSES, DIM)
    sampler.rebuild(weight)
    for step in range(12):
        rows = torch.randint(N_CLASSES, (1 + step % 5,))
        weight[rows] += 0.1 * torch.randn(rows.numel(), DIM)
        sampler.update(weight, rows)
    return sampler, weight


def state_of(sampler) -> dict[str, torch.Tensor]:
    store = sampler.tree.store
    return {
        "nodes": store.nodes.clone(),
        "deltas": store.deltas.clone(),
        "updates": torch.tensor(store.updates),
        "table": store.cache.table.clone(),
    }


@pytest.mark.parametrize("backend", ["walk", "fixed"])
@pytest.mark.parametrize("kind", ["rff", "quadratic"])
def test_kept_state_put_back_over_a_rebuild_is_the_kept_tree(kind, backend):
    kept, weight = trained(kind, backend)
    table = kept.tree.store.cache.table
    if table.numel():  # a cached row a fresh computation rounds differently (one bit here, as phi of one row may)
        table[3] = torch.nextafter(table[3], torch.full_like(table[3], 2.0))
    state = kept.kept_state()
    loaded = make(kind, backend)
    loaded.rebuild(weight.clone())  # what a checkpoint load does
    assert not torch.equal(loaded.tree.store.nodes, kept.tree.store.nodes)  # the deltas rounded: a rebuild differs
    loaded.restore_kept_state(state)
    for key, value in state_of(kept).items():
        assert torch.equal(state_of(loaded)[key], value), key
    if table.numel():  # carried: the rows a fill from the weights would not give back, and only those
        fresh = make(kind, backend)
        fresh.rebuild(weight.clone())
        fill = fresh.tree.store.cache.table
        differ = [j for j in range(N_CLASSES) if not torch.equal(fill[j], table[j])]
        assert 3 in differ and state["table_ids"].tolist() == differ
    rows = torch.tensor([5, 17, 17, 30])  # both go on alike: one more update, then the same draws
    weight[rows] += 0.1
    kept.update(weight, rows)
    loaded.update(weight.clone(), rows)
    query = torch.randn(8, DIM)
    draws = []
    for sampler in (kept, loaded):
        torch.manual_seed(1)
        draws.append(sampler.propose(query).draw(5))
    torch.testing.assert_close(draws[1].ids, draws[0].ids, rtol=0, atol=0)
    torch.testing.assert_close(draws[1].log_q, draws[0].log_q, rtol=0, atol=0)


def test_a_tree_not_built_yet_keeps_nothing():
    assert RFFSampler(D=16, unigram_share=0.0).kept_state() == {}

"""KernelTree as a composition (store, walk, scorer around one feature map): what moves, what is checkpointed."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from lmtrain.sampler.kernel import KernelTree, RandomFourierFeatures
from tests.conftest import DEVICES

pytestmark = pytest.mark.usefixtures("one_thread")


def built_tree() -> tuple[KernelTree, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    weight = 0.5 * torch.randn(37, 5, generator=gen)
    tree = KernelTree(RandomFourierFeatures(D=16, seed=0), leaf_size=4, feature_cache="full")
    tree.rebuild(weight)
    return tree, weight


def test_the_parts_share_one_feature_map_and_only_it_is_checkpointed():
    """The state-dict keys are those of the tree before it was split into parts (checkpoints written then load)."""
    tree, _ = built_tree()
    assert tree.store.features is tree.features and tree.scorer.features is tree.features
    assert tree.walk.store is tree.store and tree.scorer.store is tree.store
    assert list(tree.state_dict()) == ["features.omega"]
    assert [name for name, _ in tree.named_modules()] == ["", "features", "store", "store.cache"]


FREQUENCIES = (
    "import torch; from lmtrain.sampler.kernel import RandomFourierFeatures; "
    "print(RandomFourierFeatures(D=64, seed=3).frequencies(20).double().sum().item().hex())"
)


def test_a_seed_gives_the_same_frequencies_on_every_cpu():
    """The frequencies of a seed do not depend on the CPU's vector width (torch's float32 normal draws do: its AVX2
    path rounds them differently), so a run's feature map is the same on every machine; fails for a float32 draw on
    any x86 CPU with AVX2, where both of torch's code paths can be forced."""
    drawn = set()
    for capability in ("default", "avx2"):
        env = {**os.environ, "ATEN_CPU_CAPABILITY": capability}
        done = subprocess.run([sys.executable, "-c", FREQUENCIES], env=env, capture_output=True, text=True, check=True)
        drawn.add(done.stdout.strip())
    assert len(drawn) == 1


@pytest.mark.parametrize("device", DEVICES)
def test_a_move_reaches_every_part_and_sampling_goes_on(device):
    """``module.to`` moves the store's buffers and its reference to the weights (``TreeStore._apply``) and the
    feature map once; the walk and the scorer read the moved tensors, so log q is unchanged by the move."""
    tree, _ = built_tree()
    gen = torch.Generator().manual_seed(1)
    query = torch.randn(3, 5, generator=gen)
    ids = torch.randint(0, 37, (3, 7), generator=gen)
    before = tree.log_q(query, ids)
    psi_before = tree.log_q_all_mixture(tree.mixture(query))
    tree.to(device=device, dtype=torch.float64)
    moved = [tree.nodes, tree.store.floor, tree.store.cache.table, tree.weight, tree.features.omega]
    assert all(t.device.type == device and t.dtype == torch.float64 for t in moved)
    query, ids = query.to(device, torch.float64), ids.to(device)
    torch.testing.assert_close(tree.log_q(query, ids).float().cpu(), before, rtol=1e-4, atol=1e-5)
    psi_after = tree.log_q_all_mixture(tree.mixture(query)).float().cpu()  # float64 there: float32's tolerance
    torch.testing.assert_close(psi_after, psi_before, rtol=1e-4, atol=1e-5)
    drawn, log_q = tree.sample(query, 5)
    assert drawn.device.type == device
    torch.testing.assert_close(log_q, tree.log_q(query, drawn))

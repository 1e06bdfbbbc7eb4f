"""Two training steps of a small model with the same windows and the same forced negatives, so that two code paths
(the CPU and GPU paths, or two devices) can be compared on everything but the random draw.

The sampled strategies draw from the device's random generator, and the two paths draw differently (the GPU
paths draw the ids alone and look their log q up afterwards), so ``force_draws`` fixes the ids on both: each path
scores them and computes their log q with its own proposal.
"""

from __future__ import annotations

import torch
from lab.launches import synthetic_counts
from omegaconf import DictConfig

from lmtrain.common.execution import Execution, set_execution
from lmtrain.config import compose_config
from lmtrain.output.sampled.base import SampledOutput
from lmtrain.sampler.proposal import Proposal
from lmtrain.training.build import build_module
from lmtrain.training.module import LanguageModel
from lmtrain.training.step import train_step
from tests.test_output_contract import OUTPUTS, output_has_samples

VOCAB, BATCH, M = 300, (4, 6), 20
SMALL = ["data=synthetic", f"data.vocab_size={VOCAB}", "model.emb_dim=16", "model.hidden_dim=16", "model.num_layers=1"]
SHARED = "++output.shared_negatives=true"
CASES = [*((o, "") for o in OUTPUTS), ("rff", SHARED), ("quadratic", SHARED)]
CASE_IDS = [f"{o}{'-shared' if e else ''}" for o, e in CASES]


def config(output: str, extra: str) -> DictConfig:
    samples = [f"output.num_samples={M}"] if output_has_samples(output) else []
    return compose_config([*SMALL, f"output={output}", *samples, *([extra] if extra else [])])


def built(cfg: DictConfig, device: str, execution: Execution) -> LanguageModel:
    """The model of ``cfg``, the same weights on every call (seeded), on ``device``, taking ``execution``'s paths
    (set explicitly: ``auto`` would pick the GPU paths for a CPU model whenever a GPU is present)."""
    torch.manual_seed(0)
    counts = synthetic_counts(VOCAB)
    stream = torch.multinomial(counts.double(), 5_000, replacement=True, generator=torch.Generator().manual_seed(1))
    module = build_module(cfg, VOCAB, counts, stream).to(device)
    set_execution(module, execution)
    return module


def force_draws(layer: SampledOutput, ids: torch.Tensor) -> None:
    """``layer`` draws ``ids`` as its negatives, with their log q under its own step's proposal, on either path:
    ``draw`` (ids and log q) and ``negative_ids`` (the ids alone, the GPU paths' per-position draw)."""

    def draw(hidden: torch.Tensor, inputs: torch.Tensor | None = None, proposal: Proposal | None = None):
        proposal = layer.propose(layer.query(hidden), inputs) if proposal is None else proposal
        forced = ids.to(hidden.device)
        return forced, proposal.log_q(forced), None

    # instance attributes: scored_draw and joint_draw call them in place of the methods
    layer.draw = draw
    layer.negative_ids = lambda proposal, positions: ids.to(layer.weight.device)


def two_steps(cfg: DictConfig, device: str, execution: Execution) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The losses of two steps (forward, backward, clipping, SGD, the after-step hook, e.g. a kernel tree's
    update) on fixed windows and negatives, and every weight after them (on the CPU)."""
    gen = torch.Generator().manual_seed(2)
    windows = torch.randint(VOCAB, (2, BATCH[0], BATCH[1] + 1), generator=gen)
    module = built(cfg, device, execution)
    if isinstance(module.output, SampledOutput):
        shape = (M,) if module.output.shared_negatives else (BATCH[0] * BATCH[1], M)
        force_draws(module.output, torch.randint(VOCAB, shape, generator=torch.Generator().manual_seed(3)))
    optimizer = module.configure_optimizers()["optimizer"]
    state, losses = None, []
    for tokens in windows.to(device):
        batch = (tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())
        window = train_step(module.encoder, module.output, batch, state, optimizer, cfg.optim.clip)
        state = window.state
        losses.append(window.value)  # on CUDA: the pinned copy read after its event (LossReading)
        assert window.value == float(window.loss)
    return losses, {name: p.detach().cpu() for name, p in module.named_parameters()}


def assert_same_steps(ours: tuple[list[float], dict], reference: tuple[list[float], dict]) -> None:
    """Losses and weights agree to float32 rounding (1e-4 relative)."""
    torch.testing.assert_close(torch.tensor(ours[0]), torch.tensor(reference[0]), rtol=1e-4, atol=1e-5)
    for name, value in reference[1].items():
        torch.testing.assert_close(ours[1][name], value, rtol=1e-4, atol=1e-5, msg=name)

"""On a GPU the CUDA paths compute what the CPU paths compute: a training step of every output strategy, and the
kernel samplers' draws and log q. Marked ``cuda``: skipped without a GPU; ``pytest -m cuda`` runs them, and
``scripts/bench_gpu.py`` runs them first.

The sampled strategies draw their negatives from the device's random generator, which differs between devices,
so the step tests force the same negatives on both (``force_draws``): the ids are fixed, and each device scores
them and computes their log q with its own proposal, so everything but the random draw is compared.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from omegaconf import DictConfig

from lmtrain.config import compose_config
from lmtrain.output.sampled.base import SampledOutput
from lmtrain.tools.launches import synthetic_counts
from lmtrain.training.build import build_module, build_output
from lmtrain.training.module import LanguageModel
from lmtrain.training.step import train_step
from tests.test_output_contract import OUTPUTS, output_has_samples

pytestmark = pytest.mark.cuda

VOCAB, BATCH, M = 300, (4, 6), 20
SMALL = ["data=synthetic", f"data.vocab_size={VOCAB}", "model.emb_dim=16", "model.hidden_dim=16", "model.num_layers=1"]
SHARED = "++output.shared_negatives=true"
CASES = [*((o, "") for o in OUTPUTS), ("rff", SHARED), ("quadratic", SHARED)]


@pytest.fixture
def exact_float32() -> Iterator[None]:
    """No TensorFloat-32 in cuDNN's LSTM or in matrix products: float32 on both devices."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def config(output: str, extra: str) -> DictConfig:
    samples = [f"output.num_samples={M}"] if output_has_samples(output) else []
    return compose_config([*SMALL, f"output={output}", *samples, *([extra] if extra else [])])


def built(cfg: DictConfig, device: str) -> LanguageModel:
    """The model of ``cfg``, the same weights on every call (seeded), moved to ``device``."""
    torch.manual_seed(0)
    counts = synthetic_counts(VOCAB)
    stream = torch.multinomial(counts.double(), 5_000, replacement=True, generator=torch.Generator().manual_seed(1))
    return build_module(cfg, VOCAB, counts, stream).to(device)


def force_draws(layer: SampledOutput, ids: torch.Tensor) -> None:
    """``layer`` draws ``ids`` as its negatives, with their log q under its own step's proposal."""

    def draw(hidden: torch.Tensor, inputs: torch.Tensor | None = None, proposal=None):
        proposal = layer.propose(layer.query(hidden), inputs) if proposal is None else proposal
        forced = ids.to(hidden.device)
        return forced, proposal.log_q(forced), None

    layer.draw = draw  # an instance attribute: scored_draw calls it in place of the method


@pytest.mark.parametrize(("output", "extra"), CASES, ids=[f"{o}{'-shared' if e else ''}" for o, e in CASES])
def test_two_training_steps_on_cuda_equal_the_cpu_steps(output, extra, exact_float32):
    """Two steps (forward, backward, clipping, SGD, the after-step hook, e.g. a kernel tree's update) on the same
    windows and negatives: the losses agree to float32 rounding, and so do the weights after them."""
    cfg = config(output, extra)
    gen = torch.Generator().manual_seed(2)
    windows = torch.randint(VOCAB, (2, BATCH[0], BATCH[1] + 1), generator=gen)
    positions = BATCH[0] * BATCH[1]
    losses, weights = {}, {}
    for device in ("cpu", "cuda"):
        module = built(cfg, device)
        if isinstance(module.output, SampledOutput):
            shape = (M,) if module.output.shared_negatives else (positions, M)
            forced = torch.randint(VOCAB, shape, generator=torch.Generator().manual_seed(3))
            force_draws(module.output, forced)
        optimizer = module.configure_optimizers()["optimizer"]
        state, losses[device] = None, []
        for tokens in windows.to(device):
            batch = (tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())
            window = train_step(module.encoder, module.output, batch, state, optimizer, cfg.optim.clip)
            state = window.state
            losses[device].append(window.value)  # on CUDA: the pinned copy read after its event (LossReading)
            assert window.value == float(window.loss)
        weights[device] = {name: p.detach().cpu() for name, p in module.named_parameters()}
    torch.testing.assert_close(torch.tensor(losses["cuda"]), torch.tensor(losses["cpu"]), rtol=1e-4, atol=1e-5)
    for name, value in weights["cpu"].items():
        torch.testing.assert_close(weights["cuda"][name], value, rtol=1e-4, atol=1e-5, msg=name)


def kernel_layer(output: str, shared: bool, device: str) -> SampledOutput:
    cfg = compose_config([f"output={output}", f"++output.shared_negatives={str(shared).lower()}"])
    torch.manual_seed(0)
    counts = synthetic_counts(60)
    return build_output(cfg, 60, 8, counts).to(device)


@pytest.mark.parametrize("shared", [False, True], ids=["per_position", "shared"])
@pytest.mark.parametrize("output", ["quadratic", "rff"])
def test_kernel_draws_on_cuda_come_with_the_cpu_log_q_and_follow_it(output, shared, exact_float32):
    """The ids a kernel sampler draws on the GPU come with the log q the CPU path gives those ids (1e-5), and their
    frequencies follow it: 40,000 draws for one query are within 0.05 in total variation of the CPU's q (a correct
    walk gives about 0.015; a walk that ignored the kernel, uniform over 60 classes, is 0.3 or more away)."""
    cpu, gpu = kernel_layer(output, shared, "cpu"), kernel_layer(output, shared, "cuda")
    hidden = 2 * torch.randn(12, 8, generator=torch.Generator().manual_seed(4))
    ids, log_q, _ = gpu.draw(hidden.cuda())
    assert ids.device.type == "cuda" and ids.shape == ((cpu.num_samples,) if shared else (12, cpu.num_samples))
    expected = cpu.propose(cpu.query(hidden)).log_q(ids.cpu())
    torch.testing.assert_close(log_q.cpu(), expected, rtol=1e-5, atol=1e-5)

    one = hidden[:1]
    drawn, _ = gpu.sampler.sample(gpu.query(one.cuda()), 40_000)
    counts = torch.bincount(drawn.reshape(-1).cpu(), minlength=60).double()
    q = cpu.propose(cpu.query(one)).log_q(torch.arange(60).unsqueeze(0) if not shared else torch.arange(60))
    distance = 0.5 * (counts / counts.sum() - q.reshape(-1).double().exp()).abs().sum()
    assert distance < 0.05, f"draws on cuda are {distance:.3f} away from the CPU's q in total variation"

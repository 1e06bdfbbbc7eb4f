"""On a GPU the CUDA paths compute what the CPU paths compute: a training step of every output strategy (tied and
untied), the kernel samplers' draws and log q, and a weight-dropped LSTM, which stays on cuDNN. Marked ``cuda``:
skipped without a GPU; ``pytest -m cuda`` runs them, and ``scripts/bench_gpu.py`` runs them first.

The step tests force the same negatives on both devices (``tests/forced_steps.py``), so everything but the random
draw is compared.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
import torch
from lab.launches import synthetic_counts
from torch import nn
from torch.profiler import ProfilerActivity, profile

from lmtrain.config import compose_config
from lmtrain.model import weight_drop
from lmtrain.model.weight_drop import run_lstm
from lmtrain.output.sampled.base import SampledOutput
from lmtrain.run.build import build_output
from tests.forced_steps import CASE_IDS, CASES, assert_same_steps, config, two_steps
from tests.helpers import draw_negatives, sample_from

pytestmark = pytest.mark.cuda


@pytest.fixture
def exact_float32() -> Iterator[None]:
    """No TensorFloat-32 in cuDNN's LSTM or in matrix products: float32 on both devices."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.mark.parametrize(("output", "extra"), CASES, ids=CASE_IDS)
def test_two_training_steps_on_cuda_equal_the_cpu_steps(output, extra, exact_float32):
    """Two steps of the GPU paths on CUDA against the CPU paths on the CPU (what a seeded CPU run computes), on the
    same windows and negatives: the losses agree to float32 rounding, and so do the weights after them."""
    cfg = config(output, extra)
    assert_same_steps(two_steps(cfg, "cuda", gpu_forms=True), two_steps(cfg, "cpu", gpu_forms=False))


def kernel_layer(output: str, shared: bool, device: str) -> SampledOutput:
    """The layer on ``device`` in that device's step forms (said explicitly: on this machine ``auto`` takes a GPU's
    for both), the same weights on every call."""
    forms = "gpu" if device == "cuda" else "cpu"
    cfg = compose_config(
        [f"output={output}", f"++output.shared_negatives={str(shared).lower()}", f"step_forms={forms}"]
    )
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
    assert (cpu.sampler.tree.backend.name, gpu.sampler.tree.backend.name) == ("walk", "fixed")
    hidden = 2 * torch.randn(12, 8, generator=torch.Generator().manual_seed(4))
    ids, log_q, _ = draw_negatives(gpu, hidden.cuda())
    assert ids.device.type == "cuda" and ids.shape == ((cpu.num_samples,) if shared else (12, cpu.num_samples))
    expected = cpu.propose(cpu.query(hidden)).log_q(ids.cpu())
    torch.testing.assert_close(log_q.cpu(), expected, rtol=1e-5, atol=1e-5)

    one = hidden[:1]
    drawn, _ = sample_from(gpu.sampler, gpu.query(one.cuda()), 40_000)
    counts = torch.bincount(drawn.reshape(-1).cpu(), minlength=60).double()
    q = cpu.propose(cpu.query(one)).log_q(torch.arange(60).unsqueeze(0) if not shared else torch.arange(60))
    distance = 0.5 * (counts / counts.sum() - q.reshape(-1).double().exp()).abs().sum()
    assert distance < 0.05, f"draws on cuda are {distance:.3f} away from the CPU's q in total variation"


def weight_dropped_steps(lstm: nn.LSTM, inputs: torch.Tensor) -> list[torch.Tensor]:
    """Two training forwards of ``run_lstm`` with weight drop, the backward of both, then one evaluation forward: the
    outputs, then every weight's gradient and value, on the CPU."""
    lstm.train()
    outs = [run_lstm(lstm, inputs, None, 0.5)[0] for _ in range(2)]
    sum(o.pow(2).sum() for o in outs).backward()
    lstm.eval()
    outs.append(run_lstm(lstm, inputs, None, 0.5)[0])
    params = [p for _, p in sorted(lstm.named_parameters())]
    return [t.detach().cpu() for t in (*outs, *(p.grad for p in params), *params)]


def test_weight_drop_on_cuda_runs_cudnn_and_computes_what_the_cpu_computes(monkeypatch, exact_float32):
    """Weight drop keeps cuDNN's LSTM on a GPU (``aten::_cudnn_rnn`` in the profile), warns about nothing (no
    re-registered parameters, no weights outside cuDNN's flat buffer left over), and computes what the CPU computes
    under the same masks: outputs, every gradient, and the parameters afterwards (a repacking of cuDNN's buffer that
    wrote the dropped matrices into the parameters would change those, and the evaluation forward after them)."""
    torch.manual_seed(0)
    cpu = nn.LSTM(16, 16, 2, batch_first=True)
    gpu = nn.LSTM(16, 16, 2, batch_first=True).cuda()
    gpu.load_state_dict(cpu.state_dict())
    masks = {n: torch.rand_like(w).gt(0.5).float().div(0.5) for n, w in cpu.named_parameters() if "weight_hh" in n}
    monkeypatch.setattr(
        weight_drop,
        "dropped_recurrent_weights",
        lambda lstm, p: {n: getattr(lstm, n) * m.to(getattr(lstm, n).device) for n, m in masks.items()},
    )
    inputs = torch.randn(4, 7, 16, generator=torch.Generator().manual_seed(1))
    expected = weight_dropped_steps(cpu, inputs)
    with profile(activities=[ProfilerActivity.CPU]) as prof, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # the profiler's own notes come at its exit, outside this block
        got = weight_dropped_steps(gpu, inputs.cuda())
    assert not caught, [str(w.message) for w in caught]
    assert any(e.key == "aten::_cudnn_rnn" for e in prof.key_averages()), "the weight-dropped LSTM left cuDNN"
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)

"""Two training steps of a small model with the same windows and the same forced negatives, so that two forms (a
GPU's and a CPU's: the kernel tree's backends, adaptive's loss) or two devices can be compared on everything but the
random draw.

The sampled strategies draw from the device's random generator, and the two backends draw differently, so
``force_draws`` fixes the ids on both: each scores them and computes their log q with its own proposal.
"""

from __future__ import annotations

import torch
from lab.launches import synthetic_counts
from omegaconf import DictConfig, OmegaConf

from lmtrain.config import compose_config
from lmtrain.output.base import OutputLayer
from lmtrain.output.sampled.base import Drawn
from lmtrain.run.build import build_module
from lmtrain.sampler.proposal import Proposal
from lmtrain.training.module import LanguageModel
from lmtrain.training.step import train_step
from tests.test_output_contract import OUTPUTS, output_has_samples

VOCAB, BATCH, M = 300, (4, 6), 20
SMALL = ["data=synthetic", f"data.vocab_size={VOCAB}", "model.emb_dim=16", "model.hidden_dim=16", "model.num_layers=1"]
SHARED = "++output.shared_negatives=true"
TIED = "model.tie_weights=true"  # one matrix read by both sides: the kernel tree follows the input side's rows too
# tied with a wider lower layer (AWD-LSTM's shape): the top layer's state is a strided slice of the padded state
TIED_NARROW = "model.tie_weights=true model.num_layers=2 model.hidden_dim=24"
CASES = [
    *((o, "") for o in OUTPUTS),
    ("rff", SHARED),
    ("quadratic", SHARED),
    *((o, TIED) for o in ("full", "unigram", "rff", "quadratic", "nce")),
    ("full", TIED_NARROW),
    # proposals chosen by sampler= alone, and self-normalisation's penalty. Not here: target sampling (its set is the
    # batch's targets topped up by the device's generator, which forced ids would replace) and infrequent
    # normalisation (its positions come from the device's generator)
    *(("sampled", f"sampler={name}") for name in ("adaptive_ngram", "inbatch")),
    ("full", "output.self_normalize=0.1"),
]
SUFFIX = {"": "", SHARED: "-shared", TIED: "-tied", TIED_NARROW: "-tied-narrow"}
CASE_IDS = [f"{o}{SUFFIX.get(e, '-' + e.replace('sampler=', '').replace('output.', ''))}" for o, e in CASES]


def config(output: str, extra: str) -> DictConfig:
    samples = [f"output.num_samples={M}"] if output_has_samples(output) else []
    return compose_config([*SMALL, f"output={output}", *samples, *extra.split()])


def built(cfg: DictConfig, device: str, gpu_forms: bool) -> LanguageModel:
    """The model of ``cfg``, the same weights on every call (seeded), on ``device``, built in a GPU's step forms or a
    CPU's (``step_forms``, set explicitly: the device alone would choose them)."""
    torch.manual_seed(0)
    counts = synthetic_counts(VOCAB)
    stream = torch.multinomial(counts.double(), 5_000, replacement=True, generator=torch.Generator().manual_seed(1))
    cfg = OmegaConf.merge(cfg, {"step_forms": "gpu" if gpu_forms else "cpu"})
    return build_module(cfg, VOCAB, counts, stream).to(device)


def force_draws(layer: OutputLayer, ids: torch.Tensor) -> None:
    """``layer`` draws ``ids`` as its negatives, with their log q and the targets' under its own step's proposal."""
    propose = layer.propose
    targets: dict[str, torch.Tensor | None] = {}

    def proposal_with_targets(query: torch.Tensor, inputs=None, target=None) -> Proposal:
        targets["step"] = target
        return propose(query, inputs, target)

    def draw(proposal: Proposal) -> Drawn:
        forced, target = ids.to(proposal.device), targets["step"]
        target_log_q = None if target is None else proposal.log_q(target.view(-1, 1))  # None: the loss reads none
        return Drawn(forced, proposal.log_q(forced), target_log_q, None)

    # instance attributes: ``negatives`` calls them in place of the methods
    layer.propose, layer.draw = proposal_with_targets, draw


def two_steps(cfg: DictConfig, device: str, gpu_forms: bool) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The losses of two steps (forward, backward, clipping, SGD, the after-step hook, e.g. a kernel tree's
    update) on fixed windows and negatives, and every weight after them (on the CPU)."""
    gen = torch.Generator().manual_seed(2)
    windows = torch.randint(VOCAB, (2, BATCH[0], BATCH[1] + 1), generator=gen)
    module = built(cfg, device, gpu_forms)
    if hasattr(module.output, "draw"):  # the sampled family, and charcnn (its own draw of shared negatives)
        shape = (M,) if getattr(module.output, "shared_negatives", True) else (BATCH[0] * BATCH[1], M)
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

"""Sample text from a trained model, continuing a prompt.

    python -m lmtrain.generate ckpt_path=RUN prompt="the company said" num_tokens=50 temperature=1.0 top_k=0 seed=1

The prompt is read like training text: words outside the run's vocabulary are read as ``<unk>``, and when the
vocabulary has ``<eos>`` (text corpora) the model first reads an ``<eos>``, so the prompt (or, when it is empty,
the text) starts a new sentence; a newline in the prompt is an ``<eos>``. Each next word is drawn from the model's
exact distribution (``OutputLayer.log_probs_all``) with its log-probabilities divided by ``temperature``, among
the ``top_k`` most likely words (0: all; 1: greedy). The draws use a CPU generator seeded with ``seed``, so the same
seed gives the same text on every device. Prints the prompt and its continuation, ``<eos>`` as a line break.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import torch
from torch import Tensor

from lmtrain.cli.failures import fail
from lmtrain.data.tokenizer import EOS, text_lines
from lmtrain.data.vocab import Vocabulary
from lmtrain.tools.trained import load_trained, parse_options
from lmtrain.training.module import LanguageModel

DEFAULTS: dict[str, str] = {
    "ckpt_path": "",
    "prompt": "",
    "num_tokens": "50",
    "temperature": "1.0",
    "top_k": "0",
    "seed": "0",
    "device": "auto",
}


@dataclass(frozen=True)
class Sampling:
    """How to draw: ``num_tokens`` words at ``temperature`` (> 0) among the ``top_k`` most likely (0: all)."""

    num_tokens: int
    temperature: float
    top_k: int
    seed: int

    @classmethod
    def from_options(cls, options: dict[str, str]) -> Sampling:
        """Parse and check the command-line values; ValueError names the bad one."""
        values = {}
        for key, kind in (("num_tokens", int), ("temperature", float), ("top_k", int), ("seed", int)):
            try:
                values[key] = kind(options[key])
            except ValueError:
                what = "a number" if kind is float else "an integer"
                raise ValueError(f"{key}={options[key]!r} is not {what}") from None
        if not (values["temperature"] > 0 and math.isfinite(values["temperature"])):
            raise ValueError(f"temperature={options['temperature']} must be a positive number (top_k=1 for greedy)")
        if values["num_tokens"] < 0 or values["top_k"] < 0:
            raise ValueError("num_tokens and top_k must be >= 0 (top_k=0: sample from the whole vocabulary)")
        return cls(**values)


@dataclass(frozen=True)
class Generation:
    """A prompt's continuation: the word ids and words drawn, and the printable text (prompt included)."""

    ids: list[int]
    words: list[str]
    text: str


def context_ids(vocab: Vocabulary, prompt: str) -> tuple[list[int], int]:
    """The ids the model reads before the first drawn word (``<eos>`` first when the vocabulary has it; the
    prompt's lines with ``<eos>`` between them), and how many prompt words were read as ``<unk>``."""
    lines, unknown = vocab.encode_text(prompt)
    ids = [token for line in lines for token in line]
    if vocab.eos is not None:
        ids = [vocab.eos, *ids[:-1]] if ids else [vocab.eos]  # the last line's <eos> would end the prompt
    if not ids:
        raise ValueError(f"this run's vocabulary has no {EOS} to start from (synthetic data): give a prompt")
    return ids, sum(unknown)


def pick(log_p: Tensor, sampling: Sampling, generator: torch.Generator) -> int:
    """One id drawn from exact log-probabilities (n,) at ``sampling``'s temperature and top-k."""
    logits = log_p.double() / sampling.temperature
    if 0 < sampling.top_k < logits.numel():
        top = logits.topk(sampling.top_k).indices  # exactly k candidates, also with ties
        logits = torch.full_like(logits, float("-inf")).index_copy(0, top, logits[top])
    return int(torch.multinomial(torch.softmax(logits, dim=0), 1, generator=generator))


@torch.no_grad()
def sample(module: LanguageModel, context: list[int], sampling: Sampling, device: torch.device) -> list[int]:
    """``sampling.num_tokens`` ids drawn one after the other, each read back by the model, after ``context``."""
    generator = torch.Generator().manual_seed(sampling.seed)  # on the CPU: the same draws on every device
    hidden, state = module.encoder(torch.tensor([context], device=device))  # (1, T, d)
    drawn: list[int] = []
    for _ in range(sampling.num_tokens):
        log_p = module.output.log_probs_all(hidden[:, -1]).float().cpu()[0]  # (n,)
        drawn.append(pick(log_p, sampling, generator))
        hidden, state = module.encoder(torch.tensor([[drawn[-1]]], device=device), state)  # (1, 1, d)
    return drawn


def render(words: list[str]) -> str:
    """Words as text: spaces between them, a line break for each ``<eos>``."""
    lines, line = [], []
    for word in words:
        if word == EOS:
            lines.append(" ".join(line))
            line = []
        else:
            line.append(word)
    return "\n".join([*lines, " ".join(line)])


def generate(argv: list[str]) -> Generation:
    """Run ``python -m lmtrain.generate`` with these arguments; returns what it printed, as a Generation."""
    options, overrides = parse_options(argv, DEFAULTS)
    sampling = Sampling.from_options(options)
    trained = load_trained(options["ckpt_path"], overrides["data."], options["device"])
    context, unknown = context_ids(trained.vocab, options["prompt"])
    if unknown:
        print(f"lmtrain: {unknown} prompt word(s) not in the vocabulary, read as <unk>", file=sys.stderr)
    ids = sample(trained.module, context, sampling, trained.device)
    words = [trained.vocab.words[i] for i in ids]
    prompt = [word for line in text_lines(options["prompt"]) for word in [*line.split(), EOS]][:-1]
    return Generation(ids, words, render([*prompt, *words]))


def main(argv: list[str] | None = None) -> int:
    """Entry point: prints the text; bad input prints one line and exits with code 2."""
    try:
        generated = generate(sys.argv[1:] if argv is None else argv)
    except (ValueError, FileNotFoundError) as exc:  # CheckpointError, DataError and bad arguments are ValueErrors
        fail(str(exc).strip().splitlines()[0])
    print(generated.text, end="" if generated.text.endswith("\n") else "\n", flush=True)
    return 0

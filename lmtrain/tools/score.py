"""Exact perplexity of any text file under a trained model, with the log-probability of every line.

    python -m lmtrain.score ckpt_path=RUN file=FILE [out=CSV] [device=auto] [normalized=true] [threads=auto]

The file is read as training reads its splits: one sentence per line, words outside the run's vocabulary read as
``<unk>``, and an ``<eos>`` after every line when the vocabulary has one (text corpora). The model reads the file as
one stream with its state carried, like validation and test, from an ``<eos>`` first, so every word and every
line's ``<eos>`` is predicted; a vocabulary without ``<eos>`` (synthetic data) has no such start, and the first word
is only read. Each log-probability is the strategy's exact ``log_prob``. Prints the perplexity exp(-sum log p /
tokens) and writes a CSV with one row per line: ``line`` (from 1), ``tokens`` (predicted, ``<eos>`` included),
``unknown`` (words read as ``<unk>``), ``log_prob`` (natural log, summed over the line) and ``ppl``
(exp(-log_prob / tokens)). ``out`` defaults to RUN/score/STEM.csv and never replaces a file there (STEM-2.csv, ...).
``normalized=false`` adds the unnormalized pass (``lmtrain.tools.unnormalized_score``): the perplexity that assumes
Z = 1, the mean and sd of ln Z, and the seconds of both passes side by side. ``threads`` sets the torch compute
threads as training's ``threads`` does (``auto``: the usable cores, fewer when other processes keep some busy).
``cache=true`` (``cache.KEY=VALUE``) mixes in the neural cache and ``dynamic=true`` (``dynamic.KEY=VALUE``) adapts
the model as it reads (``lmtrain.tools.score_extras``); their settings print and go into STEM.json beside the CSV.
"""

from __future__ import annotations

import csv
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from lmtrain.cli.failures import fail
from lmtrain.data.errors import DataError
from lmtrain.data.vocab import Vocabulary
from lmtrain.process.threads import apply_threads
from lmtrain.tools.score_extras import FLAGS, PREFIXES, describe, extra_log_probs, extras_from, write_json
from lmtrain.tools.trained import load_trained, parse_options
from lmtrain.tools.unnormalized_score import Unnormalized, normalized_flag, report, unnormalized_score
from lmtrain.training.module import LanguageModel
from lmtrain.training.step import window_log_prob

DEFAULTS: dict[str, str] = {
    **{"ckpt_path": "", "file": "", "out": "", "device": "auto", "normalized": "true", "threads": "auto"},
    **FLAGS,
}
WINDOW = 256  # positions per forward pass (bounds the output layer's memory); the state is carried across


@dataclass(frozen=True)
class Score:
    """Totals of a scored file; ``csv`` holds its per-line rows."""

    file: Path
    lines: int
    tokens: int
    unknown: int
    log_prob: float
    csv: Path
    unnormalized: Unnormalized | None = None  # normalized=false
    extras: dict | None = None  # cache=true / dynamic=true: their settings and seconds (score_extras.describe)

    @property
    def ppl(self) -> float:
        """exp of the mean negative log-probability per predicted token."""
        return math.exp(-self.log_prob / self.tokens)


def encode_file(vocab: Vocabulary, path: Path) -> tuple[Tensor, Tensor, list[int]]:
    """The stream the model reads (L,), the line of each predicted token (L - 1,), and unknown words per line."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"file={path} is not UTF-8 text ({err.reason}): convert it to UTF-8") from err
    except OSError as err:
        raise DataError(f"file={path} cannot be read ({err.strerror})") from err
    lines, unknown = vocab.encode_text(text)
    context = [] if vocab.eos is None else [vocab.eos]
    stream = torch.tensor(context + [token for line in lines for token in line], dtype=torch.long)
    line_of = torch.repeat_interleave(torch.arange(len(lines)), torch.tensor([len(line) for line in lines]))
    if stream.numel() < 2:
        raise DataError(f"file={path} has nothing to score: it needs at least {2 - len(context)} word(s)")
    return stream, line_of[line_of.numel() - (stream.numel() - 1) :], unknown


@torch.no_grad()
def stream_log_probs(module: LanguageModel, stream: Tensor, device: torch.device, window: int = WINDOW) -> Tensor:
    """Exact log p of stream[1:] (float64, (L - 1,)), each given everything before it, windows with carried state."""
    parts, state = [], None
    for start in range(0, stream.numel() - 1, window):
        targets = stream[start + 1 : start + window + 1]
        inputs = stream[start : start + targets.numel()]
        batch = (inputs[None].to(device), targets[None].to(device))  # (1, T)
        log_p, _, state = window_log_prob(module.encoder, module.output, batch, state)
        parts.append(log_p.double().cpu())  # (T,)
    return torch.cat(parts)


def default_out(run_dir: Path, file: Path) -> Path:
    """RUN/score/STEM.csv, or STEM-2.csv, STEM-3.csv, ... when taken."""
    path, number = run_dir / "score" / f"{file.stem}.csv", 1
    while path.exists():
        number += 1
        path = run_dir / "score" / f"{file.stem}-{number}.csv"
    return path


def write_rows(path: Path, tokens: Tensor, unknown: list[int], log_prob: Tensor) -> None:
    """The per-line CSV (see the module docstring)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["line", "tokens", "unknown", "log_prob", "ppl"])
        for index, (count, lp) in enumerate(zip(tokens.tolist(), log_prob.tolist(), strict=True)):
            ppl = f"{math.exp(-lp / count):.6g}" if count else ""
            writer.writerow([index + 1, count, unknown[index], repr(lp), ppl])


def score(argv: list[str]) -> Score:
    """Run ``python -m lmtrain.score`` with these arguments: score the file, write the CSV, return the totals."""
    options, overrides = parse_options(argv, DEFAULTS, ("data.", *PREFIXES))
    normalized, setting = normalized_flag(options["normalized"]), thread_setting(options["threads"])
    if not options["file"]:
        raise ValueError("pass file=PATH/TO/text.txt, the text to score (one sentence per line)")
    file = Path(options["file"]).expanduser()
    if not file.is_file():  # before loading the model: a typo fails at once
        raise DataError(f"file={file} does not exist; pass the text file to score (one sentence per line)")
    extras = extras_from(options, overrides)  # before loading the model: a bad option fails at once
    apply_threads(setting)
    trained = load_trained(options["ckpt_path"], overrides["data."], options["device"])
    stream, line_of, unknown = encode_file(trained.vocab, file)
    added = None
    if extras.on:
        if not normalized:
            raise ValueError("normalized=false does not combine with cache=true or dynamic=true; score twice")
        (log_p, added), unnormalized = extra_log_probs(trained, extras, stream), None
    elif normalized:
        log_p, unnormalized = stream_log_probs(trained.module, stream, trained.device), None  # (L - 1,)
    else:
        unnormalized, log_p = unnormalized_score(trained.module, stream, trained.device, WINDOW, stream_log_probs)
    per_line = torch.zeros(len(unknown), dtype=torch.float64).index_add_(0, line_of, log_p)
    tokens = torch.bincount(line_of, minlength=len(unknown))
    out = Path(options["out"]).expanduser() if options["out"] else default_out(trained.run_dir, file)
    try:
        write_rows(out, tokens, unknown, per_line)
    except OSError as err:
        raise ValueError(f"cannot write the per-line CSV {out} ({err.strerror}); pass out=A/WRITABLE/PATH.csv") from err
    result = Score(file, len(unknown), int(tokens.sum()), sum(unknown), float(log_p.sum()), out, unnormalized, added)
    if added is not None:  # the numbers and settings beside the CSV
        write_json(out.with_suffix(".json"), {"file": str(file), "tokens": result.tokens, "ppl": result.ppl, **added})
    return result


def thread_setting(value: str) -> int | str:
    """``threads=`` as given: ``auto`` or a positive number (anything else: one line naming the key)."""
    if value == "auto" or (value.isdigit() and int(value) > 0):
        return value if value == "auto" else int(value)
    raise ValueError(f"threads must be a positive number or 'auto', got {value!r}")


def main(argv: list[str] | None = None) -> int:
    """Entry point: prints the totals; bad input prints one line and exits with code 2."""
    try:
        result = score(sys.argv[1:] if argv is None else argv)
    except (ValueError, FileNotFoundError) as exc:  # CheckpointError, DataError and bad arguments are ValueErrors
        fail(str(exc).strip().splitlines()[0])
    print(
        f"{result.file}: {result.lines} lines, {result.tokens} tokens predicted, {result.unknown} words read as <unk>\n"
        f"log-prob {result.log_prob:.2f} nats, {-result.log_prob / result.tokens:.4f} nats/token, "
        f"perplexity {result.ppl:.3f}\nper-line log-probabilities: {result.csv}",
        flush=True,
    )
    if result.unnormalized is not None:
        print(report(result.unnormalized), flush=True)
    if result.extras is not None:
        print(describe(result.extras), flush=True)
    return 0

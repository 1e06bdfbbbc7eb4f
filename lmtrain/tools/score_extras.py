"""``python -m lmtrain.score ... cache=true`` and ``dynamic=true``: the neural cache (``lmtrain.output.cache``) and
dynamic evaluation (``lmtrain.tools.dynamic_eval``), alone or together, over the scored file.

``cache.KEY=VALUE`` and ``dynamic.KEY=VALUE`` set their options; the cache's start from the run config's
``eval.cache`` (a preset's published values), then its options' defaults. The run's data is read when needed: its
validation split for a θ, λ or ``dynamic.lr`` left out, its training split for the gradient statistics of
``dynamic.method=rms`` (computed once, whatever the lrs tried). An lr left out is chosen first: one dynamic pass
per lr of the grid over the first ``dynamic.search_tokens`` validation tokens, the lowest perplexity wins (a
winning grid end is searched past: ``search_lr``).
With both, the model adapts as it reads and the cache reads the adapted model's hidden states; the steps follow
the model's own loss (not the mixture's), so one pass over the validation split still tries every (θ, λ).
Each pass shows its progress; the settings print with the result and go into RUN/score/STEM.json beside the CSV.
A process keeps the lr searches and the gradient statistics it computed (``Computed``): a second score of the same
checkpoint, dynamic options and data in one process (a scoring study's ``dynamic`` then ``both`` modes) takes them
over, which gives what computing them again gives, since every pass starts from the same seed (``dynamic.seed``).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from torch import Tensor

from lmtrain.data.errors import DataError
from lmtrain.output.cache import SEGMENT, CacheOptions, Setting, choose, grid, mix, mixes, ppl, read_stream
from lmtrain.tools.dynamic_eval import (
    BEYOND,
    DynamicEvaluation,
    DynamicOptions,
    Method,
    gradient_rms,
    lr_grid,
    resolved,
    statistics_batches,
)
from lmtrain.tools.trained import TrainedModel, resolve_checkpoint, run_config
from lmtrain.training.step import window_log_prob

FLAGS = {"cache": "false", "dynamic": "false"}  # score's switches
PREFIXES = ("cache.", "dynamic.")
LINE_SECONDS = 30.0  # without a terminal: a progress line at most this often (a short pass prints none)


@dataclass
class Extras:
    """What the command line asks for: each addition's options, None when off."""

    cache: CacheOptions | None = None
    dynamic: DynamicOptions | None = None
    run_cfg: DictConfig | None = None  # the run's config (its data: the validation and training splits)

    @property
    def on(self) -> bool:
        """Whether either addition is on."""
        return self.cache is not None or self.dynamic is not None


def switch(name: str, value: str) -> bool:
    """``cache=`` / ``dynamic=``: true or false (anything else: one line naming the key)."""
    if value not in ("true", "false"):
        raise ValueError(f"{name}={value!r}: pass {name}=true or {name}=false")
    return value == "true"


def typed(options: type, base: dict[str, Any], args: list[str], prefix: str) -> Any:
    """``options`` from ``base`` updated by ``PREFIX.KEY=VALUE`` arguments (YAML values: null, 0.1, true)."""
    names = [f.name for f in dataclasses.fields(options)]
    values = dict(base)
    for arg in args:
        key, _, value = arg.partition("=")
        if key.removeprefix(prefix) not in names:
            hint = " (lambda is spelled cache.lam)" if key == "cache.lambda" else ""
            raise ValueError(f"unknown argument {key!r}{hint}; keys: {', '.join(prefix + n for n in names)}")
        values.update(OmegaConf.to_container(OmegaConf.from_dotlist([f"{key.removeprefix(prefix)}={value}"])))
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(options), values))
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", "") or ""
        raise ValueError(f"{prefix}{key}: {str(exc).splitlines()[0]}") from exc
    except ValueError as exc:  # a range (Checked): "window must be >= 1, got 0"
        raise ValueError(f"{prefix}{exc}") from exc


def extras_from(options: dict[str, str], overrides: dict[str, list[str]]) -> Extras:
    """The cache's and dynamic evaluation's options (the cache's start from the run config's ``eval.cache``)."""
    cache, dynamic = switch("cache", options["cache"]), switch("dynamic", options["dynamic"])
    for name, on in (("cache", cache), ("dynamic", dynamic)):
        if overrides[f"{name}."] and not on:
            raise ValueError(f"{overrides[f'{name}.'][0]} needs {name}=true")
    if not (cache or dynamic):
        return Extras()
    run_cfg = run_config(resolve_checkpoint(Path(options["ckpt_path"]).expanduser()), overrides["data."])
    node = OmegaConf.select(run_cfg, "eval.cache", default=None)  # a run from before eval.cache has none
    run_cache = OmegaConf.to_container(node) if node is not None else {}
    return Extras(
        typed(CacheOptions, run_cache, overrides["cache."], "cache.") if cache else None,
        typed(DynamicOptions, {}, overrides["dynamic."], "dynamic.") if dynamic else None,
        run_cfg,
    )


class Progress:
    """A pass's progress: a bar in a terminal, else a line at most every ``LINE_SECONDS``."""

    def __init__(self, what: str, total: int, unit: str = "tokens") -> None:
        self.what, self.total, self.unit = what, total, unit
        self.started = self.printed = time.monotonic()
        self.bar = (
            Tqdm(total=total, desc=what, unit=f" {unit}", leave=False, file=sys.stdout) if sys.stdout.isatty() else None
        )

    def __call__(self, done: int) -> None:
        if self.bar is not None:
            self.bar.update(done - self.bar.n)
            if done >= self.total:
                self.bar.close()
            return
        now = time.monotonic()
        if now - self.printed >= LINE_SECONDS and done < self.total:
            left = (self.total - done) * (now - self.started) / done
            elapsed, left_text = Tqdm.format_interval(now - self.started), Tqdm.format_interval(left)
            print(f"{self.what}: {done:,}/{self.total:,} {self.unit}, {elapsed} elapsed, {left_text} left", flush=True)
            self.printed = now


def run_data(trained: TrainedModel, run_cfg: DictConfig) -> Any:
    """The run's data module, set up; its vocabulary must be the run's."""
    datamodule = instantiate(run_cfg.data)
    datamodule.setup()
    if list(datamodule.vocab) != trained.vocab.words:
        raise DataError(f"the data of {trained.run_dir} no longer gives its vocabulary: pass data.KEY=... to find it")
    return datamodule


def read(
    scorer: Any, ids: Tensor, window: int, thetas: tuple[float, ...], device: torch.device, segment: int, what: str
) -> tuple[Tensor, Tensor, Tensor]:
    """``read_stream`` with its progress shown; a dynamic scorer's trained weights are restored after the pass."""
    progress = Progress(what, ids.numel() - 1)
    try:
        with torch.no_grad():  # dynamic evaluation turns gradients on for its steps
            return read_stream(scorer, ids, window, thetas, device, segment, progress)
    finally:
        if isinstance(scorer, DynamicEvaluation):
            scorer.restore()  # the trained weights again, in memory; the checkpoint was only read


@dataclass(frozen=True)
class Inputs:
    """What a dynamic lr search and the gradient statistics depend on: the checkpoint file as saved, the dynamic
    options but the lr, the grid, the training split and validation prefix read, the device."""

    checkpoint: tuple[str, int, int]  # resolved path, size, modification time (ns)
    options: str  # the options with lr left out, as JSON
    grid: tuple[float, ...]  # and how far past its ends a search may go (BEYOND)
    beyond: int
    data: str  # digest of the training ids and the validation prefix
    device: str

    @classmethod
    def of(cls, trained: TrainedModel, options: DynamicOptions, data: Any) -> Inputs:
        """The inputs of ``trained`` dynamically evaluated with ``options`` over ``data``'s splits."""
        saved = trained.checkpoint.resolve()
        stat = saved.stat()
        digest = hashlib.sha256()
        for ids in (data.train_ids, data.valid_ids[: options.search_tokens + 1]):
            # a split of billions of tokens is sampled (every k-th id, ~4M of them) with its length: in one process,
            # data differs only by data.* overrides, which change the text, not a token here and there
            step = max(1, ids.numel() >> 22)
            digest.update(ids[::step].cpu().numpy().tobytes() + ids.numel().to_bytes(8, "little"))
        settings = json.dumps(json_ready(dataclasses.replace(options, lr=None)), sort_keys=True)
        saved_as = (str(saved), stat.st_size, stat.st_mtime_ns)
        return cls(saved_as, settings, lr_grid(options.method), BEYOND, digest.hexdigest(), str(trained.device))


class Computed:
    """This process's lr searches (each one's report, a few numbers) and its last gradient statistics (a model's
    worth of tensors), by their ``Inputs``."""

    searches: dict[Inputs, dict[str, Any]] = {}
    statistics: dict[Inputs, tuple[list[Tensor], int]] = {}

    @classmethod
    def forget(cls) -> None:
        """Drop everything kept (a test's fresh process)."""
        cls.searches.clear()
        cls.statistics.clear()


def statistics(trained: TrainedModel, options: DynamicOptions, data: Any, inputs: Inputs) -> tuple[list[Tensor], int]:
    """``gradient_rms`` of the trained model over ``data``'s training split, or this process's for the same inputs."""
    if inputs not in Computed.statistics:
        progress = Progress("gradient statistics", statistics_batches(data.train_ids.numel(), options), "batches")
        found = gradient_rms(trained.module, data.train_ids, options, trained.device, progress)
        Computed.statistics.clear()  # one model's statistics kept at a time
        Computed.statistics[inputs] = found
    return Computed.statistics[inputs]


def search_lr(trained: TrainedModel, options: DynamicOptions, rms: list[Tensor] | None, data: Any) -> dict[str, Any]:
    """One dynamic pass per lr over the validation split's first ``search_tokens`` tokens: the lrs of ``lr_grid``,
    then past an end of the lrs tried while it is the best, doubling (halving) it, at most ``BEYOND`` times each
    way; each lr's perplexity (null: diverged), the lowest one's lr and whether it is still an end (``at_end``)."""
    prefix = data.valid_ids[: options.search_tokens + 1]  # (search_tokens + 1,): search_tokens predicted
    tried: list[dict[str, Any]] = []

    def rank(one: dict[str, Any]) -> float:  # a diverged pass (inf or NaN: null, strict JSON) ranks last
        return math.inf if one["ppl"] is None else one["ppl"]

    def attempt(lr: float) -> None:
        scorer = DynamicEvaluation(trained.module, dataclasses.replace(options, lr=lr), rms)
        what = f"dynamic lr search on the validation split, lr={lr:g}"
        value = ppl(read(scorer, prefix, 1, (), trained.device, options.segment, what)[0])
        tried.append({"lr": lr, "ppl": value if math.isfinite(value) else None})

    for lr in lr_grid(options.method):
        attempt(lr)
    for pick, factor in ((max, 2.0), (min, 0.5)):  # past the largest lr, then past the smallest
        for _ in range(BEYOND):
            end = pick(tried, key=lambda one: one["lr"])
            if min(tried, key=rank) is not end or end["ppl"] is None:
                break
            attempt(end["lr"] * factor)
    best = min(tried, key=rank)
    at_end = best["ppl"] is not None and best["lr"] in (min(t["lr"] for t in tried), max(t["lr"] for t in tried))
    found = {"searched": ["lr"], "search_tokens_read": prefix.numel() - 1, "lr_tried": tried, "at_end": at_end}
    return {"lr": best["lr"], **found}


def adapting(trained: TrainedModel, options: DynamicOptions, data: Any) -> tuple[DynamicEvaluation, dict]:
    """Dynamic evaluation of the trained model (with the gradient statistics of ``method=rms``, computed once) at
    the given lr, else at the lr of ``lr_grid`` with the lowest perplexity of the validation split's first
    ``search_tokens`` tokens; and its report (``reused``: what this process had computed for the same inputs)."""
    options = resolved(options, trained.module)  # the report gives the window objective=train holds
    inputs, reused = Inputs.of(trained, options, data), []
    rms, batches = None, 0
    if options.method == Method.rms:
        reused += ["statistics"] if inputs in Computed.statistics else []
        rms, batches = statistics(trained, options, data, inputs)
    search: dict[str, Any] = {"searched": [], "search_tokens_read": 0, "lr_tried": []}
    if options.lr is None:
        reused += ["lr search"] if inputs in Computed.searches else []
        if inputs not in Computed.searches:
            Computed.searches[inputs] = search_lr(trained, options, rms, data)
        search = dict(Computed.searches[inputs])
    chosen = dataclasses.replace(options, lr=search.pop("lr", options.lr))
    report = {**json_ready(chosen), "statistics_batches": batches, **search, "reused": reused}
    return DynamicEvaluation(trained.module, chosen, rms), report


def extra_log_probs(trained: TrainedModel, extras: Extras, stream: Tensor) -> tuple[Tensor, dict]:
    """log p of stream[1:] (L - 1,) with the cache and/or dynamic evaluation, and the report (``describe``)."""
    cache, dynamic = extras.cache, extras.dynamic
    searched = cache is not None and (cache.theta is None or cache.lam is None)
    data = run_data(trained, extras.run_cfg) if searched or dynamic is not None else None
    report: dict[str, Any] = {"cache": None, "dynamic": None}
    scorer: Any = functools.partial(window_log_prob, trained.module.encoder, trained.module.output)
    segment, window = SEGMENT, cache.window if cache is not None else 1
    if dynamic is not None:  # its lr first (dynamic alone), then the cache's search with the model adapting at it
        (scorer, report["dynamic"]), segment = adapting(trained, dynamic, data), dynamic.segment
    setting = Setting(cache.theta, cache.lam) if cache is not None and not searched else None
    if searched:
        what = "cache search on the validation split"
        setting = choose(*read(scorer, data.valid_ids, window, grid(cache)[0], trained.device, segment, what), cache)
    started, cpu = time.perf_counter(), time.process_time()
    thetas = () if cache is None else (setting.theta,)
    log_p, log_mass, held = read(scorer, stream, window, thetas, trained.device, segment, "scoring")
    seconds, thousands = time.perf_counter() - started, max(stream.numel() - 1, 1) / 1000
    report.update(seconds=seconds, seconds_per_1k_tokens=seconds / thousands)
    report.update(cpu_seconds_per_1k_tokens=(time.process_time() - cpu) / thousands)  # on a shared machine
    if cache is not None:
        log_p = mix(log_p, log_mass[0], setting.lam, mixes(held, cache.window, cache.warmup))
        chosen = {"theta": setting.theta, "lam": setting.lam, "searched": list(setting.searched)}
        report["cache"] = {**json_ready(cache), **chosen, "val_ppl": setting.val_ppl}
    return log_p, report


def diverged_or(value: float | None) -> str:
    """A searched candidate's perplexity as printed: 'diverged' for a pass that did not stay finite."""
    return "diverged" if value is None else f"{value:.6g}"


def json_ready(options: Any) -> dict[str, Any]:
    """An options dataclass as plain JSON values (choices as their strings)."""
    return {k: v.value if hasattr(v, "value") else v for k, v in dataclasses.asdict(options).items()}


def describe(report: dict[str, Any]) -> str:
    """The settings and the time, as printed with the result."""
    lines = []
    if (cache := report.get("cache")) is not None:
        searched = cache["searched"]
        chosen = f"theta {cache['theta']:g}{' (searched)' if 'theta' in searched else ''}, "
        chosen += f"lambda {cache['lam']:g}{' (searched)' if 'lambda' in searched else ''}"
        val = f"; validation ppl {cache['val_ppl']:.3f} with them" if searched else ""
        lines.append(f"cache: window {cache['window']}, {chosen}, warmup {cache['warmup']}{val}")
    if (dynamic := report.get("dynamic")) is not None:
        searched = "lr" in dynamic["searched"]
        objective = dynamic["objective"]
        if objective == "train":
            held = f", the last {dynamic['recent']:,} tokens' targets held exactly" if dynamic["recent"] else ""
            objective += f" (proposal {dynamic['proposal']}{held})"
        line = f"dynamic: method {dynamic['method']}, objective {objective}, lr {dynamic['lr']:g}"
        line += " (searched)" if searched else ""
        if dynamic["method"] == "rms":
            line += f", decay {dynamic['decay']:g}, eps {dynamic['eps']:g}"
            line += f", gradient statistics from {dynamic['statistics_batches']} training batches of "
            line += f"{dynamic['stat_batch']}x{dynamic['segment']} tokens"
        lines.append(line + f", segments of {dynamic['segment']} tokens")
        if searched:
            tried = ", ".join(f"{diverged_or(t['ppl'])} at lr {t['lr']:g}" for t in dynamic["lr_tried"])
            lines.append(f"dynamic lr search: {dynamic['search_tokens_read']:,} validation tokens, ppl {tried}")
            if dynamic.get("at_end"):
                lines.append(f"dynamic: the best lr is still the end of the {len(dynamic['lr_tried'])} tried")
        if dynamic.get("reused"):
            lines.append(f"dynamic: {' and '.join(dynamic['reused'])} as this process computed them before")
    per = f"{report['seconds_per_1k_tokens']:.3f} s per 1,000 tokens ({report['cpu_seconds_per_1k_tokens']:.3f} s CPU)"
    lines.append(f"scoring: {report['seconds']:.1f} s, {per}")
    return "\n".join(lines)


def write_json(path: Path, result: dict[str, Any]) -> None:
    """The numbers and settings beside the per-line CSV."""
    path.write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")

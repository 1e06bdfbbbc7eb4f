"""Sampler options in a sweep across outputs: in ``python -m lmtrain -m output=full,unigram,rff sampler.D=1024`` the
key ``sampler.D`` goes to the jobs whose sampler takes it (rff) and the others run without it, which is said once;
a key that no job's sampler takes is refused before the sweep starts.

Hydra composes a sweep's primary config with the default output, which may have no sampler, so ``as_sweep`` turns a
fixed ``sampler.KEY=VALUE`` into a sweep of one, which that composition leaves out; ``scope_jobs`` then drops it
from each job whose sampler lacks the key. lmtrain's sweeper (``hydra_plugins/lmtrain_sweeper``, Hydra's basic
sweeper with ``scope_jobs``) runs the jobs so scoped; the config check (``lmtrain.cli.callback``) checks them and
says which jobs run without which key. ``+sampler.KEY``, ``++sampler.KEY`` and ``~sampler.KEY`` are left as written:
they apply to every job."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from omegaconf import DictConfig

from lmtrain.common.ranges import did_you_mean

SAMPLER = "sampler."
JobCompose = Callable[[list[str]], DictConfig]  # a job's overrides -> its config, Hydra's node included


@dataclass
class Scoped:
    """The jobs with each sampler key kept only where it applies (duplicates that this leaves run once), and for
    every scoped key the labels of the jobs that take it and of those that do not."""

    jobs: list[list[str]]
    takers: dict[str, list[str]] = field(default_factory=dict)
    others: dict[str, list[str]] = field(default_factory=dict)
    known: set[str] = field(default_factory=set)  # the keys of the jobs' samplers (for a close match)

    def notes(self) -> list[str]:
        """One line per key that some jobs take and others do not."""
        return [
            f"{key} applies to {', '.join(self.takers[key])} only; {', '.join(self.others[key])} run without it"
            for key in self.takers
            if self.takers[key] and self.others[key]
        ]

    def unused(self) -> list[str]:
        """The keys no job takes."""
        return [key for key in self.takers if not self.takers[key]]


def key_of(override: str) -> str:
    return override.split("=", 1)[0]


def top_of(override: str) -> str:
    """The sampler's own key of ``sampler.KEY[.SUB]=VALUE``."""
    return key_of(override).removeprefix(SAMPLER).split(".", 1)[0]


def as_sweep(overrides: list[str]) -> list[str]:
    """A multirun's overrides with each fixed ``sampler.KEY=VALUE`` written ``sampler.KEY=choice(VALUE)``."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser, out = OverridesParser.create(), []
    for text in overrides:
        value = text.split("=", 1)[1] if "=" in text else ""
        if text.startswith(SAMPLER) and value.strip():
            try:
                fixed = not parser.parse_override(text).is_sweep_override()
            except OverrideParseException:  # Hydra refuses it as written, with its own message
                fixed = False
            text = f"{key_of(text)}=choice({value})" if fixed else text
        out.append(text)
    return out


def scope_jobs(jobs: list[list[str]], compose: JobCompose) -> Scoped:
    """``jobs`` (each a list of overrides) with every plain ``sampler.KEY=VALUE`` kept only in the jobs whose
    sampler has KEY; a job that fails to compose keeps its overrides (the config check names its error)."""
    scoped, seen = Scoped([]), set()
    for job in jobs:
        keys = [o for o in job if o.startswith(SAMPLER)]
        try:
            cfg = compose([o for o in job if o not in keys])
        except Exception:  # Hydra's composition error: reported by the check of the whole job
            cfg = None
        sampler = None if cfg is None else cfg.get("sampler")
        names = set() if sampler is None else {str(k) for k in sampler if not str(k).startswith("_")}
        scoped.known |= names
        label = "?" if cfg is None else job_label(cfg, job)
        for o in keys:
            taken = cfg is None or top_of(o) in names
            for side, hit in ((scoped.takers, taken), (scoped.others, not taken)):
                listed = side.setdefault(key_of(o), [])
                listed.extend([label] if hit and label not in listed else [])
        kept = tuple(o for o in job if o not in keys or cfg is None or top_of(o) in names)
        if kept not in seen:  # e.g. output=full twice when a swept sampler key was its only difference
            seen.add(kept)
            scoped.jobs.append(list(kept))
    return scoped


def job_label(cfg: DictConfig, job: list[str]) -> str:
    """``output=NAME``, with ``sampler=NAME`` when the job chooses its sampler."""
    choices = cfg.hydra.runtime.choices
    chosen = any(key_of(o).lstrip("+~") == "sampler" for o in job)
    return f"output={choices.get('output')}" + (f" sampler={choices.get('sampler')}" if chosen else "")


def unused_key(key: str, scoped: Scoped, takers: list[str]) -> str:
    """The one line for ``key`` that no job's sampler takes: the outputs whose sampler does, or a close key."""
    jobs = ", ".join(sorted({label for labels in (scoped.takers, scoped.others) for label in labels.get(key, [])}))
    where = f"{key} is not an option of any job's sampler ({jobs})"
    if takers:
        return f"{where}; it applies to output={'|'.join(takers)}"
    guess = did_you_mean(top_of(key), sorted(scoped.known), SAMPLER + "{}", n=3, cutoff=0.6)
    return f"{where}; {guess or 'no sampler takes it'}"

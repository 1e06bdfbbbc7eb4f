"""Checks of command-line overrides before Hydra composes them, so mistakes get one clear sentence."""

from __future__ import annotations

import difflib
import re
from pathlib import Path

from omegaconf import DictConfig

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"  # the Hydra config tree, shipped as package data
GROUPS = ("data", "model", "sampler", "output", "optim", "trainer", "logger", "experiment")
_SAMPLER_DEFAULT = re.compile(r"override\s+/sampler@_global_\.sampler:\s*(\w+)")


class OverrideError(ValueError):
    """A command-line override that names an unknown option or key."""


def compose_config(overrides: list[str]) -> DictConfig:
    """lmtrain/conf/train.yaml composed with ``overrides``, outside a Hydra app (scripts, diagnostics, tests)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("train", overrides=overrides)


def choices(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def default_sampler(output: str) -> str | None:
    """The sampler an output config selects in its defaults list (None for strategies without one)."""
    path = CONF_DIR / "output" / f"{output}.yaml"
    match = _SAMPLER_DEFAULT.search(path.read_text()) if path.is_file() else None
    return match.group(1) if match else None


def sampler_keys(sampler: str) -> set[str]:
    import yaml

    return set(yaml.safe_load((CONF_DIR / "sampler" / f"{sampler}.yaml").read_text()) or {})


def check_overrides(args: list[str]) -> None:
    """Raise OverrideError for an unknown group choice or a sampler option the chosen strategy doesn't take."""
    pairs = [a.lstrip("+").split("=", 1) for a in args if "=" in a and not a.startswith(("-", "~", "hydra"))]
    chosen = {key: value.split(",") for key, value in pairs if key in GROUPS}
    for group, values in chosen.items():
        for value in values:
            if value != "null" and not (CONF_DIR / group / f"{value}.yaml").is_file():
                raise OverrideError(f"unknown {group} '{value}': choose one of {', '.join(choices(group))}")
    sampler_options = [key.split(".", 1)[1] for key, _ in pairs if key.startswith("sampler.")]
    if not sampler_options:
        return
    outputs = chosen.get("output", ["full"])
    samplers = chosen.get("sampler") or [default_sampler(o) for o in outputs]
    for option in sampler_options:
        top = option.split(".")[0]
        if any(s is None or s == "null" or top not in sampler_keys(s) for s in samplers):
            takers = [o for o in choices("output") if (s := default_sampler(o)) and top in sampler_keys(s)]
            known = sorted(set().union(*(sampler_keys(s) for s in samplers if s not in (None, "null"))) - {"_target_"})
            if not takers and known:  # no strategy's sampler has it: a typo of one of the chosen sampler's keys
                close = difflib.get_close_matches(top, known, n=3)
                hint = f"did you mean {' or '.join('sampler.' + c for c in close)}?" if close else ""
                raise OverrideError(
                    f"sampler.{option} is not an option of any sampler; {hint or 'the options: ' + ', '.join(known)}"
                )
            raise OverrideError(
                f"sampler.{option} is not an option of output={','.join(outputs)}; "
                + (f"it applies to output={'|'.join(takers)}" if takers else "no sampler takes it")
            )

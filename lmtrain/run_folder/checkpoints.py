"""Checkpoint files: atomic writes, safe reads, the check that a checkpoint fits this run, readable errors for bad
files, and ``init_from`` (a fresh fit from another run's weights). Which checkpoint a run resumes: ``ckpt_path.py``.

Every checkpoint is read with ``torch.load(weights_only=True)``: only tensors, numbers, strings and containers are
rebuilt, so a file from elsewhere cannot run code when it is loaded. lmtrain's checkpoints, also those older versions
wrote, hold nothing else, so no extra types are allowed.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import re
from pathlib import Path
from typing import Any

import torch
from hydra.utils import get_class
from lightning.pytorch.plugins.io import TorchCheckpointIO

from lmtrain.run_folder.ckpt_path import CheckpointError

log = logging.getLogger("lmtrain")


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes to a temporary file in the same folder, then renames: a kill mid-write keeps the old file. Reads (a
    resume, the test of the best checkpoint) go through ``load_safely``, whatever Lightning asks for."""

    def load_checkpoint(self, path: str | Path, map_location: Any = None, weights_only: bool | None = None) -> Any:
        return load_safely(Path(path), map_location)

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        remove_stale_temporaries(path)
        with open(tmp, "wb") as f:
            torch.save(checkpoint, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)


def remove_stale_temporaries(path: Path) -> None:
    """Delete the half-written ``.NAME.tmp-PID`` files that killed writers left beside ``path`` (their PID is gone)."""
    for tmp in path.parent.glob(f".{path.name}.tmp-*"):
        pid = tmp.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not pid_alive(int(pid)):
            tmp.unlink(missing_ok=True)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def load_safely(path: Path, map_location: Any = "cpu") -> Any:
    """``torch.load`` with ``weights_only=True``; a file that needs more, or is not readable, is a CheckpointError."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:  # refused before anything in the file was built
        found = re.search(r"GLOBAL (\S+)", str(exc))
        if found:  # an object other than tensors, numbers, strings and containers
            message = (
                f"ckpt_path {path} was refused: it holds {found.group(1)}, which a checkpoint of weights never does; "
                "lmtrain loads checkpoints with torch.load(weights_only=True), so nothing in the file was run"
            )
        else:
            detail = str(exc).partition("WeightsUnpickler error:")[2].strip().split("\n")[0] or "not a checkpoint"
            message = f"ckpt_path {path} is not a readable lmtrain checkpoint ({detail})"
        raise CheckpointError(message) from None
    except Exception as exc:  # torch raises many types for truncated or foreign files
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        message = f"ckpt_path {path} is not a readable lmtrain checkpoint ({type(exc).__name__}: {reason})"
        raise CheckpointError(message) from exc


def read_checkpoint(path: Path) -> dict[str, Any]:
    """Load a checkpoint on the CPU (``load_safely``), turning any failure into a one-line CheckpointError."""
    if not path.is_file():
        raise CheckpointError(f"ckpt_path {path} does not exist; pass ckpt_path=last or an existing .ckpt file")
    checkpoint = load_safely(path)
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint or "lmtrain" not in checkpoint:
        raise CheckpointError(f"ckpt_path {path} is not an lmtrain checkpoint (no model state or run metadata)")
    return checkpoint


def check_compatible(checkpoint: dict[str, Any], signature: dict[str, Any], path: Path) -> None:
    """Refuse to resume a run whose model, output strategy or vocabulary differ from the checkpoint's."""
    saved = checkpoint["lmtrain"].get("signature", {})
    if "tied" in signature and bool(saved.get("tied")) != signature["tied"]:
        was, now = ("true", "false") if saved.get("tied") else ("false", "true")
        raise CheckpointError(
            f"ckpt_path {path} was saved with model.tie_weights={was} and this config has model.tie_weights={now} "
            f"(tied, the input embedding is the output's class matrix); set model.tie_weights={was} to load it"
        )
    diffs = [
        f"{k}: checkpoint {saved.get(k)!r} vs now {v!r}" for k, v in signature.items() if not same(k, saved.get(k), v)
    ]
    if diffs:
        raise CheckpointError(f"ckpt_path {path} does not match this config ({'; '.join(diffs)})")


def same(key: str, saved: Any, now: Any) -> bool:
    """Whether a checkpoint's signature entry matches this run's: the output strategy by its class (its ``_target_``
    names the class's module, ``lmtrain.output.full.FullSoftmax``, where older checkpoints have the package's export,
    ``lmtrain.output.FullSoftmax``)."""
    if key == "output" and isinstance(saved, str) and isinstance(now, str):
        return saved.rsplit(".", 1)[-1] == now.rsplit(".", 1)[-1]
    if key == "tied":  # a signature without the entry is untied
        return bool(saved) == bool(now)
    if key == "model" and isinstance(saved, dict) and isinstance(now, dict) and set(saved) < set(now):
        # keys added to the model after the checkpoint was written match at their defaults (its model had none)
        defaults, absent = option_defaults(now.get("_target_")), object()
        return all(saved.get(k, defaults.get(k, absent)) == v for k, v in now.items())
    return saved == now


def option_defaults(target: Any) -> dict[str, Any]:
    """The defaults of the options dataclass of the part class named ``target`` (empty if there is none)."""
    try:
        options = getattr(get_class(str(target)), "Options", None)
    except (ImportError, ValueError, AttributeError):
        return {}
    fields = dataclasses.fields(options) if dataclasses.is_dataclass(options) else ()
    return {f.name: f.default for f in fields if f.default is not dataclasses.MISSING}


def load_initial_weights(path: Path, module: Any) -> None:
    """``init_from``: ``module`` takes the weights of the checkpoint at ``path`` (its ``state_dict``: the averaged
    weights of a run that averaged), of the same vocabulary, output strategy and weight shapes (options that shape
    no weight, e.g. dropout, may differ); nothing else of that run is taken."""
    kept = {key: module.signature[key] for key in ("num_classes", "output") if key in module.signature}
    try:
        saved = read_checkpoint(path)
        check_compatible(saved, kept, path)
    except CheckpointError as exc:
        raise CheckpointError(str(exc).replace("ckpt_path", "init_from", 1)) from None
    try:
        module.load_state_dict(saved["state_dict"])
    except RuntimeError as exc:  # a missing or unexpected key, another shape
        detail = " ".join(str(exc).split())[:300]
        raise CheckpointError(f"init_from {path}: its weights do not fit this model ({detail})") from None
    log.info("starting from the weights of %s", path)

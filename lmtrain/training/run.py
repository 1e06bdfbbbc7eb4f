"""`train(cfg)`: build the data, model, output strategy and trainer from the config; fit; test."""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import time
from pathlib import Path

import lightning as L
import torch
from hydra.utils import instantiate
from lightning.pytorch.callbacks import ModelCheckpoint
from omegaconf import DictConfig, OmegaConf

from lmtrain.data.vocab import Vocabulary
from lmtrain.training.assemble import build_model
from lmtrain.training.callbacks import EpochSummary, ProgressBar, ValidateAtEnd
from lmtrain.training.checkpoints import (
    AtomicCheckpointIO,
    CheckpointError,
    check_compatible,
    find_last,
    read_checkpoint,
)
from lmtrain.training.checks import check_against_data, check_config
from lmtrain.training.loggers import build_loggers
from lmtrain.training.loggers.wandb_run import finish_wandb
from lmtrain.training.memory import reuse_freed_memory
from lmtrain.training.noise import quiet_libraries
from lmtrain.training.threads import apply_threads

log = logging.getLogger("lmtrain")


def hydra_context() -> tuple[str | None, list[str]]:
    """(output choice, task overrides) of the running Hydra app; (None, []) outside one (e.g. in tests)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None, []
    hc = HydraConfig.get()
    return hc.runtime.choices.get("output"), list(hc.overrides.task)


def run_name(cfg: DictConfig, output_choice: str | None, overrides: list[str]) -> str:
    """The W&B / plot label: cfg.name, else the overrides that define the job, else the output strategy."""
    if cfg.get("name"):
        return str(cfg.name)
    shown = [o for o in overrides if not o.startswith(("ckpt_path=", "hydra.", "run_dir="))]
    return ",".join(shown) if shown else (output_choice or cfg.output._target_.rsplit(".", 1)[-1])


def resolve_ckpt(cfg: DictConfig, run_dir: Path, overrides: list[str]) -> Path | None:
    if cfg.ckpt_path in (None, ""):
        if (run_dir / "checkpoints").is_dir() and any((run_dir / "checkpoints").glob("*.ckpt")):
            raise CheckpointError(
                f"run folder {run_dir} already holds checkpoints; pass ckpt_path=last to resume it, "
                "or choose another hydra.run.dir (nothing was overwritten)"
            )
        return None
    if cfg.ckpt_path == "last":
        return find_last(run_dir, run_dir.parent.parent, overrides)
    return Path(str(cfg.ckpt_path)).expanduser().resolve()


def write_run_info(
    run_dir: Path,
    name: str,
    output_choice: str | None,
    cfg: DictConfig,
    metrics: dict[str, float],
    wall_time_s: float | None = None,
    entropy_rate: float | None = None,
) -> None:
    """run.json: what scripts need to label and tabulate the run without re-resolving the config (and, for a
    synthetic source, ``best_possible_ppl`` = exp(entropy rate))."""
    output = OmegaConf.to_container(cfg.output, resolve=True)
    sampler = OmegaConf.to_container(cfg.sampler, resolve=True) if cfg.get("sampler") else None
    info = {
        "name": name,
        "output": output_choice or str(cfg.output._target_).rsplit(".", 1)[-1],
        "output_options": {k: v for k, v in output.items() if not k.startswith("_")},
        "sampler": sampler,
        "data": str(cfg.data.get("name", "")),
        "best_possible_ppl": None if entropy_rate is None else math.exp(entropy_rate),
        "metrics": metrics,
        "wall_time_s": wall_time_s,  # of this invocation (a resumed run counts from its restart)
    }
    (run_dir / "run.json").write_text(json.dumps(info, indent=2, default=str))


def train(cfg: DictConfig) -> dict[str, float]:
    """Train and evaluate one model; returns the final metrics (val/ppl of the best epoch, test/ppl, ...)."""
    started = time.perf_counter()
    check_config(cfg)  # before anything starts (the command line was checked already; this covers other callers)
    quiet_libraries()
    output_choice, overrides = hydra_context()
    run_dir = Path(str(cfg.run_dir)).resolve()
    ckpt = resolve_ckpt(cfg, run_dir, overrides)
    apply_threads(cfg.get("threads", "auto"))  # parallel jobs share the cores instead of fighting over them
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    torch.set_float32_matmul_precision("high")
    torch.set_flush_denormal(True)  # tiny LSTM gradients as subnormal floats are very slow on CPUs
    if cfg.get("reuse_freed_memory", True):
        reuse_freed_memory()  # no page faults for each step's big buffers (lmtrain.training.memory)

    datamodule, module = build_model(cfg)
    check_against_data(cfg, datamodule.num_train_windows)
    signature = module.signature
    if datamodule.entropy_rate is not None:  # a synthetic source: its optimum is known
        log.info(
            "data: entropy rate of the source %.4f nats/token, so the best possible perplexity is %.2f",
            datamodule.entropy_rate,
            math.exp(datamodule.entropy_rate),
        )

    resume_id = None
    if ckpt is not None:
        saved = read_checkpoint(ckpt)
        check_compatible(saved, signature, ckpt)
        resume_id = saved["lmtrain"].get("wandb_id")
        previous_csv = ckpt.parent.parent / "metrics.csv"
        if previous_csv.is_file() and previous_csv.parent != run_dir:  # keep the history; never touch the old file
            run_dir.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(previous_csv, run_dir / "metrics.csv")
        log.info("resuming from %s", ckpt)

    name = run_name(cfg, output_choice, overrides)
    run_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)  # there from the start, also if the run dies
    Vocabulary(datamodule.vocab, datamodule.counts).save(run_dir)  # vocab.tsv: what generate and score read text with
    write_run_info(run_dir, name, output_choice, cfg, {}, entropy_rate=datamodule.entropy_rate)
    loggers = build_loggers(cfg, run_dir, name, resume_id, output_choice)
    ckpt_dir = run_dir / "checkpoints"
    callbacks: list[L.Callback] = [
        ModelCheckpoint(
            dirpath=ckpt_dir,
            filename="best-{epoch:02d}",
            monitor="val/ppl",
            mode="min",
            auto_insert_metric_name=False,
            save_last=True,
            enable_version_counter=False,
        ),
        ModelCheckpoint(
            dirpath=ckpt_dir,
            every_n_train_steps=cfg.checkpoint_every_n_steps,
            save_top_k=0,
            save_last=True,
            enable_version_counter=False,
        ),
        EpochSummary(),
        ValidateAtEnd(),
        *([ProgressBar()] if cfg.progress_bar else []),
        *(instantiate(spec) for spec in (cfg.get("callbacks") or {}).values()),
    ]
    trainer: L.Trainer = instantiate(
        cfg.trainer,
        logger=loggers,
        callbacks=callbacks,
        default_root_dir=str(run_dir),
        plugins=[AtomicCheckpointIO()],
        enable_progress_bar=cfg.progress_bar,
        _convert_="all",
    )
    wandb_id = next((lg.experiment.id for lg in loggers if hasattr(lg.experiment, "id")), None)
    module.wandb_id = wandb_id
    # DDP re-seeds every process when it starts (Lightning's reset_seed): do the same in a single process, so that
    # both begin training from the same RNG state and draw the same shared negatives for the same global batch
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    trainer.fit(module, datamodule=datamodule, ckpt_path=str(ckpt) if ckpt else None)

    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}
    best = callbacks[0].best_model_score
    if best is not None:
        metrics["val/ppl_best"] = float(best)
    if cfg.test_after_fit:
        best_path = callbacks[0].best_model_path or None
        tested = trainer.test(module, datamodule=datamodule, ckpt_path=best_path, verbose=False)
        metrics.update({k: float(v) for k, v in (tested[0] if tested else {}).items() if k not in ("epoch", "step")})
    if trainer.is_global_zero:  # one writer under DDP
        write_run_info(
            run_dir, name, output_choice, cfg, metrics, time.perf_counter() - started, datamodule.entropy_rate
        )
    for lg in loggers:
        lg.finalize("success")
    offline_wandb = finish_wandb()
    if trainer.is_global_zero:
        if offline_wandb is not None:
            print(f"lmtrain: W&B run saved offline; upload it with: wandb sync {offline_wandb}", flush=True)
        print(result_line(metrics, run_dir), flush=True)
    return metrics


def result_line(metrics: dict[str, float], run_dir: Path) -> str:
    """'lmtrain: val ppl 227.52, test ppl 219.03 — outputs/2026-11-23/15-00-00': best validation, test, folder."""
    val, test = metrics.get("val/ppl_best", metrics.get("val/ppl")), metrics.get("test/ppl")
    parts = [f"{label} {value:.2f}" for label, value in (("val ppl", val), ("test ppl", test)) if value is not None]
    shown = os.path.relpath(run_dir) if run_dir.is_relative_to(Path.cwd()) else str(run_dir)
    return f"lmtrain: {', '.join(parts) or 'no validation or test'} — {shown}"

"""`train(cfg)`: build the data, model, output strategy and trainer from the config; fit; test. The order of a run,
start to end, in one function, each step a call into the package that owns it (``lmtrain.process``,
``lmtrain.run_folder``, ``lmtrain.training``)."""

from __future__ import annotations

import functools
import logging
import math
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from lmtrain.output.cache import CacheOptions, cached_test
from lmtrain.process.library_logs import quiet_libraries
from lmtrain.process.prepare import prepare_process
from lmtrain.process.signals import TrainingStopped
from lmtrain.run.build import build_model
from lmtrain.run.lightning_data import LightningData
from lmtrain.run.loggers import build_loggers
from lmtrain.run.loggers.wandb_run import finish_wandb, resumed_from, sync_line
from lmtrain.run.trainer import build_callbacks, build_trainer, check_against_data, default_val_check_interval
from lmtrain.run_folder.checkpoints import load_initial_weights
from lmtrain.run_folder.ckpt_path import resolve_ckpt, resume_command
from lmtrain.run_folder.folder import add_results, hydra_context, result_line, run_name, write_start_files
from lmtrain.run_folder.resume import prepare_resume
from lmtrain.run_folder.rng import seed_run, set_rng_states
from lmtrain.training.step import window_log_prob

log = logging.getLogger("lmtrain")


def train(cfg: DictConfig) -> dict[str, float]:
    """Train and evaluate one model; returns the final metrics (val/ppl of the best epoch, test/ppl, ...)."""
    started = time.perf_counter()
    quiet_libraries()
    output_choice, overrides = hydra_context()
    run_dir = Path(str(cfg.run_dir)).resolve()
    ckpt = resolve_ckpt(cfg, run_dir, overrides)
    prepare_process(cfg)
    seeded = seed_run(cfg.seed)  # the run's one seed: the model is built from it, and the fit starts from it

    datamodule, module = build_model(cfg)
    check_against_data(cfg, datamodule.num_train_windows)
    every = default_val_check_interval(cfg, datamodule.num_train_windows)
    if every is not None:
        log.info("validating every %d batches and at the end (trainer.val_check_interval=N sets another)", every)
    if datamodule.entropy_rate is not None:  # a synthetic source: its optimum is known
        best = math.exp(datamodule.entropy_rate)
        log.info(
            "data: entropy rate of the source %.4f nats/token, so the best possible perplexity is %.2f",
            datamodule.entropy_rate,
            best,
        )
    resume_id = prepare_resume(ckpt, module.signature, run_dir) if ckpt is not None else None
    if ckpt is None and cfg.get("init_from"):  # the finetune stage: a fresh fit from another run's weights
        load_initial_weights(Path(str(cfg.init_from)).expanduser().resolve(), module)
    resumed_from([ckpt.parent.parent] if ckpt is not None and ckpt.parent.name == "checkpoints" else [])

    name = run_name(cfg, output_choice, overrides)
    write_start_files(run_dir, cfg, name, output_choice, datamodule)  # config.yaml, vocab.tsv, run.json
    loggers = build_loggers(cfg, run_dir, name, resume_id, output_choice)
    callbacks = build_callbacks(cfg, run_dir / "checkpoints", resume_command(run_dir, overrides))
    trainer = build_trainer(cfg, loggers, callbacks, run_dir)
    module.wandb_id = next((lg.experiment.id for lg in loggers if hasattr(lg.experiment, "id")), None)
    # DDP re-seeds every process when it starts (Lightning's reset_seed): a single process starts from the seeded
    # state too, so that both begin training from the same RNG state and draw the same negatives for a global batch
    set_rng_states(seeded)
    lightning_data = LightningData(datamodule)
    try:
        trainer.fit(module, datamodule=lightning_data, ckpt_path=str(ckpt) if ckpt else None, weights_only=True)
    except TrainingStopped as stop:  # last.ckpt written, Lightning closed the loggers: end the W&B run, exit
        offline_wandb = finish_wandb(exit_code=stop.status)
        if offline_wandb is not None and trainer.is_global_zero:
            print(sync_line(offline_wandb), flush=True)
        # other ranks exit 0: Lightning's launcher kills every process when a child exits with another status
        raise SystemExit(stop.status if trainer.is_global_zero else 0) from None

    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}
    best_checkpoint = callbacks[0]  # ModelCheckpoint on val/ppl
    if best_checkpoint.best_model_score is not None:
        metrics["val/ppl_best"] = float(best_checkpoint.best_model_score)
    if cfg.test_after_fit:
        best_path = best_checkpoint.best_model_path or None
        tested = trainer.test(module, datamodule=lightning_data, ckpt_path=best_path, verbose=False, weights_only=True)
        metrics.update({k: float(v) for k, v in (tested[0] if tested else {}).items() if k not in ("epoch", "step")})
        cache = OmegaConf.select(cfg, "eval.cache", default=None)
        if cache is not None and cache.test and trainer.is_global_zero:
            metrics.update(cache_metrics(module, datamodule, CacheOptions(**OmegaConf.to_container(cache))))
    if trainer.is_global_zero:  # one writer under DDP
        add_results(run_dir, metrics, time.perf_counter() - started)
    for lg in loggers:
        lg.finalize("success")
    offline_wandb = finish_wandb()
    if trainer.is_global_zero:
        if offline_wandb is not None:
            print(sync_line(offline_wandb), flush=True)
        print(result_line(metrics, run_dir), flush=True)
    return metrics


@torch.no_grad()
def cache_metrics(module: Any, datamodule: Any, options: CacheOptions) -> dict[str, float]:
    """The test with the neural cache (``eval.cache.test``), from the weights the test read (the best checkpoint's):
    the test split read as one stream, θ and λ searched on the validation split where ``eval.cache`` leaves them
    out (``lmtrain.output.cache.cached_test``)."""
    score = functools.partial(window_log_prob, module.encoder, module.output)
    module.eval()
    found = cached_test(score, datamodule.valid_ids, datamodule.test_ids, options, next(module.parameters()).device)
    searched = f" (searched: validation ppl {found.val_ppl:.2f})" if found.searched else ""
    log.info(
        "test with the neural cache: ppl %.2f (window %d, theta %g, lambda %g%s)",
        found.test_ppl, options.window, found.theta, found.lam, searched,
    )  # fmt: skip
    metrics = {"test/ppl_cache": found.test_ppl, "cache/theta": found.theta, "cache/lambda": found.lam}
    return metrics | ({"val/ppl_cache": found.val_ppl} if found.searched else {})

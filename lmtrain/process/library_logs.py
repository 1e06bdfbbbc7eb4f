"""Silencing the library messages a run does not need, each one precisely (by its text), nothing wholesale.

- Lightning's advertisement for its cloud logger ("💡 Tip: ... litlogger"): dropped.
- Lightning's device summary ("GPU available: ...", "TPU available: ..."), "`Trainer.fit` stopped: ..." and its
  checkpoint-loading lines (lmtrain says "resuming from ..." itself): kept in the run's log file (Hydra's
  ``__main__.log``), not shown on the console.
- Lightning's INFO records printed twice: the ``lightning`` package adds its own console handler besides the
  root logger's (Hydra's), so under Hydra that extra handler is removed and each record appears once.
- torch's ``LeafSpec`` and ``all_gather`` deprecations, raised inside Lightning's own code (nothing lmtrain can
  change).
- Under DDP, Lightning's advice to log the evaluation metrics with ``sync_dist=True``: lmtrain adds up the
  evaluation sums of all ranks itself before it logs them.
- "Checkpoint directory ... exists and is not empty": lmtrain resumes into its own run folder on purpose (and
  refuses a folder with checkpoints unless resuming).
- "The dirpath has changed from ...": a checkpoint resumed into a new run folder; lmtrain's own line says which
  folder the run goes on in and how to continue in the old one instead.
- "ModelCheckpoint(monitor='val/ppl') could not find the monitored key" in a run without validation: there is no
  best checkpoint to write then (Lightning writes none either), and its hint to log val/ppl does not apply.
- "callbacks used to create the checkpoint need to be provided" when the one callback missing is the periodic
  checkpoint that earlier lmtrain wrote by steps and by minutes in one callback (``RunCheckpoint``): two of
  Lightning's own now do its work (steps, minutes), and what it kept (its last checkpoint's path) is not needed.
"""

from __future__ import annotations

import logging
import warnings

DROPPED = ("💡 Tip:",)
FILE_ONLY = (
    "GPU available:",
    "TPU available:",
    "HPU available:",
    "`Trainer.fit` stopped:",
    "Restoring states from the checkpoint path at",
    "Restored all states from the checkpoint at",
    "Loaded model weights from the checkpoint at",
)
# the periodic checkpoint of earlier lmtrain, one callback by steps and by minutes (now two), missing on a resume
OLD_PERIODIC = (
    r"Be aware that when using `ckpt_path`, callbacks used to create the checkpoint need to be provided during "
    r"`Trainer` instantiation\. Please add the following callbacks: \[\"ModelCheckpoint\{'monitor': None, "
    r"'mode': 'min', 'every_n_train_steps': \d+, 'every_n_epochs': 0, "
    r"'train_time_interval': datetime\.timedelta\([^)]*\)\}\"\]\.$"
)
WARNINGS = (
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning),
    (r"torch\.distributed\.nn\.functional\.all_gather is deprecated", FutureWarning),  # Lightning's all_gather
    (r"Checkpoint directory .* exists and is not empty", UserWarning),
    (r"The dirpath has changed from", UserWarning),  # a resume into a new folder: lmtrain says so in its own line
    # a run without validation has no val/ppl: the best checkpoint is not written (Lightning raises once one ran)
    (r"`ModelCheckpoint\(monitor='val/ppl'\)` could not find the monitored key", UserWarning),
    (OLD_PERIODIC, UserWarning),
    # under DDP: the evaluation sums are reduced across ranks by lmtrain before they are logged
    (r"It is recommended to use `self\.log\('((val|test)/(loss|ppl)|epoch|step)', \.\.\., sync_dist", UserWarning),
)


class MessageFilter(logging.Filter):
    """Drops records whose message starts with one of ``prefixes``."""

    def __init__(self, prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefixes)


def _console_handlers(logger: logging.Logger) -> list[logging.Handler]:
    streams = [h for h in logger.handlers if isinstance(h, logging.StreamHandler)]
    return [h for h in streams if not isinstance(h, logging.FileHandler)]


def quiet_libraries() -> None:
    """Install the filters above (idempotent)."""
    for message, category in WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    root = logging.getLogger()
    lightning = [logging.getLogger(name) for name in ("lightning", "lightning.pytorch", "lightning.fabric")]
    if _console_handlers(root):  # Hydra's handlers print (and file) Lightning's records: no second console handler
        for logger in lightning:
            for handler in _console_handlers(logger):
                logger.removeHandler(handler)
            logger.propagate = True  # lightning.pytorch stops propagating when imported before logging is set up
    for logger_name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        rank_zero = logging.getLogger(logger_name)
        if not any(isinstance(f, MessageFilter) for f in rank_zero.filters):
            rank_zero.addFilter(MessageFilter(DROPPED))
    for handler in _console_handlers(root) + [h for logger in lightning for h in _console_handlers(logger)]:
        if not any(isinstance(f, MessageFilter) for f in handler.filters):
            handler.addFilter(MessageFilter(FILE_ONLY))

"""The step and the module: ``step.py`` (one training step and the exact evaluation as plain functions), ``module.py``
(the LightningModule), ``optim.py`` (optimizers, clipping and DDP for sparse row gradients), ``schedule.py`` and
``averaging.py``. Building the module from the config is the run's (``lmtrain.run.build``)."""

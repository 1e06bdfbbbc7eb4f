"""The run: ``run.train(cfg)`` builds the parts (``build.py``), the Trainer with its callbacks
(``trainer.py``, ``callbacks.py``, ``progress.py``, ``host_time.py``) and loggers (``loggers/``), fits and tests."""

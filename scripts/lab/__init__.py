"""The measurement apparatus of the benchmarks in scripts/ and of the tests, outside the installed package: what a
training step launches (``launches``) and moves through memory (``traffic``), a step ready to run on its own
(``step_fixture``), a benchmark's step clock (``step_clock``) and a record's provenance (``provenance``).

``python scripts/NAME.py`` puts scripts/ on ``sys.path`` (``from lab import launches``); pytest does the same
(``pythonpath`` in pyproject.toml)."""

"""The project's own records rendered for its docs, outside the installed package: the tables of the benchmark
records in docs/bench/ (``bench``, ``gpu_bench``), the answer table that opens docs/results.md (``summary``) and
the blocks of a page that quote rendered tables (``docs``). ``python scripts/render_docs.py`` runs them (``--check``:
exit 1 where a committed table differs from its rendering).

``python scripts/NAME.py`` puts scripts/ on ``sys.path`` (``from records.bench import render_bench``); pytest does
the same (``pythonpath`` in pyproject.toml)."""

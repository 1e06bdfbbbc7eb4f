"""The training app: ``run.train(cfg)`` builds the parts, fits and tests (docs/architecture.md)."""

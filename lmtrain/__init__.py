"""lmtrain: LSTM language models with swappable softmax output strategies."""

from pathlib import Path

__version__ = "0.1.0"


def _conf_dir() -> Path:
    """The Hydra config tree (train.yaml, a folder per group, the studies in study/): ``lmtrain/conf`` in an
    installed wheel, which maps the repository's top-level ``conf/`` there (pyproject.toml's package-dir), else
    ``conf/`` beside the package in a source checkout (an editable install, or the checkout on PYTHONPATH)."""
    package = Path(__file__).resolve().parent
    shipped = package / "conf"
    return shipped if (shipped / "train.yaml").is_file() else package.parent / "conf"


CONF_DIR = _conf_dir()

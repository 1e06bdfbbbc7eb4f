"""Every config group option composes, presets resolve, and bad overrides get one clear sentence."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from lmtrain.config import CONF_DIR, GROUPS, choices
from tests.command_line import refusal
from tests.conftest import make_config

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's own dependency
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]

OPTIONS = [(g, c) for g in GROUPS for c in choices(g)]


@pytest.mark.parametrize(("group", "choice"), OPTIONS, ids=[f"{g}={c}" for g, c in OPTIONS])
def test_every_group_option_composes(group, choice):
    overrides = [f"{group}={choice}", "run_dir=/tmp/unused"]
    if group == "data" and choice == "text":
        overrides.append("data.path=/tmp/somewhere")
    if group == "sampler":
        overrides.append("output=sampled")
    cfg = make_config(overrides)
    OmegaConf.resolve(cfg)  # every interpolation must resolve
    assert cfg.output._target_.startswith("lmtrain.output.")


def test_zaremba_small_preset_matches_the_paper():
    cfg = make_config(["experiment=zaremba_small", "run_dir=/tmp/unused"])
    assert (cfg.model.hidden_dim, cfg.model.num_layers, cfg.model.dropout) == (200, 2, 0.0)
    assert (cfg.data.batch_size, cfg.data.bptt, cfg.trainer.max_epochs) == (20, 20, 13)
    assert (cfg.optim.lr, cfg.optim.clip, cfg.loss_reduction) == (1.0, 5.0, "sum")
    assert (cfg.optim.schedule.start, cfg.optim.schedule.decay, cfg.model.init_range) == (4, 0.5, 0.1)


def test_zaremba_medium_preset_matches_the_paper():
    cfg = make_config(["experiment=zaremba_medium", "run_dir=/tmp/unused"])
    assert (cfg.model.hidden_dim, cfg.model.dropout, cfg.data.bptt, cfg.trainer.max_epochs) == (
        650,
        0.5,
        35,
        39,
    )
    assert cfg.optim.schedule.start == 6 and cfg.optim.schedule.decay == pytest.approx(1 / 1.2)
    assert cfg.model.init_range == 0.05


def test_unknown_group_choice_names_the_valid_ones(tmp_path, monkeypatch, capsys):
    refused = refusal(["output=bogus"], tmp_path, monkeypatch, capsys)
    assert re.match(r"unknown output 'bogus': choose one of .*full", refused)
    assert "unknown data 'nope'" in refusal(["-m", "data=ptb,nope"], tmp_path, monkeypatch, capsys)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["sampler.D=1024"], r"sampler\.D is not an option of output=full; it applies to output=.*rff"),
        (["output=uniform", "sampler.D=64"], r"sampler\.D .* of output=uniform; it applies to output=.*rff"),
        (["output=rff", "sampler.D=1024"], r"$"),  # accepted
    ],
)
def test_sampler_option_on_a_strategy_without_that_option_is_refused(args, expected, tmp_path, monkeypatch, capsys):
    assert re.match(expected, refusal(args, tmp_path, monkeypatch, capsys))


def test_config_tree_ships_as_package_data():
    """`pip install .` (non-editable) must carry the whole Hydra tree (train.yaml, every group, every file in it,
    the studies) as lmtrain/conf, and every package of lmtrain/."""
    assert ROOT / "conf" == CONF_DIR and (CONF_DIR / "train.yaml").is_file()
    assert all(choices(group) for group in GROUPS), "every group has at least one option"
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["package-dir"] == {"lmtrain.conf": "conf"}
    shipped = {path for pattern in setuptools["package-data"]["lmtrain.conf"] for path in CONF_DIR.glob(pattern)}
    tree = {path for path in CONF_DIR.rglob("*") if path.is_file() and "__pycache__" not in path.parts}
    assert sorted(p.relative_to(CONF_DIR) for p in tree - shipped) == []
    inits = [*(ROOT / "lmtrain").rglob("__init__.py"), *(ROOT / "hydra_plugins").rglob("__init__.py")]
    packages = {".".join(p.parent.relative_to(ROOT).parts) for p in inits}
    assert sorted(setuptools["packages"]) == sorted(packages | {"lmtrain.conf"})


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["output=rff", "sampler.unigram_shar=0.1"], r"sampler\.unigram_shar is not an option of any sampler; did you"),
        (["output=rff", "sampler.zzz=1"], r"sampler\.zzz .*the options: D, backend, eps, feature_cache, leaf_size, nu"),
        (["sampler.nuu=1"], r"sampler\.nuu is not an option of output=full; no sampler takes it"),
    ],
)
def test_a_misspelt_sampler_option_gets_the_close_key(args, expected, tmp_path, monkeypatch, capsys):
    assert re.match(expected, refusal(args, tmp_path, monkeypatch, capsys))

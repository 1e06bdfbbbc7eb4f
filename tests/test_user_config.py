"""A user's own config folder: experiments, strategies and samplers of their own beside the packaged tree."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from lmtrain.config import compose_config
from tests.cli_runs import TINY, run_cli
from tests.command_line import refusal

EXPERIMENT = """# @package _global_
defaults:
  - override /data: synthetic
  - override /output: mine
  - override /logger: csv
trainer:
  max_steps: 3
"""
OUTPUT = """# a sampled softmax with a sampler of my own and fewer negatives
defaults:
  - /schema/output@_here_: sampled
  - override /sampler@_global_.sampler: mine
  - _self_
_target_: lmtrain.output.SampledSoftmax
num_samples: 7
"""
SAMPLER = """defaults:
  - /schema/sampler@_here_: unigram
  - _self_
power: 0.5
"""


def user_folder(root: Path) -> Path:
    """DIR/experiment/mine.yaml, DIR/output/mine.yaml, DIR/sampler/mine.yaml."""
    for group, text in (("experiment", EXPERIMENT), ("output", OUTPUT), ("sampler", SAMPLER)):
        (root / group).mkdir(parents=True, exist_ok=True)
        (root / group / "mine.yaml").write_text(text)
    return root


def test_a_run_from_a_users_config_folder(tmp_path):
    mine, run = user_folder(tmp_path / "mine"), tmp_path / "run"
    run_cli(["--config-dir", str(mine), "experiment=mine", *TINY, f"hydra.run.dir={run}"], tmp_path)
    cfg = OmegaConf.load(run / "config.yaml")
    assert (cfg.output.num_samples, cfg.sampler.power, cfg.trainer.max_steps) == (7, 0.5, 3)
    assert (run / "checkpoints" / "last.ckpt").is_file()


def test_hydra_searchpath_finds_the_same_folder_and_its_keys_are_checked(tmp_path, monkeypatch, capsys):
    mine = user_folder(tmp_path / "mine")
    cfg = compose_config(["experiment=mine", f"hydra.searchpath=[file://{mine}]", "run_dir=/tmp/unused"])
    assert cfg.sampler._target_ == "lmtrain.sampler.unigram.UnigramSampler" and cfg.output.num_samples == 7
    assert refusal(["-cd", str(mine), "experiment=mine", "sampler.power=0.75"], tmp_path, monkeypatch, capsys) == ""
    refused = refusal([f"--config-dir={mine}", "experiment=mine", "output.num_sample=3"], tmp_path, monkeypatch, capsys)
    assert refused.startswith("unknown key output.num_sample: did you mean output.num_samples?")
    without_the_folder = refusal(["experiment=mine"], tmp_path, monkeypatch, capsys)
    assert without_the_folder.startswith("unknown experiment 'mine': choose one of")


def test_a_package_line_below_a_comment_is_named_in_the_error(tmp_path, monkeypatch, capsys):
    mine = user_folder(tmp_path / "mine")
    (mine / "experiment" / "late.yaml").write_text("# my experiment\n" + EXPERIMENT)  # package line on line 2
    refused = refusal(["-cd", str(mine), "experiment=late"], tmp_path, monkeypatch, capsys)
    assert "experiment/late.yaml sets other groups: its first line must be '# @package _global_'" in refused


def test_a_renamed_schema_still_composes_and_the_run_names_the_new_one(tmp_path, capsys):
    """``/schema/output@_here_: cosine`` (output=rff's schema before it was derived from its class, now ``rff``) keeps
    working for one release, with one line naming the new schema."""
    from lmtrain.cli.callback import warn_renamed
    from lmtrain.config import composer

    mine = tmp_path / "mine"
    (mine / "output").mkdir(parents=True)
    (mine / "output" / "old.yaml").write_text(
        OUTPUT.replace("sampled", "cosine").replace("_target_: lmtrain.output.SampledSoftmax\n", "")
    )
    with composer(mine) as compose:
        old, new = compose(["output=old", "sampler=unigram"], hydra=True), compose(["output=rff", "sampler=unigram"])
    assert old.output.num_samples == 7 and {**old.output, "num_samples": 100} == {**new.output}
    warn_renamed(old)
    [line] = capsys.readouterr().err.splitlines()
    assert (
        line == "lmtrain: warning: schema/output/cosine is now schema/output/rff; the old name goes in the next release"
    )

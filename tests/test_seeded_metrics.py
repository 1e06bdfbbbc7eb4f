"""What a user sees stays put: the metrics of a short seeded run of every ``output=`` choice, and the runs that
older versions of lmtrain wrote, are compared with values recorded before a change (tests/data/).

After a change that is meant to alter them, record them again: ``python -m tests.test_seeded_metrics`` (the old-run
fixtures stay as older code wrote them unless ``--old-runs`` replaces them).

The seeded runs are float64 (``trainer.precision=64-true``), so that they give the same values on every CPU: in
float32, CPUs of different vector widths round products and torch's normal draws differently in the last bits, and
within 20 steps a kernel sampler's draw or two part ways on one of them.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from lmtrain.config import choices
from tests.conftest import TINY, make_config

DATA = Path(__file__).resolve().parent / "data"
EXPECTED = DATA / "seeded_metrics.json"
OLD_RUNS = DATA / "old_runs"  # run folders (config.yaml, vocab.tsv, checkpoints/last.ckpt) written by older code
METRICS = ("train/loss", "val/ppl", "test/ppl")
SEQUENCE = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4]


def output_choices() -> list[str]:
    """The ``output=`` options: the strategies' own and the packaged presets."""
    return choices("output")


def seeded_overrides(output: str, run_dir: Path) -> list[str]:
    """20 optimizer steps of a tiny float64 model on a small synthetic corpus, seed 7."""
    common = [o for o in TINY if not o.startswith("data.")]
    data = ["data.train_tokens=20000", "data.valid_tokens=2000", "data.test_tokens=2000"]
    data += ["data.batch_size=8", "data.bptt=10"]
    sampler = ["sampler.D=32"] if output == "rff" else []
    run = ["trainer.max_steps=20", "trainer.precision=64-true", "seed=7", f"run_dir={run_dir}"]
    return [*common, *data, f"output={output}", *sampler, *run]


def seeded_run(output: str, run_dir: Path) -> dict[str, float]:
    from lmtrain.run.run import train

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same arithmetic on every machine load
    try:
        metrics = train(make_config(seeded_overrides(output, run_dir)))
    finally:
        torch.set_num_threads(threads)
    return {key: metrics[key] for key in METRICS}


def sequence_log_prob(run: Path) -> float:
    """The summed exact log-probability of SEQUENCE under a run's model, loaded as the tools load it."""
    from lmtrain.tools.trained import load_trained

    model = load_trained(str(run), [], device="cpu")
    ids = torch.tensor([SEQUENCE])
    with torch.no_grad():
        hidden, _ = model.module.encoder(ids[:, :-1], None)
        return float(model.module.output.log_prob(hidden.reshape(-1, hidden.shape[-1]), ids[0, 1:]).sum())


def expected_runs() -> dict[str, dict[str, float]]:
    """The recorded metrics of every output choice."""
    return json.loads(EXPECTED.read_text())["runs"]


def test_the_expected_values_cover_every_output_choice():
    assert sorted(json.loads(EXPECTED.read_text())["runs"]) == output_choices()


@pytest.mark.parametrize("output", output_choices())
def test_a_seeded_run_gives_the_recorded_metrics(output, tmp_path, monkeypatch):
    monkeypatch.setenv("LMTRAIN_CACHE_DIR", str(tmp_path / "cache"))
    expected = expected_runs()[output]
    assert seeded_run(output, tmp_path / "run") == pytest.approx(expected, rel=1e-5)


def test_a_float64_run_builds_its_model_in_float64(tmp_path, monkeypatch):
    """Under 64-true the model is made in float64 (what makes the seeded runs CPU-independent): its weights and a
    kernel tree's first node sums are float64's from the start, not float32 values converted afterwards."""
    from lmtrain.run.build import build_model

    monkeypatch.setenv("LMTRAIN_CACHE_DIR", str(tmp_path / "cache"))
    _, module = build_model(make_config(seeded_overrides("rff", tmp_path / "run")))
    assert {p.dtype for p in module.parameters()} == {torch.float64}
    tree = module.output.sampler.tree
    nodes = tree.nodes.clone()
    tree.rebuild(module.output.weight.detach())  # the float64 sums of the float64 weights
    assert nodes.dtype == torch.float64 and torch.equal(nodes, tree.nodes)
    assert torch.get_default_dtype() == torch.float32  # the process's default is back


@pytest.mark.parametrize("output", ["full", "rff"])
def test_a_run_written_by_older_code_still_loads(output, tmp_path):
    run = tmp_path / output
    shutil.copytree(OLD_RUNS / output, run)
    expected = json.loads(EXPECTED.read_text())["old_runs"][output]
    assert sequence_log_prob(run) == pytest.approx(expected, rel=1e-5)


def record(scratch: Path, replace_old_runs: bool = False) -> None:
    """Run every choice and save the metrics; with ``replace_old_runs`` (``--old-runs``) also keep the full and rff
    runs as the old-run fixtures, which otherwise stay what older code wrote, with their recorded values."""
    runs = {output: seeded_run(output, scratch / output) for output in output_choices()}
    old_runs = json.loads(EXPECTED.read_text())["old_runs"]
    for output in ("full", "rff") if replace_old_runs else ():
        target = OLD_RUNS / output
        shutil.rmtree(target, ignore_errors=True)
        (target / "checkpoints").mkdir(parents=True)
        for name in ("config.yaml", "vocab.tsv", "checkpoints/last.ckpt"):
            shutil.copy(scratch / output / name, target / name)
        old_runs[output] = sequence_log_prob(target)
    EXPECTED.write_text(json.dumps({"runs": runs, "old_runs": old_runs}, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    import os
    import tempfile

    os.environ.setdefault("WANDB_MODE", "disabled")
    with tempfile.TemporaryDirectory() as scratch:
        os.environ["LMTRAIN_CACHE_DIR"] = str(Path(scratch) / "cache")
        record(Path(scratch), replace_old_runs="--old-runs" in sys.argv)
    print(f"recorded {EXPECTED}", file=sys.stderr)

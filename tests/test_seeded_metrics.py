"""What a user sees stays put: the metrics of a short seeded run of every ``output=`` choice, and the runs that
older versions of lmtrain wrote, are compared with values recorded before a change (tests/data/).

After a change that is meant to alter them, record them again: ``python -m tests.test_seeded_metrics`` (the old-run
fixtures stay as older code wrote them unless ``--old-runs`` replaces them).

The values depend on the CPU's vector width: ``runs`` were recorded on AVX-512 CPUs; on an AVX2-only CPU the kernel
samplers' float rounding differs in the last bits, a draw or two part ways within 20 steps and their metrics differ by
about 0.4%. ``by_cpu`` keeps, per ``torch.backends.cpu.get_cpu_capability()``, the outputs whose values differ there,
recorded by the same code (``python -m tests.test_seeded_metrics --cpu``).
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
    """20 optimizer steps of a tiny model on a small synthetic corpus, seed 7."""
    common = [o for o in TINY if not o.startswith("data.")]
    data = ["data.train_tokens=20000", "data.valid_tokens=2000", "data.test_tokens=2000"]
    data += ["data.batch_size=8", "data.bptt=10"]
    sampler = ["sampler.D=32"] if output == "rff" else []
    return [*common, *data, f"output={output}", *sampler, "trainer.max_steps=20", "seed=7", f"run_dir={run_dir}"]


def seeded_run(output: str, run_dir: Path) -> dict[str, float]:
    from lmtrain.training.run import train

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
    """The recorded metrics of every output choice for this machine's CPU (``by_cpu`` over ``runs``)."""
    recorded = json.loads(EXPECTED.read_text())
    return {**recorded["runs"], **recorded.get("by_cpu", {}).get(torch.backends.cpu.get_cpu_capability(), {})}


def test_the_expected_values_cover_every_output_choice():
    assert sorted(json.loads(EXPECTED.read_text())["runs"]) == output_choices()


@pytest.mark.parametrize("output", output_choices())
def test_a_seeded_run_gives_the_recorded_metrics(output, tmp_path, monkeypatch):
    monkeypatch.setenv("LMTRAIN_CACHE_DIR", str(tmp_path / "cache"))
    expected = expected_runs()[output]
    assert seeded_run(output, tmp_path / "run") == pytest.approx(expected, rel=1e-5)


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
    by_cpu = json.loads(EXPECTED.read_text()).get("by_cpu", {})
    EXPECTED.write_text(
        json.dumps({"runs": runs, "old_runs": old_runs, "by_cpu": by_cpu}, indent=1, sort_keys=True) + "\n"
    )


def record_cpu(scratch: Path) -> None:
    """Record, for this machine's CPU capability, the output choices whose metrics differ from ``runs``."""
    recorded = json.loads(EXPECTED.read_text())
    runs = {output: seeded_run(output, scratch / output) for output in output_choices()}
    differ = {o: m for o, m in runs.items() if m != pytest.approx(recorded["runs"][o], rel=1e-5)}
    cpu = torch.backends.cpu.get_cpu_capability()
    recorded.setdefault("by_cpu", {})[cpu] = differ
    EXPECTED.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
    print(f"{cpu}: {sorted(differ) or 'none'} differ", file=sys.stderr)


if __name__ == "__main__":
    import os
    import tempfile

    os.environ.setdefault("WANDB_MODE", "disabled")
    with tempfile.TemporaryDirectory() as scratch:
        os.environ["LMTRAIN_CACHE_DIR"] = str(Path(scratch) / "cache")
        if "--cpu" in sys.argv:
            record_cpu(Path(scratch))
        else:
            record(Path(scratch), replace_old_runs="--old-runs" in sys.argv)
    print(f"recorded {EXPECTED}", file=sys.stderr)

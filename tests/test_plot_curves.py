"""scripts/plot_curves.py: a PNG with one line per run, labelled by the run's name."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import plot_curves  # noqa: E402

from lmtrain.tools.plots import val_curve, validated_within_epochs  # noqa: E402
from lmtrain.tools.results import load_run, read_metrics, run_labels  # noqa: E402
from lmtrain.training.loggers.metrics_csv import AppendingExperimentWriter  # noqa: E402


def fake_run(folder: Path, name: str, val: list[float], exact_train: bool) -> Path:
    folder.mkdir(parents=True)
    key = "train/ppl_step" if exact_train else "train/loss_step"
    rows = ["epoch,step,val/ppl," + key]
    for epoch, ppl in enumerate(val):
        rows.append(f"{epoch},{10 * epoch + 5},,{ppl * 1.1 if exact_train else 3.0 - epoch * 0.1}")
        rows.append(f"{epoch},{10 * epoch + 9},{ppl},")
    (folder / "metrics.csv").write_text("\n".join(rows) + "\n")
    (folder / "run.json").write_text(json.dumps({"name": name}))
    return folder


def test_plot_curves_writes_a_png_with_one_line_per_run(tmp_path):
    full = fake_run(tmp_path / "a", "full", [180.0, 150.0, 130.0], exact_train=True)
    rff = fake_run(tmp_path / "b", "rff", [200.0, 160.0, 140.0], exact_train=False)
    out = plot_curves.main([str(full), str(rff), "--out", str(tmp_path / "curves.png")])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    run = load_run(rff)
    assert run.name == "rff" and run.values("val/ppl") == [200.0, 160.0, 140.0] and run.best("val/ppl") == 140.0


def test_a_folder_without_metrics_is_named_in_the_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="holds no metrics.csv"):
        plot_curves.main([str(tmp_path), "--out", str(tmp_path / "x.png")])


def test_runs_validated_within_epochs_are_plotted_by_step(tmp_path):
    per_epoch = load_run(fake_run(tmp_path / "a", "full", [180.0, 150.0], exact_train=True))
    assert not validated_within_epochs([per_epoch]) and val_curve(per_epoch, False) == ([1, 2], [180.0, 150.0])
    folder = tmp_path / "b"
    folder.mkdir()
    (folder / "metrics.csv").write_text("epoch,step,val/ppl\n0,249,600.0\n0,499,400.0\n0,749,300.0\n")
    within = load_run(folder)  # trainer.val_check_interval=250: three validations in epoch 0
    assert validated_within_epochs([per_epoch, within])
    assert val_curve(within, True) == ([250, 500, 750], [600.0, 400.0, 300.0])


def sweep_job(folder: Path, overrides: list[str]) -> Path:
    fake_run(folder, ",".join(overrides), [200.0, 150.0], exact_train=False)
    output = next((o.split("=")[1] for o in overrides if o.startswith("output=")), "full")
    name = next((o.split("=")[1] for o in overrides if o.startswith("name=")), ",".join(overrides))  # as lmtrain
    (folder / "run.json").write_text(json.dumps({"name": name, "output": output}))
    (folder / ".hydra").mkdir()
    (folder / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    return folder


def test_sweep_jobs_are_labelled_by_what_differs_and_the_legend_sits_outside(tmp_path):
    common = ["data=synthetic", "model.hidden_dim=650", "model.emb_dim=650", "optim=adam", "trainer.max_epochs=39"]
    jobs = [
        sweep_job(tmp_path / str(n), [*common, f"output={o}", f"output.num_samples={m}"])
        for n, (o, m) in enumerate([("rff", 10), ("rff", 100), ("uniform", 100)])
    ]
    named = sweep_job(tmp_path / "named", [*common, "name=my baseline"])
    assert run_labels([load_run(j) for j in jobs]) == [
        "output=rff num_samples=10",
        "output=rff num_samples=100",
        "output=uniform num_samples=100",
    ]
    assert run_labels([load_run(jobs[0])]) == ["rff"] and run_labels([load_run(named)])[0] == "my baseline"
    out = plot_curves.main([*map(str, jobs), "--out", str(tmp_path / "curves.png")])
    import matplotlib.image

    assert matplotlib.image.imread(out).shape[1] > 12 * 120  # wider than the two panels: the legend is beside them


def test_rows_of_one_step_merge_and_a_resume_replaces_the_redone_steps(tmp_path):
    writer = AppendingExperimentWriter(log_dir=str(tmp_path))
    writer.log_metrics({"train/loss": 4.5, "epoch": 0}, step=19)
    writer.log_metrics({"train/ppl": 90.0, "lr": 1.0, "epoch": 0}, step=19)  # Lightning's write of that step
    writer.log_metrics({"test/ppl": 88.0, "epoch": 0.0}, step=20)
    assert writer.metrics == [
        {"train/loss": 4.5, "train/ppl": 90.0, "lr": 1.0, "epoch": 0, "step": 19},
        {"test/ppl": 88.0, "epoch": 0, "step": 20},
    ]
    (tmp_path / "m.csv").write_text("epoch,step,train/loss\n0,0,5.0\n0,1,4.9\n0,2,4.8\n0,1,4.7\n0,2,4.6\n0,3,4.5\n")
    assert read_metrics(tmp_path / "m.csv")["train/loss"] == [(0, 0, 5.0), (1, 0, 4.7), (2, 0, 4.6), (3, 0, 4.5)]

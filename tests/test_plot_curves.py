"""scripts/plot_curves.py: a PNG with one line per run, labelled by the run's name."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import plot_curves  # noqa: E402

from lmtrain.report import val_curve, validated_within_epochs  # noqa: E402
from lmtrain.results import load_run  # noqa: E402


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

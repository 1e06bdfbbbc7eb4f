"""python -m lmtrain.plot: the plotted points of a tiny sweep (validations at their step, tokens, seconds, seeds
grouped into mean and band, one unit per training panel), and reading metrics.csv back."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest

from lmtrain.run_folder.metrics_csv import AppendingExperimentWriter
from lmtrain.tools.curve_data import Panel, group_by_seed
from lmtrain.tools.plot import draw, main, plot_runs
from lmtrain.tools.run_records import load_run, load_runs, read_metrics, run_labels
from tests.conftest import TINY, make_config

TOKENS_PER_STEP = 16 * 20  # TINY's batch x bptt
TRAIN_PPL = "training perplexity (where the loss is the exact NLL)"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """full with seeds 1 and 2 validated every 3 steps for 6 steps, unigram (no exact training ppl) for 4 steps
    with only its final validation: a short run, validated once at step 4."""
    from lmtrain.run.run import train

    root = tmp_path_factory.mktemp("sweep")
    jobs = [
        ("0", ["output=full", "seed=1", "trainer.max_steps=6", "trainer.val_check_interval=3"]),
        ("1", ["output=full", "seed=2", "trainer.max_steps=6", "trainer.val_check_interval=3"]),
        ("2", ["output=unigram", "seed=1", "trainer.max_steps=4"]),
    ]
    for name, overrides in jobs:
        common = [*TINY, "trainer.log_every_n_steps=2", "test_after_fit=false"]
        train(make_config([*common, *overrides, f"run_dir={root / name}"]))
        (root / name / ".hydra").mkdir()  # as a Hydra multirun over output and seed leaves it
        (root / name / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides[:2]))
    return root


def panel(panels: list[Panel], title: str) -> Panel:
    return next(p for p in panels if p.title == title)


def test_a_sweep_is_plotted_against_steps_tokens_and_seconds_with_seeds_as_mean_and_band(sweep, tmp_path):
    out = tmp_path / "curves.png"
    panels = plot_runs([sweep], "all", out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    runs = {r.path.name: r for r in load_runs([sweep])}
    full_val = [[v for _, _, v in runs[n].series["val/ppl"]] for n in ("0", "1")]  # 2 validations each

    full, unigram = panel(panels, "validation perplexity by steps").lines
    assert full.label == "full (2 seeds)" and unigram.label == "unigram"
    assert full.x == [3.0, 6.0] and unigram.x == [4.0]  # each validation at the step it followed
    assert full.y == pytest.approx([statistics.mean(v) for v in zip(*full_val, strict=True)])
    assert full.low == [min(v) for v in zip(*full_val, strict=True)]
    assert full.high == [max(v) for v in zip(*full_val, strict=True)] and unigram.low is None

    by_tokens = panel(panels, "validation perplexity by tokens").lines
    assert by_tokens[0].x == [3.0 * TOKENS_PER_STEP, 6.0 * TOKENS_PER_STEP] and by_tokens[0].y == full.y
    seconds = [[v for _, _, v in runs[n].series["train/seconds"]] for n in ("0", "1")]
    by_seconds = panel(panels, "validation perplexity by seconds").lines
    assert by_seconds[0].x == pytest.approx([statistics.mean(s) for s in zip(*seconds, strict=True)])
    assert by_seconds[1].x == runs["2"].values("train/seconds") and all(x > 0 for x in by_seconds[1].x)

    exact = panel(panels, TRAIN_PPL).lines  # exact training ppl only where the strategy has one
    losses = panel(panels, "training loss: each strategy's own objective").lines  # every strategy's loss
    assert [line.label for line in exact] == ["full (2 seeds)"]
    assert [line.label for line in losses] == ["full (2 seeds)", "unigram"]
    assert exact[0].x == [2.0, 4.0, 6.0] and min(exact[0].y) > 1.0  # perplexities, logged every 2 steps
    assert losses[1].x == [1.0, 2.0, 3.0, 4.0] and losses[1].y == pytest.approx(runs["2"].values("train/loss"))
    assert losses[0].x == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0] and losses[0].group == exact[0].group


def test_the_figure_draws_the_returned_points_one_color_per_group(sweep, tmp_path):
    panels = plot_runs([sweep / "0", sweep / "1", sweep / "2"], "steps", tmp_path / "c.png")
    assert [p.title for p in panels] == ["validation perplexity by steps", TRAIN_PPL, panels[2].title]
    fig = draw(panels, "t")
    axes = [ax for ax in fig.axes if ax.get_visible()]
    for ax, drawn in zip(axes, panels, strict=True):
        assert ax.get_yscale() == drawn.yscale and ax.get_ylabel() == drawn.ylabel
        for line2d, line in zip(ax.lines, drawn.lines, strict=True):
            assert list(line2d.get_xdata()) == line.x and list(line2d.get_ydata()) == line.y
            assert line2d.get_color() == f"C{line.group}"
    for ax, drawn in zip(axes, panels, strict=True):  # each panel its own legend, naming each of its lines
        assert ax.get_title() == drawn.title
        assert [t.get_text() for t in ax.get_legend().get_texts()] == [line.label for line in drawn.lines]
    legends = [[t.get_text() for t in ax.get_legend().get_texts()] for ax in axes]
    both = ["full (2 seeds)", "unigram"]
    assert legends == [both, ["full (2 seeds)"], both] and not fig.legends


def test_runs_differing_in_more_than_the_seed_stay_apart_and_are_labelled_by_it(sweep, tmp_path):
    other = tmp_path / "lr"
    train_cfg = [*TINY, "output=full", "seed=1", "trainer.max_steps=2", "optim.lr=0.5", f"run_dir={other}"]
    from lmtrain.run.run import train

    train(make_config([*train_cfg, "test_after_fit=false"]))
    (other / ".hydra").mkdir()
    (other / ".hydra" / "overrides.yaml").write_text("- output=full\n- seed=1\n- optim.lr=0.5\n")
    groups = group_by_seed(load_runs([sweep / "0", sweep / "1", other]))
    assert [len(g.runs) for g in groups] == [2, 1] and groups[0].tokens_per_step == TOKENS_PER_STEP
    assert groups[1].label == "full lr=0.5" and "seed" not in groups[0].label.removesuffix(" (2 seeds)")


def fake_run(folder: Path, name: str, val: list[float]) -> Path:
    folder.mkdir(parents=True)
    rows = ["epoch,step,val/ppl,train/loss"] + [f"{e},{10 * e + 9},{ppl},{3.0 - e * 0.1}" for e, ppl in enumerate(val)]
    (folder / "metrics.csv").write_text("\n".join(rows) + "\n")
    (folder / "run.json").write_text(json.dumps({"name": name}))
    return folder


def test_the_command_writes_a_png_and_runs_without_a_config_are_plotted_by_step(tmp_path):
    full = fake_run(tmp_path / "a", "full", [180.0, 150.0, 130.0])
    out = main([str(full), "--x", "steps", "--out", str(tmp_path / "curves.png")])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="nothing to plot"):  # without a config the batch shape is unknown
        main([str(full), "--x", "tokens", "--out", str(tmp_path / "tokens.png")])
    panels = plot_runs([full], "steps", tmp_path / "b.png")
    assert panels[0].lines[0].x == [10.0, 20.0, 30.0] and panels[0].lines[0].label == "full"
    with pytest.raises(FileNotFoundError, match="holds no metrics.csv"):
        main([str(tmp_path / "empty"), "--out", str(tmp_path / "x.png")])
    log = tmp_path / "a.log"  # a study's log beside its run folder, matched by the same shell glob
    log.write_text("lmtrain: ...\n")
    assert [r.path for r in load_runs([full, log])] == [full]
    with pytest.raises(FileNotFoundError, match="holds no metrics.csv"):
        load_runs([log])  # a file given alone is still an error


def test_sweep_jobs_are_labelled_by_what_differs(tmp_path):
    common = ["data=synthetic", "model.hidden_dim=650", "optim=adam", "trainer.max_epochs=39"]
    jobs = []
    for n, (o, m) in enumerate([("rff", 10), ("rff", 100), ("uniform", 100)]):
        folder = fake_run(tmp_path / str(n), "x", [200.0, 150.0])
        (folder / "run.json").write_text(json.dumps({"name": "x", "output": o}))
        (folder / ".hydra").mkdir()
        (folder / ".hydra" / "overrides.yaml").write_text(
            "".join(f"- {o}\n" for o in [*common, f"output={o}", f"output.num_samples={m}"])
        )
        jobs.append(load_run(folder))
    labels = ["rff num_samples=10", "rff num_samples=100", "uniform num_samples=100"]
    assert run_labels(jobs) == labels
    assert run_labels(jobs[:1]) == ["rff"]


def test_plot_and_summarize_label_a_run_alike(tmp_path):
    """One labelling rule (``run_labels``): the curve of a run in ``lmtrain.plot`` and its line in ``lmtrain.summarize``
    carry one label (they read 'output=rff lr=0.5' and 'rff'); the summary leaves out m, its x axis and panels."""
    from lmtrain.tools.sweep_table import summarize

    jobs = [("full", "1", "10"), ("rff", "0.5", "10"), ("rff", "1", "10"), ("rff", "1", "100")]
    for n, (output, lr, m) in enumerate(jobs):
        folder = fake_run(tmp_path / str(n), "x", [200.0, 150.0])
        (folder / "run.json").write_text(json.dumps({"name": "x", "output": output}))
        (folder / ".hydra").mkdir()
        sampled = [f"output.num_samples={m}"] if output != "full" else []
        overrides = [f"output={output}", f"optim.lr={lr}", "seed=3", *sampled]
        (folder / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    runs = load_runs([tmp_path])
    plotted = [line.label for line in plot_runs([tmp_path], "steps", tmp_path / "c.png")[0].lines]
    assert plotted == ["full lr=1", "rff lr=0.5 num_samples=10", "rff lr=1 num_samples=10", "rff lr=1 num_samples=100"]
    assert [row.label for row in summarize(runs)] == ["full lr=1", "rff lr=0.5", "rff lr=1", "rff lr=1"]
    assert run_labels(runs, ignore=("num_samples",)) == ["full lr=1", "rff lr=0.5", "rff lr=1 (2)", "rff lr=1 (3)"]


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


def test_a_short_sweeps_single_validations_are_markers_with_plain_ticks(tmp_path):
    """One validation per run (at step 10): big markers, the x axis ticked at that step only, the log y axis
    labelled with plain numbers over its whole range, the wide-range case with 1-2-5 ticks."""
    runs = [fake_run(tmp_path / name, name, [ppl]) for name, ppl in (("a", 849.0), ("b", 870.0), ("c", 901.0))]
    panels = plot_runs(runs, "steps", tmp_path / "short.png")
    fig = draw(panels, "t")
    ax = fig.axes[0]
    fig.canvas.draw()
    assert [line.get_markersize() for line in ax.lines] == [7, 7, 7]
    assert list(ax.get_xticks()) == [10.0] and ax.get_xticklabels()[0].get_text() == "10"
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert len(labels) >= 3 and all(re.fullmatch(r"[\d,.]+", t) for t in labels), labels  # no 8.49x10^2
    low, high = ax.get_ylim()
    assert min(ax.get_yticks()) - low < 0.3 * (high - low) and high - max(ax.get_yticks()) < 0.3 * (high - low)

    wide = fake_run(tmp_path / "wide", "wide", [5000.0, 900.0, 120.0])
    fig = draw(plot_runs([wide], "steps", tmp_path / "wide.png"), "t")
    fig.canvas.draw()
    shown = [t.get_text() for t in fig.axes[0].get_yticklabels() if t.get_text()]
    assert {"200", "500", "1,000", "2,000"} <= set(shown), shown


def test_a_sweep_without_validations_says_so_and_draws_no_empty_plot(tmp_path, capsys):
    from lmtrain.tools.summarize import main as summarize

    for name in ("0", "1"):  # jobs still in their first steps: training rows only
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.csv").write_text("epoch,step,train/loss\n0,0,4.6\n0,1,4.5\n0,2,4.4\n")
    assert summarize([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "no validations in" in out and "val_curves.png not written" in out
    assert "ppl_vs_samples.png not written" in out
    assert not list(tmp_path.glob("*.png")) and (tmp_path / "summary.md").is_file()
    panels = plot_runs([tmp_path], "all", tmp_path / "curves.png")
    assert [p.title for p in panels] == ["training loss: each strategy's own objective"]  # no empty panels
    main([str(tmp_path), "--out", str(tmp_path / "c.png")])
    assert "no validations in" in capsys.readouterr().out

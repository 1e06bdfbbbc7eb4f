"""Sweeps across outputs with sampler keys: a ``sampler.KEY`` goes to the jobs whose sampler takes it, the others run
without it (said in one line), a key no job takes is refused before the sweep; a failing job stops the sweep."""

from __future__ import annotations

import pytest

from lmtrain.cli.failures import SweepStopped, run_guarded
from tests import command_line
from tests.cli_runs import TINY, run_cli
from tests.command_line import refusal


def accepted_jobs(args: list[str], tmp_path, monkeypatch, capsys) -> tuple[list, str]:
    """The configs the sweep's jobs were handed, and what it wrote on stderr."""
    assert refusal(["-m", *args], tmp_path, monkeypatch, capsys) == ""
    return list(command_line.ACCEPTED), capsys.readouterr().err


def test_a_sampler_key_goes_to_the_jobs_whose_sampler_takes_it(tmp_path, monkeypatch, capsys):
    jobs, err = accepted_jobs(["output=full,unigram,rff", "sampler.D=64"], tmp_path, monkeypatch, capsys)
    full, unigram, rff = jobs
    assert full.get("sampler") is None and "D" not in unigram.sampler and rff.sampler.D == 64
    assert unigram.sampler._target_.endswith("UnigramSampler") and rff.output._target_.endswith("CosineSampledSoftmax")
    notes = [line for line in err.splitlines() if "sampler.D" in line]
    assert notes == ["lmtrain: sampler.D applies to output=rff only; output=full, output=unigram run without it"]


def test_jobs_that_differ_only_by_a_key_they_do_not_take_run_once(tmp_path, monkeypatch, capsys):
    jobs, _ = accepted_jobs(["output=full,rff", "sampler.D=64,128", "seed=1,2"], tmp_path, monkeypatch, capsys)
    seen = [(job.output._target_.rsplit(".", 1)[1], job.sampler.D if job.get("sampler") else None, job.seed)
            for job in jobs]  # fmt: skip
    assert seen == [("FullSoftmax", None, 1), ("FullSoftmax", None, 2), *(
        ("CosineSampledSoftmax", d, s) for d in (64, 128) for s in (1, 2))]  # fmt: skip


def test_a_key_every_job_takes_and_swept_sampler_choices(tmp_path, monkeypatch, capsys):
    jobs, err = accepted_jobs(["output=unigram,nce", "sampler.power=0.5"], tmp_path, monkeypatch, capsys)
    assert [job.sampler.power for job in jobs] == [0.5, 0.5] and "sampler.power" not in err
    args = ["output=sampled", "sampler=uniform,rff", "sampler.D=64"]
    jobs, err = accepted_jobs(args, tmp_path, monkeypatch, capsys)
    assert "D" not in jobs[0].sampler and jobs[1].sampler.D == 64
    assert "applies to output=sampled sampler=rff only; output=sampled sampler=uniform run without it" in err


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["-m", "output=full,unigram", "sampler.D=64"],
         "sampler.D is not an option of any job's sampler (output=full, output=unigram); it applies to output="),
        (["-m", "output=full,rff", "sampler.Dd=64"], "sampler.Dd is not an option of any job's sampler "
         "(output=full, output=rff); did you mean sampler.D?"),
        (["-m", "output=full,rff", "++sampler.D=64"],
         "job 0 (output=full ++sampler.D=64): output=full takes no sampler, but the config sets sampler.D"),
        (["output=full", "sampler.D=64"], "sampler.D is not an option of output=full; it applies to output="),
        (["output=full", "sampler=unigram"], "output=full takes no sampler, but the config chooses sampler=unigram"),
    ],
)  # fmt: skip
def test_keys_that_no_job_takes_are_refused_before_the_sweep(args, expected, tmp_path, monkeypatch, capsys):
    assert expected in refusal(args, tmp_path, monkeypatch, capsys)


def test_a_mistake_in_a_job_stops_the_sweep_and_a_nan_loss_does_not(tiny_config, monkeypatch):
    monkeypatch.setattr("lmtrain.cli.failures.in_multirun", lambda: True)

    def mistake(cfg):
        raise ValueError("a value the checks could not see")

    with pytest.raises(SweepStopped) as stopped:
        run_guarded(mistake, tiny_config())
    assert stopped.value.code == 2 and stopped.value.line.endswith("stops: a value the checks could not see")
    with pytest.raises(SweepStopped) as stopped:
        run_guarded(lambda cfg: 1 / 0, tiny_config())
    assert stopped.value.code == 1 and "ZeroDivisionError" not in stopped.value.line  # its sentence, not its type

    def nan(cfg):
        from lmtrain.training.step import NonFiniteLossError

        raise NonFiniteLossError("loss is nan at step 3")

    assert run_guarded(nan, tiny_config()) is None  # a result of training: the sweep goes on


@pytest.mark.slow  # a process that starts a sweep, ~10 s
def test_a_failing_job_stops_the_sweep_through_the_command_line(tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", *TINY, "logger=csv", "seed=1,2", "trainer.val_check_interval=500", f"hydra.sweep.dir={sweep}"]
    result = run_cli(args, tmp_path, check=False)
    assert result.returncode == 2, result.stderr[-3000:]
    [line] = [line for line in result.stderr.splitlines() if line.startswith("lmtrain: error: ")]
    assert line.startswith("lmtrain: error: job 0 (") and "failed, so the sweep stops: " in line
    assert "trainer.val_check_interval=500 is more than the" in line
    assert not (sweep / "0").exists() and not (sweep / "1").exists()  # job 0 left nothing; job 1 never ran

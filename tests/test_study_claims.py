"""Study claims (lmtrain/study/claims.py): one process at a time per job; a second call skips a held job without
touching its folder, and a job recorded meanwhile is not run again."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import yaml

from lmtrain.study.claims import claimed
from lmtrain.study.records import append_record
from lmtrain.study.runner import execute, records_path, training_folder
from lmtrain.study.spec import load_spec


def test_a_claim_is_held_once_released_after_and_a_dead_holders_claim_is_taken_over(tmp_path):
    path = tmp_path / "job.claim"
    with claimed(path) as first:
        assert first and path.read_text().split() == [socket.gethostname(), str(os.getpid())]
        with claimed(path) as second:
            assert not second  # this process is alive: the claim holds
        assert path.exists()  # the refused call did not remove the holder's claim
    assert not path.exists()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    path.write_text(f"{socket.gethostname()} {gone.stdout.strip()}\n")  # its process has ended
    with claimed(path) as taken:
        assert taken and path.read_text().split()[1] == str(os.getpid())
    path.write_text(f"another-host-{socket.gethostname()} 1\n")  # a host that cannot be checked from here
    with claimed(path) as elsewhere:
        assert not elsewhere


def test_a_held_run_is_skipped_and_its_half_written_folder_left_alone(tmp_path):
    study = tmp_path / "tiny.yaml"
    study.write_text(yaml.safe_dump({"overrides": ["data=synthetic"], "grid": [{"output": ["full"]}], "seeds": [1]}))
    spec, root, runs = load_spec(study), tmp_path / "docs", tmp_path / "runs"
    run = spec.runs()[0]
    folder = training_folder(spec, run, runs)
    (folder / "checkpoints").mkdir(parents=True)  # another call's run, before its first checkpoint
    with claimed(folder.parent / f"{folder.name}.claim"):
        line = execute(spec, run, root, runs, {})
    assert "another process is running it" in line and (folder / "checkpoints").is_dir()  # not renamed as stale
    append_record(records_path(spec, root), {"key": run.key, "status": "ok"})
    assert "recorded meanwhile" in execute(spec, run, root, runs, {})  # no second training, no second record
    assert len(records_path(spec, root).read_text().splitlines()) == 1

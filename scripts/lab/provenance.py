"""Where a benchmark record was measured: the device and the versions, the commit, and the tests that need CUDA run
before it (``scripts/bench_gpu.py``); and the record written."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import lightning
import torch


def write_record(path: Path, record: dict[str, Any]) -> None:
    """Write a benchmark's record as indented JSON, making its folder, and say where."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2))
    print(f"wrote {path}")


def environment(device: str) -> dict[str, Any]:
    """The device and the versions a record was measured with."""
    name = torch.cuda.get_device_name() if device == "cuda" else (platform.processor() or platform.machine())
    return {
        "device": name,
        "device_type": device,
        "device_memory_gib": torch.cuda.get_device_properties(0).total_memory / 2**30 if device == "cuda" else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if device == "cuda" else None,
        "lightning": lightning.__version__,
        "python": platform.python_version(),
        "cpu_threads": torch.get_num_threads(),
    }


def commit(root: Path) -> str:
    """The commit of the checkout at ``root``, ``+dirty`` with changes to tracked files; ``unknown`` outside a git
    checkout."""

    def git(*command: str) -> str:
        return subprocess.run(["git", *command], cwd=root, capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "--short", "HEAD")
    return (head + ("+dirty" if git("status", "--porcelain", "-uno") else "")) if head else "unknown"


def run_cuda_tests(paths: list[str], seconds: float, root: Path) -> dict[str, Any]:
    """``pytest -m cuda`` on ``paths`` in a child process run in ``root``, stopped after ``seconds``: its command,
    return code, counts and seconds (or why it has none)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "junit.xml"
        command = ["python", "-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider", *paths]
        started = time.monotonic()
        try:
            run = [sys.executable, *command[1:], f"--junitxml={report}"]
            done = subprocess.run(run, cwd=root, timeout=max(1.0, seconds))
        except subprocess.TimeoutExpired:
            return {"status": "timed out", "command": command, "reason": f"after {time.monotonic() - started:.0f} s"}
        result = {"status": "ran", "command": command, "returncode": done.returncode}
        result["seconds"] = time.monotonic() - started
        return result | (junit_counts(report) if report.is_file() else {"status": "failed to run"})


def junit_counts(path: Path) -> dict[str, int]:
    """passed, failed, errors and skipped from a pytest JUnit XML report."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    total = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    passed = total["tests"] - total["failures"] - total["errors"] - total["skipped"]
    return {"passed": passed, "failed": total["failures"], "errors": total["errors"], "skipped": total["skipped"]}

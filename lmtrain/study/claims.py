"""One process at a time per job of a study: two ``python -m lmtrain.study`` calls that overlap (two terminals, two
queue workers) would otherwise train or score the same pending run twice, and the second would take the first's
half-written run folder for a dead one.

A job is claimed by creating its claim file atomically (``O_EXCL``) with the holder's host and pid inside, and the
file is removed when the job ends. A claim held by a live process makes the other call skip that job; one whose
process is gone (a kill) is taken over. After the claim, the caller looks at the records again: a job another call
finished meanwhile is not run twice.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _holder_alive(path: Path) -> bool:
    """Whether the process named in the claim file runs (a claim from another host counts as alive: it cannot be
    checked from here; an unreadable one as gone)."""
    try:
        host, pid = path.read_text().split()
        if host != socket.gethostname():
            return True
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a process of another user holds that pid: alive
        return True
    except (OSError, ValueError):
        return False
    return True


@contextmanager
def claimed(path: Path) -> Iterator[bool]:
    """Hold the claim ``path`` for the block: yields True, and removes the file after; or False, holding nothing,
    when a live process holds it. A claim left by a process that is gone is taken over."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(2):  # a stale claim is removed once, then created again
        try:
            handle = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            if _holder_alive(path):
                yield False
                return
            path.unlink(missing_ok=True)
            continue
        with os.fdopen(handle, "w") as out:
            out.write(f"{socket.gethostname()} {os.getpid()}\n")
        try:
            yield True
        finally:
            path.unlink(missing_ok=True)
        return
    yield False

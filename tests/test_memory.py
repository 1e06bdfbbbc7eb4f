"""The allocator setting that train() applies on Linux with glibc."""

from __future__ import annotations

import platform

from lmtrain.training.memory import reuse_freed_memory


def test_reuse_freed_memory_applies_exactly_where_glibc_is():
    on_glibc = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    assert reuse_freed_memory() is on_glibc

"""Host-memory allocator settings that keep a CPU training step from paying page faults for its big buffers."""

from __future__ import annotations

import ctypes
import platform

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameter ids (malloc.h)
_MMAP_THRESHOLD = 32 << 20  # the largest glibc accepts on 64-bit systems
_TRIM_THRESHOLD = 512 << 20


def reuse_freed_memory() -> bool:
    """Make glibc malloc keep freed blocks of up to 32 MiB (and up to 512 MiB of free heap) for reuse.

    By default glibc serves large blocks with mmap (from 128 KiB, a threshold it raises as such blocks are
    freed) and gives free memory at the top of the heap back to the system, so a training step's logits,
    gradients and activations are faulted in page by page again and again; keeping them saves those page faults
    at every step (docs/architecture.md, measured design choices). Returns whether the settings were applied
    (Linux with glibc only; elsewhere nothing changes).
    """
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    mmap_set = libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)  # 1 on success
    trim_set = libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)
    return bool(mmap_set and trim_set)

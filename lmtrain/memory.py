"""Host-memory allocator settings that keep a CPU training step from paying page faults for its big buffers."""

from __future__ import annotations

import ctypes
import platform

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameter ids (malloc.h)
_MMAP_THRESHOLD = 32 << 20  # the largest glibc accepts on 64-bit systems
_TRIM_THRESHOLD = 512 << 20


def reuse_freed_memory() -> bool:
    """Make glibc malloc keep freed blocks of up to 32 MiB (and up to 512 MiB of free heap) for reuse.

    By default glibc serves every block above 128 KiB to 32 MiB with a fresh mmap and returns it on free,
    so each training step faults in its logits, gradients and activations page by page again. On the
    2-core development machine that cost about a fifth of the PTB full-softmax step. Returns whether the
    settings were applied (Linux with glibc only; elsewhere nothing changes).
    """
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)) & bool(
        libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)
    )

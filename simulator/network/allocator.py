"""Keep large numpy temporaries on the heap instead of fresh mmap'd pages.

The solver and the network create many short-lived arrays of 0.1-10 MB per solve.
glibc serves allocations above its mmap threshold (128 KiB at start, adapting upwards
only after frees) with fresh ``mmap`` regions, and returns freed heap tops to the OS
beyond its trim threshold; every new region then costs a page fault per 4 KiB page on
first touch.  On virtual machines that is slow: on the 2-core development box a
1,000-flow solve took 8.2 ms with glibc's defaults and 1.5 ms with the thresholds below
(``benchmarks/bench_maxmin.py``).

:func:`tune_allocator` raises the mmap threshold to glibc's maximum (32 MiB on 64-bit)
and keeps up to 512 MiB of freed memory for reuse.  It is process-wide, so it runs once,
only on glibc, and not when ``CLUSTERSIM_KEEP_MALLOC`` is set in the environment.
Results never depend on it; only speed and the process's retained memory do.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

__all__ = ["tune_allocator"]

_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
_done: bool | None = None


def tune_allocator() -> bool:
    """Apply the malloc settings once; True when they are in force."""
    global _done
    if _done is not None:
        return _done
    _done = False
    if not sys.platform.startswith("linux") or os.environ.get("CLUSTERSIM_KEEP_MALLOC"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):          # not glibc (e.g. musl)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    ok = mallopt(_M_MMAP_THRESHOLD, 32 * 2**20) == 1
    ok &= mallopt(_M_TRIM_THRESHOLD, 512 * 2**20) == 1
    ok &= mallopt(_M_TOP_PAD, 64 * 2**20) == 1
    _done = bool(ok)
    return _done

"""Giving the memory a background write or merge freed back to the system (glibc's ``malloc_trim``).

The writer's worker threads (``writer``'s background writes, ``merger``) allocate in glibc malloc arenas of
their own, one per thread; what a write frees there stays part of the process's resident set, since an
arena only shrinks from its top. On the 300-step MLP of ``benchmarks/recording_size.py`` flushed every
0.15 s (about 20 writes and 3 merges, as a slow run flushing every 5 s has over a few minutes) that was
2–5 MiB more peak memory, different from run to run; with one arena for the process (``MALLOC_ARENA_MAX=1``)
about 3.5 MiB of it went away, and trimming after each write and merge took it back (peak 351–352 MiB
against 352–357). ``trim`` asks glibc to return every whole free page of every arena (``malloc_trim(0)``,
about a millisecond, with the GIL released); with another C library it does nothing.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import sys
from collections.abc import Callable

__all__ = ["trim"]


def _load() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # musl and other C libraries have none
        return None
    function.argtypes, function.restype = [ctypes.c_size_t], ctypes.c_int
    return function


_MALLOC_TRIM = _load()


def trim() -> bool:
    """Return the free pages of every malloc arena to the system; whether this C library can (glibc).

    >>> isinstance(trim(), bool)
    True
    """
    if _MALLOC_TRIM is None:
        return False
    _MALLOC_TRIM(0)
    return True

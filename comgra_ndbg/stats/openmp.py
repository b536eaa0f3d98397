"""torch's OpenMP runtime, found so that the host kernels can run on the threads it already keeps.

On a CPU, torch runs its operators on a team of OpenMP threads (GNU libgomp in the Linux wheels) that
spin between operators waiting for the next one. A thread of our own beside them competes for the same
cores and slows training down; handing work to that very team costs nothing extra: the summary kernels
enter it with ``GOMP_parallel``, exactly as torch's operators do, and the waiting threads pick the work up.

Only a libgomp that this process has already loaded is used, and only when torch says its parallel backend
is OpenMP; anywhere else (macOS, Windows, other runtimes, a build without OpenMP) ``entry()`` is 0 and the
kernels run on the calling thread alone.
"""
from __future__ import annotations

import ctypes
import os
import sys

import torch

__all__ = ["entry", "threads"]

_ENTRY: int | None = None


def entry() -> int:
    """The address of ``GOMP_parallel`` in the OpenMP runtime torch uses, or 0 when there is none to share."""
    global _ENTRY
    if _ENTRY is None:
        _ENTRY = _find_entry()
    return _ENTRY


def threads() -> int:
    """How many threads torch's operators run on from this thread (``torch.get_num_threads()``)."""
    return torch.get_num_threads()


def _find_entry() -> int:
    if not sys.platform.startswith("linux") or "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return 0
    path = _loaded_libgomp()
    if path is None:
        return 0
    try:
        library = ctypes.CDLL(path)  # already loaded: the same handle and the same thread pool as torch's
        return ctypes.cast(library.GOMP_parallel, ctypes.c_void_p).value or 0
    except (OSError, AttributeError):
        return 0


def _loaded_libgomp() -> str | None:
    """The path of the libgomp mapped into this process, if exactly one is."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "/" in line}
    except OSError:
        return None
    found = sorted(p for p in paths if os.path.basename(p).startswith("libgomp"))
    return found[0] if len(found) == 1 else None

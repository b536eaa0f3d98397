"""``kernels.moments_many`` spread over torch's OpenMP threads.

A step's parameter passes (values with their copy, gradients, updates) read every parameter once each;
on one thread they are the largest part of what recording costs per step, and they grow with the model
while torch's own work spreads over all cores. Here the arrays are cut into work items (pieces of
``PART`` elements, and the units of batched arrays in ranges of about as many elements for their unit
statistics), the threads of torch's OpenMP
team (``openmp``) claim items from a shared counter until none is left, each item's partial row lands in
its own slot, and the partial rows are merged per array afterwards. The team is the one torch's operators
run on, so nothing new competes for the cores; where there is no such team, or the work is too small to
be worth sharing, the calling thread runs ``kernels.moments_many`` alone.

Each item is a contiguous piece summed by the same compiled ``moments`` loop as on one thread; the pass
itself is ``compiled.team`` (on numba's JIT its disk cache holds that loop compiled into it: clear the
cache, ``*.nbi`` and ``*.nbc``, after editing ``compiled/moments.py`` in a source checkout, or the threads
keep running the old loop; the module built ahead of time is rebuilt by itself).

The merged sums differ from a single-thread pass in the order partial sums are added and, as between any
two compiled copies of a kernel, in the last bits of a block's float32 sum: within the dtype's rounding
of the sum of magnitudes.
"""
from __future__ import annotations

import warnings

import numpy as np
import torch

from comgra_ndbg.stats import backend, kernels, openmp
from comgra_ndbg.stats.fields import NUM_FIELDS

__all__ = ["MIN_ELEMENTS", "MIN_UNITS", "MOMENTS", "PART", "UNIT_COUNTS", "moments_many", "moments_many_built", "plan",
           "warm_up"]

PART = (2 * kernels.BLOCK, 16 * kernels.BLOCK)
"""Least and most elements per work item: about eight items per thread, each large enough that claiming it
and choosing its shift cost nothing against its arithmetic."""
MIN_ELEMENTS = 2 * PART[0]
"""Total elements below which the calling thread alone finishes first."""
MIN_UNITS = 128
"""Units per unit-statistics item at least (a tall batch gets fewer elements per item than ``PART``): each
row's slice of an item spans several cache lines."""

MOMENTS, UNIT_COUNTS = 0, 1
"""The kinds of work item in a ``plan``'s table (its columns: array, kind, first, end)."""


def moments_many(dtype: np.dtype, addresses: np.ndarray, sizes: np.ndarray, rows: np.ndarray, *,
                 starts: np.ndarray | None = None, copies: np.ndarray | None = None,
                 batches: np.ndarray | None = None, shared: bool | None = None) -> np.ndarray:
    """``kernels.moments_many`` (same arguments and results), on torch's OpenMP threads when there are
    several and the arrays hold at least ``MIN_ELEMENTS`` elements together. Each piece takes the sums
    around its own shift and flags its own non-finite or cancelling sums, so a row is as exact as the
    single-thread one (see the module docstring for how its sums may differ). ``shared`` forces the
    choice (True: use the team whenever one is found, however small the work; False: never)."""
    entry = openmp.entry() if shared is not False else 0
    threads = openmp.threads() if entry else 1
    if entry and (shared or threads > 1) and type(sizes) is np.ndarray:  # (else kernels.moments_many says why)
        total = sum(sizes.tolist())
        if (shared or total >= MIN_ELEMENTS) and _team_ready():
            _, arrays = kernels.addressed(dtype, addresses, sizes, rows, starts, copies, batches)
            exact = np.zeros(len(sizes), dtype=np.bool_)
            kernels.misfit(_TEAM[0](entry, _part(total, threads), np.dtype(dtype).itemsize, *arrays, rows, exact),
                           arrays)
            return exact
    return kernels.moments_many(dtype, addresses, sizes, rows, starts=starts, copies=copies, batches=batches)


def moments_many_built(dtype: np.dtype, addresses: np.ndarray, sizes: np.ndarray, rows: np.ndarray,
                       starts: np.ndarray | None, copies: np.ndarray | None, batches: np.ndarray | None
                       ) -> np.ndarray:
    """``moments_many`` for a caller that built every argument itself as ``kernels.addressed`` checks them
    (``dtype`` a float32 or float64 ``np.dtype``; addresses, sizes and the optional arrays C-contiguous int64
    arrays of one length; ``rows`` a writable C-contiguous float64 block of that many rows): the same call and
    results without those checks, which cost several times the kernel on a step's few small arrays (the
    recorder's packed passes over parameters and gradients). The compiled pass still checks sizes and
    batches."""
    none = kernels.nones(len(sizes))
    arrays = (addresses, none if starts is None else starts, none if copies is None else copies, sizes,
              none if batches is None else batches)
    exact = np.zeros(len(sizes), dtype=np.bool_)
    threads = torch.get_num_threads()  # ``openmp.threads()``, inline; one thread has no team to share
    entry = openmp.entry() if threads > 1 else 0
    if entry:
        total = sum(sizes.tolist())
        if total >= MIN_ELEMENTS and _team_ready():
            kernels.misfit(_TEAM[0](entry, _part(total, threads), dtype.itemsize, *arrays, rows, exact), arrays)
            return exact
    suffix = kernels._SUFFIX[dtype]
    bad = kernels._entry("moments_many", suffix)(kernels._LIKE[suffix], *arrays, rows, exact)
    if bad >= 0:
        kernels.misfit(bad, arrays)
    return exact


def plan(sizes: np.ndarray, batches: np.ndarray, part: int) -> np.ndarray:
    """The work items ``[k, 4]`` (array, kind, first, end) for arrays of ``sizes`` elements (int64) with
    ``batches`` (int64, 0: no unit statistics): moments in pieces of ``part`` elements, the unit statistics
    of batched arrays in ranges of units (first unit, end) of about ``part`` elements (``MIN_UNITS`` units
    at least).

    >>> plan(np.array([10, 6], dtype=np.int64), np.array([0, 2], dtype=np.int64), 4).tolist()
    [[0, 0, 0, 4], [0, 0, 4, 8], [0, 0, 8, 10], [1, 1, 0, 3], [1, 0, 0, 4], [1, 0, 4, 6]]
    """
    for name, array in (("sizes", sizes), ("batches", batches)):
        if not (type(array) is np.ndarray and array.dtype == np.int64 and array.shape == (len(sizes),)
                and array.flags.c_contiguous):
            raise TypeError(f"plan's {name} must be a C-contiguous int64 array of {len(sizes)} values")
    if part < 1 or not (sizes > 0).all() or not (batches >= 0).all():
        raise ValueError(f"plan needs a positive part, sizes > 0 and batches >= 0, got part {part}, sizes "
                         f"{sizes.tolist()}, batches {batches.tolist()}")
    return backend.entries().team_plan(sizes, batches, int(part))


_TEAM: list = [None]  # the compiled team pass once it has run (False: it cannot run here)


def _team_ready() -> bool:
    """Whether the shared-team pass can run: the compiled kernels are available and (on numba's JIT) the
    pass compiles; a failure warns once and leaves the work on the calling thread."""
    if _TEAM[0] is None:
        _TEAM[0] = False
        if kernels.AVAILABLE:
            try:
                _TEAM[0] = backend.entries().team_run
                _TEAM[0](0, PART[0], 4, *([kernels.nones(0)] * 5), np.zeros((0, NUM_FIELDS)),
                         np.zeros(0, dtype=np.bool_))  # no items: compiles (JIT) without entering the team
            except Exception as error:  # noqa: BLE001 - any compiler failure means: run on one thread
                _TEAM[0] = False
                warnings.warn(f"summaries run on one thread: the shared-thread kernel did not compile ({error})",
                              RuntimeWarning, stacklevel=3)
    return _TEAM[0] is not False


def _part(total: int, threads: int) -> int:
    """Elements per work item for ``total`` elements on ``threads`` threads (a multiple of ``BLOCK``)."""
    block = kernels.BLOCK
    return min(max(-(-total // (8 * threads * block)) * block, PART[0]), PART[1])


def warm_up() -> None:
    """Compile (or load from numba's disk cache) the kernels and the shared-team variant now rather than on
    the first recorded step.

    >>> warm_up()
    """
    kernels.warm_up()
    if not openmp.entry() or not _team_ready():
        return
    for dtype in (np.float32, np.float64):
        a = np.arange(1.0, 7.0, dtype=dtype)
        addresses = np.array([a.ctypes.data], dtype=np.int64)
        sizes = np.array([a.size], dtype=np.int64)
        rows = np.zeros((1, NUM_FIELDS))
        moments_many(a.dtype, addresses, sizes, rows, shared=True)
        moments_many(a.dtype, addresses, sizes, rows, copies=addresses, shared=True)
        moments_many(a.dtype, addresses, sizes, rows, starts=addresses, shared=True)
        moments_many(a.dtype, addresses, sizes, rows, batches=np.array([2], dtype=np.int64), shared=True)

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

Each item is a contiguous piece summed by the same compiled ``kernels._moments`` as on one thread (numba
caches this module's kernels with that function compiled into them: clear the cache, ``*.nbi`` and
``*.nbc``, after editing ``kernels.py`` in a source checkout, or the threads keep running the old loop).

The merged sums differ from a single-thread pass in the order partial sums are added and, as between any
two compiled copies of a kernel, in the last bits of a block's float32 sum: within the dtype's rounding
of the sum of magnitudes.
"""
from __future__ import annotations

import warnings

import numpy as np

from comgra_ndbg.stats import kernels, openmp
from comgra_ndbg.stats.fields import FIELD, NUM_FIELDS

__all__ = ["MIN_ELEMENTS", "MIN_UNITS", "PART", "moments_many", "warm_up"]

PART = (2 * kernels.BLOCK, 16 * kernels.BLOCK)
"""Least and most elements per work item: about eight items per thread, each large enough that claiming it
and choosing its shift cost nothing against its arithmetic."""
MIN_ELEMENTS = 2 * PART[0]
"""Total elements below which the calling thread alone finishes first."""
MIN_UNITS = 128
"""Units per unit-statistics item at least (a tall batch gets fewer elements per item than ``PART``): each
row's slice of an item spans several cache lines."""

# The header the team's threads read: the item counter, then what the items refer to.
_COUNTER, _ITEMS, _ITEMSIZE, _TABLE, _ADDRESSES, _STARTS, _COPIES, _SIZES, _BATCHES, _PARTIAL, _FLAGS = range(11)
_HEADER = 11
_MOMENTS, _UNIT_COUNTS = 0, 1  # item kinds
_SUM, _SUM_SQ, _SUM_ABS = FIELD["sum"], FIELD["sum_sq"], FIELD["sum_abs"]
_MIN, _MAX, _ZEROS = FIELD["min"], FIELD["max"], FIELD["zeros"]
_UNITS, _DEAD = FIELD["units"], FIELD["dead_units"]
_SPREAD_COUNT, _SPREAD_SUM_SQ, _SPREAD_DEV = FIELD["spread_count"], FIELD["spread_sum_sq"], FIELD["spread_dev_sq"]

if kernels.AVAILABLE:
    import numba
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic

    from comgra_ndbg.stats.unit_kernels import deviation, unit_counts

    _moments = kernels._moments

    @intrinsic
    def _address(typingctx, value):  # noqa: ARG001 - numba's intrinsic signature
        """The integer ``value`` as an untyped pointer."""
        if not isinstance(value, types.Integer):
            return None

        def codegen(context, builder, signature, args):
            return builder.inttoptr(args[0], ir.IntType(8).as_pointer())

        return types.voidptr(value), codegen

    @intrinsic
    def _claim(typingctx, header):  # noqa: ARG001
        """Atomically increment ``header[0]``; returns its value before (the index of the claimed item)."""
        if not isinstance(header, types.Array) or header.dtype != types.int64:
            return None

        def codegen(context, builder, signature, args):
            data = context.make_array(signature.args[0])(context, builder, args[0]).data
            return builder.atomic_rmw("add", data, ir.Constant(ir.IntType(64), 1), "monotonic")

        return types.int64(header), codegen

    @intrinsic
    def _enter(typingctx, entry, body, data):  # noqa: ARG001
        """``GOMP_parallel(body, data, 0, 0)`` through its address ``entry``: run ``body(data)`` on every
        thread of the calling thread's team (as many as torch's operators use) and wait for all of them."""
        if not all(isinstance(arg, types.Integer) for arg in (entry, body, data)):
            return None

        def codegen(context, builder, signature, args):
            pointer = ir.IntType(8).as_pointer()
            unsigned = ir.IntType(32)
            function = ir.FunctionType(ir.VoidType(), [pointer, pointer, unsigned, unsigned])
            callee = builder.inttoptr(args[0], function.as_pointer())
            builder.call(callee, [builder.inttoptr(args[1], pointer), builder.inttoptr(args[2], pointer),
                                  ir.Constant(unsigned, 0), ir.Constant(unsigned, 0)])
            return context.get_dummy_value()

        return types.void(entry, body, data), codegen

    @numba.njit(nogil=True, cache=True)
    def _load(base, j):  # pragma: no cover - compiled
        """Element ``j`` of the int64 array at address ``base``."""
        return numba.carray(_address(base + 8 * j), (1,), np.int64)[0]

    @numba.njit(nogil=True, cache=True)
    def _work(header, dtype):  # pragma: no cover - compiled
        """Claim and run items until none is left (every thread of the team runs this)."""
        count = header[_ITEMS]
        table = numba.carray(_address(header[_TABLE]), (count, 4), np.int64)
        partial = numba.carray(_address(header[_PARTIAL]), (count, NUM_FIELDS), np.float64)
        flags = numba.carray(_address(header[_FLAGS]), (count,), np.int64)
        itemsize = header[_ITEMSIZE]
        out = np.empty(5)
        while True:
            k = _claim(header)
            if k >= count:
                break
            j, kind, low, high = table[k, 0], table[k, 1], table[k, 2], table[k, 3]
            address, start, copy = _load(header[_ADDRESSES], j), _load(header[_STARTS], j), _load(header[_COPIES], j)
            row = partial[k]
            if kind == _UNIT_COUNTS:  # the units [low, high): each keeps its own shifts and its own flag
                size, batch = _load(header[_SIZES], j), _load(header[_BATCHES], j)
                unit_counts(numba.carray(_address(address), (batch, size // batch), dtype), None, batch > 1, low, high,
                            out)
                row[_DEAD] = out[0]
                row[_SPREAD_DEV], again = deviation(out) if batch > 1 else (0.0, False)
                flags[k] = 1 if again else 0
                continue
            offset = itemsize * low
            a = numba.carray(_address(address + offset), (high - low,), dtype)
            if start != 0:
                exact = _moments(a, numba.carray(_address(start + offset), (high - low,), dtype), None, row)
            elif copy != 0:
                exact = _moments(a, None, numba.carray(_address(copy + offset), (high - low,), dtype), row)
            else:
                exact = _moments(a, None, None, row)
            flags[k] = 1 if exact else 0

    def _body(data):  # pragma: no cover - compiled
        """What every thread of the team runs: the items of the array dtype the header names."""
        header = numba.carray(data, (_HEADER,), np.int64)
        if header[_ITEMSIZE] == 4:
            _work(header, np.float32)
        else:
            _work(header, np.float64)

    @numba.njit(nogil=True, cache=True)
    def _plan(sizes, batches, part):  # pragma: no cover - compiled
        """Work items ``[k, 4]`` (array, kind, first, end): moments in pieces of ``part`` elements, and the
        unit statistics of batched arrays in ranges of units (first unit, end) of about ``part`` elements
        (``MIN_UNITS`` units at least)."""
        count = 0
        for j in range(sizes.size):
            count += (sizes[j] + part - 1) // part
            if batches[j] > 0:
                width, columns = sizes[j] // batches[j], max(part // batches[j], MIN_UNITS)
                count += (width + columns - 1) // columns
        table = np.empty((count, 4), dtype=np.int64)
        k = 0
        for j in range(sizes.size):
            if batches[j] > 0:
                width, columns = sizes[j] // batches[j], max(part // batches[j], MIN_UNITS)
                for low in range(0, width, columns):
                    table[k, 0], table[k, 1], table[k, 2], table[k, 3] = j, _UNIT_COUNTS, low, min(low + columns, width)
                    k += 1
            for low in range(0, sizes[j], part):
                table[k, 0], table[k, 1], table[k, 2], table[k, 3] = j, _MOMENTS, low, min(low + part, sizes[j])
                k += 1
        return table

    @numba.njit(nogil=True, cache=True)
    def _run(entry, body, part, itemsize, addresses, starts, copies, sizes, batches, rows, exact):  # pragma: no cover
        """Run the items on the team, then merge each array's partial rows into its row of ``rows``."""
        table = _plan(sizes, batches, part)
        count = table.shape[0]
        partial = np.empty((count, NUM_FIELDS))
        flags = np.zeros(count, dtype=np.int64)
        header = np.zeros(_HEADER, dtype=np.int64)
        header[_ITEMS] = count
        header[_ITEMSIZE] = itemsize
        header[_TABLE] = table.ctypes.data
        header[_ADDRESSES] = addresses.ctypes.data
        header[_STARTS] = starts.ctypes.data
        header[_COPIES] = copies.ctypes.data
        header[_SIZES] = sizes.ctypes.data
        header[_BATCHES] = batches.ctypes.data
        header[_PARTIAL] = partial.ctypes.data
        header[_FLAGS] = flags.ctypes.data
        _enter(entry, body, header.ctypes.data)
        for j in range(sizes.size):
            row = rows[j]
            row[_SUM], row[_SUM_SQ], row[_SUM_ABS], row[_ZEROS] = 0.0, 0.0, 0.0, 0.0
            row[_MIN], row[_MAX] = np.inf, -np.inf
            if batches[j] > 0:
                row[_UNITS], row[_DEAD] = sizes[j] // batches[j], 0.0
            if batches[j] > 1:
                row[_SPREAD_DEV] = 0.0
            exact[j] = False
        for k in range(count):
            row = rows[table[k, 0]]
            piece = partial[k]
            if flags[k] != 0:
                exact[table[k, 0]] = True
            if table[k, 1] == _UNIT_COUNTS:
                row[_DEAD] += piece[_DEAD]
                row[_SPREAD_DEV] += piece[_SPREAD_DEV]
                continue
            row[_SUM] += piece[_SUM]
            row[_SUM_SQ] += piece[_SUM_SQ]
            row[_SUM_ABS] += piece[_SUM_ABS]
            row[_ZEROS] += piece[_ZEROS]
            row[_MIN] = min(row[_MIN], piece[_MIN])
            row[_MAX] = max(row[_MAX], piece[_MAX])
        for j in range(sizes.size):
            if batches[j] > 1:  # the spread covers every element when no flag is raised (else: recomputed)
                rows[j, _SPREAD_COUNT], rows[j, _SPREAD_SUM_SQ] = sizes[j], rows[j, _SUM_SQ]


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
    if entry and (shared or threads > 1):
        total = sum(sizes.tolist())
        body = _body_address() if shared or total >= MIN_ELEMENTS else 0  # compiled (or loaded) when first needed
        if body:
            none = kernels.nones(len(sizes))
            exact = np.zeros(len(sizes), dtype=np.bool_)
            _run(entry, body, _part(total, threads), dtype.itemsize, addresses, none if starts is None else starts,
                 none if copies is None else copies, sizes, none if batches is None else batches, rows, exact)
            return exact
    return kernels.moments_many(dtype, addresses, sizes, rows, starts=starts, copies=copies, batches=batches)


_BODY: int | None = None


def _body_address() -> int:
    """The address of ``_body`` compiled as a C callback (on first use, from numba's disk cache when it is
    there), or 0 when the kernels or the compiler are not available here."""
    global _BODY
    if _BODY is None:
        _BODY = 0
        if kernels.AVAILABLE:
            try:
                _BODY = numba.cfunc(types.void(types.voidptr), nopython=True, cache=True)(_body).address
            except Exception as error:  # noqa: BLE001 - any compiler failure means: run on one thread
                warnings.warn(f"summaries run on one thread: the shared-thread kernel did not compile ({error})",
                              RuntimeWarning, stacklevel=2)
    return _BODY


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
    if not openmp.entry() or not _body_address():
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

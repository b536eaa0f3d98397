"""The shared-team pass of ``parallel`` as numba source: work items planned over the arrays (``plan``), claimed
by every thread of torch's OpenMP team from a shared counter, and the partial rows merged (``run``).

What the items are and why the team is torch's own is told in ``parallel``.
"""
from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from comgra_ndbg.stats.compiled.moments import misfit, moments
from comgra_ndbg.stats.compiled.units import deviation, unit_counts
from comgra_ndbg.stats.fields import FIELD, NUM_FIELDS
from comgra_ndbg.stats.parallel import MIN_UNITS, MOMENTS, UNIT_COUNTS

# The header the team's threads read: the item counter, then what the items refer to.
_COUNTER, _ITEMS, _ITEMSIZE, _TABLE, _ADDRESSES, _STARTS, _COPIES, _SIZES, _BATCHES, _PARTIAL, _FLAGS = range(11)
_HEADER = 11
_SUM, _SUM_SQ, _SUM_ABS = FIELD["sum"], FIELD["sum_sq"], FIELD["sum_abs"]
_MIN, _MAX, _ZEROS = FIELD["min"], FIELD["max"], FIELD["zeros"]
_UNITS, _DEAD = FIELD["units"], FIELD["dead_units"]
_SPREAD_COUNT, _SPREAD_SUM_SQ, _SPREAD_DEV = FIELD["spread_count"], FIELD["spread_sum_sq"], FIELD["spread_dev_sq"]
_BODY_SYMBOL = "comgra_ndbg_team_body"


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
        if kind == UNIT_COUNTS:  # the units [low, high): each keeps its own shifts and its own flag
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
            exact = moments(a, numba.carray(_address(start + offset), (high - low,), dtype), None, row)
        elif copy != 0:
            exact = moments(a, None, numba.carray(_address(copy + offset), (high - low,), dtype), row)
        else:
            exact = moments(a, None, None, row)
        flags[k] = 1 if exact else 0


def _body(data):  # pragma: no cover - compiled
    """What every thread of the team runs: the items of the array dtype the header names."""
    header = numba.carray(data, (_HEADER,), np.int64)
    if header[_ITEMSIZE] == 4:
        _work(header, np.float32)
    else:
        _work(header, np.float64)


@intrinsic
def _body_pointer(typingctx):  # noqa: ARG001
    """The address of a C function ``void body(void *header)`` that runs ``_body``: what ``GOMP_parallel``
    calls on every thread. It is emitted into the module of the function that asks for it, so the JIT and
    the module built ahead of time both hold their own copy and numba's ``cfunc`` (which needs numba at run
    time) is not used. ``_body`` raises nothing on the headers ``run`` builds (its checked arguments); were it
    to stop early (an allocation failing), the items it claimed keep the flag ``run`` sets before the team
    starts, and their arrays are recomputed exactly."""
    signature = types.void(types.voidptr)

    def codegen(context, builder, sig, args):
        compiled = context.compile_subroutine(builder, _body, signature)
        module = builder.module
        function = module.globals.get(_BODY_SYMBOL)
        if function is None:
            pointer = ir.IntType(8).as_pointer()
            function = ir.Function(module, ir.FunctionType(ir.VoidType(), [pointer]), _BODY_SYMBOL)
            function.linkage = "internal"
            inner = ir.IRBuilder(function.append_basic_block("entry"))
            context.call_internal_no_propagate(inner, compiled.fndesc, signature, [function.args[0]])
            inner.ret_void()
        return builder.ptrtoint(function, ir.IntType(64))

    return types.int64(), codegen


@numba.njit(nogil=True, cache=True)
def plan(sizes, batches, part):  # pragma: no cover - compiled
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
                table[k, 0], table[k, 1], table[k, 2], table[k, 3] = j, UNIT_COUNTS, low, min(low + columns, width)
                k += 1
        for low in range(0, sizes[j], part):
            table[k, 0], table[k, 1], table[k, 2], table[k, 3] = j, MOMENTS, low, min(low + part, sizes[j])
            k += 1
    return table


@numba.njit(nogil=True, cache=True)
def run(entry, part, itemsize, addresses, starts, copies, sizes, batches, rows, exact):  # pragma: no cover
    """Run the items on the team, then merge each array's partial rows into its row of ``rows``. Returns -1,
    or (running nothing) the first array ``misfit`` finds."""
    bad = misfit(addresses, sizes, batches)
    if bad >= 0:
        return bad
    table = plan(sizes, batches, part)
    count = table.shape[0]
    partial = np.empty((count, NUM_FIELDS))
    flags = np.ones(count, dtype=np.int64)  # an item a thread did not finish stays flagged: recomputed exactly
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
    if count > 0:  # (no items: nothing to hand to the team, whose entry may then be 0)
        _enter(entry, _body_pointer(), header.ctypes.data)
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
        if table[k, 1] == UNIT_COUNTS:
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
    return -1

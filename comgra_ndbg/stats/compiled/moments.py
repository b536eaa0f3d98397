"""The single-pass summary kernels of ``kernels`` as numba source: moments, their fused copy and difference
variants, many arrays by address, unit statistics and per-sample rows.

How the arithmetic stays exact enough under ``fastmath`` is told in ``kernels``; this module only holds the
loops, which ``entries`` wraps for numba's JIT and for the module built ahead of time (``build``).
"""
from __future__ import annotations

import numba
import numpy as np
from numba import types
from numba.extending import intrinsic

from comgra_ndbg.stats.compiled.bits import from_bits as _from_bits
from comgra_ndbg.stats.compiled.bits import signed_bits as _signed_bits
from comgra_ndbg.stats.compiled.bits import unsigned_bits as _unsigned_bits
from comgra_ndbg.stats.compiled.units import deviation, unit_counts
from comgra_ndbg.stats.fields import FIELD, NUM_FIELDS
from comgra_ndbg.stats.kernels import BLOCK, PROBES

_SUM, _SUM_SQ, _SUM_ABS = FIELD["sum"], FIELD["sum_sq"], FIELD["sum_abs"]
_MIN, _MAX, _ZEROS = FIELD["min"], FIELD["max"], FIELD["zeros"]
_COUNT, _NUM_FIELDS = FIELD["count"], NUM_FIELDS
_UNITS, _DEAD = FIELD["units"], FIELD["dead_units"]
_BOUNDED, _SATURATED, _SATURATED_UNITS = FIELD["bounded"], FIELD["saturated"], FIELD["saturated_units"]
_SPREAD_COUNT, _SPREAD_SUM_SQ, _SPREAD_DEV = FIELD["spread_count"], FIELD["spread_sum_sq"], FIELD["spread_dev_sq"]
_TINY32 = float(np.finfo(np.float32).tiny)  # the smallest normal float32


@numba.njit(fastmath=True, nogil=True, cache=True)
def block(a, start, copy_to, c, shifted, low, high, negative):  # pragma: no cover - compiled
    """One block of ``shifted_sums``: its sums in the array's dtype (Σd, Σd², Σ|x|, the non-zero count)
    and the extremes' bit patterns so far, as a tuple (no array allocated per call). The arguments are
    slices, so the loop runs from 0 over a whole view, which LLVM vectorises; the same loop over
    ``range(begin, end)`` of the whole array was not (its indices might be negative, for all the
    compiler knows) and ran about seven times slower. ``shifted`` (c is not 0) is a flag the loop
    is compiled twice for: without the shift it does one operation in eleven less per element (an array
    in the L2 cache is summarised about 30 % faster)."""
    one = np.ones(1, a.dtype)[0]
    zero = one - one
    s = zero
    q = zero
    b = zero
    nz = zero
    for i in range(a.size):
        if start is not None:
            x = a[i] - start[i]
        else:
            x = a[i]
        if copy_to is not None:
            copy_to[i] = a[i]
        d = x - c if shifted else x
        s += d
        q += d * d
        b += abs(x)
        nz += one if x != zero else zero
        k = _signed_bits(x)
        u = _unsigned_bits(x)
        low = k if k < low else low
        high = k if k > high else high
        negative = u if u > negative else negative
    return s, q, b, nz, low, high, negative


@numba.njit(fastmath=True, nogil=True, cache=True)
def shifted_sums(a, start, copy_to):  # pragma: no cover - compiled
    """``(Σ(x-c), Σ(x-c)², Σ|x|, the non-zero count, c, max, min)`` (extremes from bit patterns) of
    ``x = a - start`` (or of ``a`` when ``start`` is None), copying ``a`` into ``copy_to`` when given.
    The shift c is 0 unless the mean of ``PROBES`` evenly spaced elements exceeds three times their
    spread; then it is the probe closest to that mean (an element, so integer data stays exact)."""
    n = a.size
    one = np.ones(1, a.dtype)[0]
    zero = one - one
    stride = max(n // PROBES, 1)
    probes = (n - 1) // stride + 1
    mean = 0.0
    mean_sq = 0.0
    for i in range(0, n, stride):
        p = (a[i] - start[i]) if start is not None else a[i]
        mean += p / probes
        mean_sq += p * p / probes
    c = zero
    if mean * mean > 9.0 * (mean_sq - mean * mean):  # the mean dwarfs the spread: shift by a probe near it
        for i in range(0, n, stride):
            p = (a[i] - start[i]) if start is not None else a[i]
            if abs(p - mean) < abs(c - mean):
                c = p
    if start is not None:
        first = a[0] - start[0]
    else:
        first = a[0]
    total = 0.0  # each block's sums in the array's dtype, added up in float64
    total_sq = 0.0
    total_abs = 0.0
    nonzero = 0.0
    low = _signed_bits(first)
    high = low
    negative = _unsigned_bits(first)
    shifted = c != zero
    for begin in range(0, n, BLOCK):
        end = min(begin + BLOCK, n)
        if start is not None and copy_to is not None:
            s, q, b, nz, low, high, negative = block(a[begin:end], start[begin:end], copy_to[begin:end], c,
                                                      shifted, low, high, negative)
        elif start is not None:
            s, q, b, nz, low, high, negative = block(a[begin:end], start[begin:end], None, c, shifted,
                                                      low, high, negative)
        elif copy_to is not None:
            s, q, b, nz, low, high, negative = block(a[begin:end], None, copy_to[begin:end], c, shifted,
                                                      low, high, negative)
        else:
            s, q, b, nz, low, high, negative = block(a[begin:end], None, None, c, shifted, low, high,
                                                      negative)
        total += s
        total_sq += q
        total_abs += b
        nonzero += nz
    # Largest value: the largest signed pattern if any element is >= +0, else (all negative) the smallest.
    largest = _from_bits(high) if high >= 0 else _from_bits(low)
    # Smallest value: the largest unsigned pattern if any element is negative (sign bit set), else the
    # smallest signed pattern.
    smallest = _from_bits(negative) if _signed_bits(_from_bits(negative)) < 0 else _from_bits(low)
    return total, total_sq, total_abs, nonzero, c, largest, smallest


@numba.njit(nogil=True, cache=True)
def moments(a, start, copy_to, row):  # pragma: no cover - compiled
    """Fill the moment fields of ``row``; returns True when they need the exact recompute."""
    s, q, total_abs, nonzero, c, largest, smallest = shifted_sums(a, start, copy_to)
    n = a.size
    row[_SUM] = s + n * c
    row[_SUM_SQ] = q + 2.0 * c * s + n * c * c  # Σx² = Σ(x-c)² + 2cΣ(x-c) + nc²
    row[_SUM_ABS] = total_abs
    row[_ZEROS] = n - nonzero
    row[_MAX] = largest
    row[_MIN] = smallest
    if not (np.isfinite(s) and np.isfinite(q) and np.isfinite(total_abs) and np.isfinite(c)):
        return True
    # squares below float32's smallest normal number (|x| < 1e-19: a vanishing gradient) lose their digits or
    # vanish: recompute when what they could lose, n * tiny, exceeds 1e-7 of the largest square (float64
    # arrays too, whose squares would not underflow so soon: the recompute gives them the same sums)
    peak = max(abs(float(largest)), abs(float(smallest)))
    if peak > 0.0 and peak * peak < n * _TINY32 * 1e7:
        return True
    return n > 1 and q > 0 and q - s * s / n < 1e-2 * q


@intrinsic
def pointer(typingctx, address, like):  # noqa: ARG001
    """The integer ``address`` as a pointer to elements of ``like``'s dtype."""
    if not isinstance(address, types.Integer) or not isinstance(like, types.Array):
        return None
    target = types.CPointer(like.dtype)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(target))

    return target(address, like), codegen


@numba.njit(nogil=True, cache=True)
def misfit(addresses, sizes, batches):  # pragma: no cover - compiled
    """The first array that cannot be read as described (no address, no element, a negative batch size or
    one that does not divide its size), or -1: looked for before any is read."""
    for j in range(sizes.size):
        if addresses[j] == 0 or sizes[j] <= 0 or batches[j] < 0 or (batches[j] > 0 and sizes[j] % batches[j]):
            return j
    return -1


@numba.njit(nogil=True, cache=True)
def moments_many(like, addresses, starts, copies, sizes, batches, rows, exact):  # pragma: no cover
    """``moments`` over arrays given by address (``starts``/``copies`` hold 0 where there is none), and
    the unit statistics of those with a batch size in ``batches`` (0: batch-less). Returns -1, or (reading
    nothing) the first array ``misfit`` finds."""
    bad = misfit(addresses, sizes, batches)
    if bad >= 0:
        return bad
    for j in range(sizes.size):
        a = numba.carray(pointer(addresses[j], like), (sizes[j],))
        if starts[j] != 0:
            exact[j] = moments(a, numba.carray(pointer(starts[j], like), (sizes[j],)), None, rows[j])
        elif copies[j] != 0:
            exact[j] = moments(a, None, numba.carray(pointer(copies[j], like), (sizes[j],)), rows[j])
        else:
            exact[j] = moments(a, None, None, rows[j])
        if batches[j] > 0:
            again = units(a.reshape((batches[j], sizes[j] // batches[j])), None, True, rows[j])
            exact[j] = exact[j] or again
    return -1


@numba.njit(nogil=True, cache=True)
def units(a, thresholds, batched, row):  # pragma: no cover - compiled
    """The unit statistics of a ``[batch, units]`` array into ``row`` (whose moments are already there):
    units, dead units and the sample spread when ``batched``, saturation counts with ``thresholds``.
    Returns True when the spread needs the exact recompute."""
    spread = batched and a.shape[0] > 1
    out = np.empty(5)
    unit_counts(a, thresholds, spread, 0, a.shape[1], out)
    if batched:
        row[_UNITS] = a.shape[1]
        row[_DEAD] = out[0]
    if thresholds is not None:
        row[_BOUNDED] = a.size
        row[_SATURATED] = out[1]
        if batched:
            row[_SATURATED_UNITS] = out[2]
    if not spread:
        return False
    value, again = deviation(out)
    row[_SPREAD_COUNT] = a.size
    row[_SPREAD_SUM_SQ] = row[_SUM_SQ]
    row[_SPREAD_DEV] = value
    return again


@numba.njit(nogil=True, cache=True)
def summarize(a, thresholds, batched, row):  # pragma: no cover - compiled
    """Moments and unit statistics of a ``[batch, units]`` array in one call; returns the exact flag."""
    exact = moments(a.reshape(-1), None, None, row)
    if batched or thresholds is not None:
        again = units(a, thresholds, batched, row)
        exact = exact or again
    return exact


@numba.njit(nogil=True, cache=True)
def per_sample(a, thresholds):  # pragma: no cover - compiled
    """``per_sample`` in one compiled call: the rows allocated and set here, each sample widened to float64
    in a scratch row that ``moments`` then reads (the same array type it gets for a float64 input)."""
    n, m = a.shape
    rows = np.zeros((n, _NUM_FIELDS))
    exact = np.zeros(n, dtype=np.bool_)
    wide = np.empty(m)
    for i in range(n):
        for j in range(m):
            wide[j] = a[i, j]
        row = rows[i]
        row[_COUNT] = m
        exact[i] = moments(wide, None, None, row)
        if thresholds is not None:
            saturated = 0
            for j in range(m):
                saturated += (wide[j] <= thresholds[0]) | (wide[j] >= thresholds[1])
            row[_BOUNDED] = m
            row[_SATURATED] = saturated
    return rows, exact

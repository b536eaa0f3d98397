"""Single-pass summary kernels for host arrays, compiled with numba.

A summary needs Σx, Σx², Σ|x|, min, max and the zero count. numpy computes each in its own pass, and each
call costs microseconds of dispatch; these kernels read every element once and vectorise all six
reductions together, which is several times faster on typical layer sizes. Parameters get two fused
variants: summarising a value while copying it (the start-of-step copy that updates are measured
against) and summarising ``W - W_start`` without materialising the difference.

How the arithmetic stays exact enough under ``fastmath``:

- Sums run in the array's dtype over blocks of ``BLOCK`` elements and are added up in float64, so the
  error does not grow with the tensor's size. When a few evenly spaced elements show a mean that dwarfs
  the spread (LayerNorm gains of 1 ± 1e-4), the sums are taken around one of those elements, which keeps
  Σx² from cancelling; the caller receives plain Σx and Σx², rebuilt in float64.
- Minimum and maximum are integer reductions on the IEEE-754 bit patterns (``bits``: integer min/max
  vectorise, NaN-aware float min/max do not): for non-negative floats the signed pattern orders like the
  value, for negative floats the unsigned one orders like the magnitude.
- NaN and ±Inf are never looked for: they make a sum non-finite, and such rows are reported back for an
  exact float64 recompute (as are rows whose shifted sums still cancel).

Batched arrays get a second pass for their unit statistics (dead and saturated units, the sample spread;
``unit_kernels``), which flags its rows for the exact recompute by the same rules.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from comgra_ndbg.stats.bits import AVAILABLE
from comgra_ndbg.stats.fields import FIELD, NUM_FIELDS

if AVAILABLE:  # else the numpy path in host.py takes over
    import numba
    from numba import types
    from numba.extending import intrinsic

    from comgra_ndbg.stats.bits import from_bits as _from_bits
    from comgra_ndbg.stats.bits import signed_bits as _signed_bits
    from comgra_ndbg.stats.bits import unsigned_bits as _unsigned_bits
    from comgra_ndbg.stats.unit_kernels import deviation, unit_counts

__all__ = ["AVAILABLE", "BLOCK", "moments", "moments_many", "nones", "per_sample", "summarize", "units", "warm_up"]

BLOCK = 4096
"""Elements summed in the array's dtype before the partial sums move to float64."""
_PROBES = 64  # evenly spaced elements that decide the shift of the sums

_SUM, _SUM_SQ, _SUM_ABS = FIELD["sum"], FIELD["sum_sq"], FIELD["sum_abs"]
_MIN, _MAX, _ZEROS = FIELD["min"], FIELD["max"], FIELD["zeros"]
_COUNT, _NUM_FIELDS = FIELD["count"], NUM_FIELDS
_UNITS, _DEAD = FIELD["units"], FIELD["dead_units"]
_BOUNDED, _SATURATED, _SATURATED_UNITS = FIELD["bounded"], FIELD["saturated"], FIELD["saturated_units"]
_SPREAD_COUNT, _SPREAD_SUM_SQ, _SPREAD_DEV = FIELD["spread_count"], FIELD["spread_sum_sq"], FIELD["spread_dev_sq"]

if AVAILABLE:
    @numba.njit(fastmath=True, nogil=True, cache=True)
    def _block(a, start, copy_to, c, shifted, low, high, negative):  # pragma: no cover - compiled
        """One block of ``_shifted_sums``: its sums in the array's dtype (Σd, Σd², Σ|x|, the non-zero count)
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
    def _shifted_sums(a, start, copy_to):  # pragma: no cover - compiled
        """``(Σ(x-c), Σ(x-c)², Σ|x|, the non-zero count, c, max, min)`` (extremes from bit patterns) of
        ``x = a - start`` (or of ``a`` when ``start`` is None), copying ``a`` into ``copy_to`` when given.
        The shift c is 0 unless the mean of ``_PROBES`` evenly spaced elements exceeds three times their
        spread; then it is the probe closest to that mean (an element, so integer data stays exact)."""
        n = a.size
        one = np.ones(1, a.dtype)[0]
        zero = one - one
        stride = max(n // _PROBES, 1)
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
                s, q, b, nz, low, high, negative = _block(a[begin:end], start[begin:end], copy_to[begin:end], c,
                                                          shifted, low, high, negative)
            elif start is not None:
                s, q, b, nz, low, high, negative = _block(a[begin:end], start[begin:end], None, c, shifted,
                                                          low, high, negative)
            elif copy_to is not None:
                s, q, b, nz, low, high, negative = _block(a[begin:end], None, copy_to[begin:end], c, shifted,
                                                          low, high, negative)
            else:
                s, q, b, nz, low, high, negative = _block(a[begin:end], None, None, c, shifted, low, high,
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
    def _moments(a, start, copy_to, row):  # pragma: no cover - compiled
        """Fill the moment fields of ``row``; returns True when they need the exact recompute."""
        s, q, total_abs, nonzero, c, largest, smallest = _shifted_sums(a, start, copy_to)
        n = a.size
        row[_SUM] = s + n * c
        row[_SUM_SQ] = q + 2.0 * c * s + n * c * c  # Σx² = Σ(x-c)² + 2cΣ(x-c) + nc²
        row[_SUM_ABS] = total_abs
        row[_ZEROS] = n - nonzero
        row[_MAX] = largest
        row[_MIN] = smallest
        if not (np.isfinite(s) and np.isfinite(q) and np.isfinite(total_abs) and np.isfinite(c)):
            return True
        return n > 1 and q > 0 and q - s * s / n < 1e-2 * q

    @intrinsic
    def _pointer(typingctx, address, like):  # noqa: ARG001
        """The integer ``address`` as a pointer to elements of ``like``'s dtype."""
        if not isinstance(address, types.Integer) or not isinstance(like, types.Array):
            return None
        target = types.CPointer(like.dtype)

        def codegen(context, builder, signature, args):
            return builder.inttoptr(args[0], context.get_value_type(target))

        return target(address, like), codegen

    @numba.njit(nogil=True, cache=True)
    def _moments_many(like, addresses, starts, copies, sizes, batches, rows, exact):  # pragma: no cover
        """``_moments`` over arrays given by address (``starts``/``copies`` hold 0 where there is none), and
        the unit statistics of those with a batch size in ``batches`` (0: batch-less)."""
        for j in range(sizes.size):
            a = numba.carray(_pointer(addresses[j], like), (sizes[j],))
            if starts[j] != 0:
                exact[j] = _moments(a, numba.carray(_pointer(starts[j], like), (sizes[j],)), None, rows[j])
            elif copies[j] != 0:
                exact[j] = _moments(a, None, numba.carray(_pointer(copies[j], like), (sizes[j],)), rows[j])
            else:
                exact[j] = _moments(a, None, None, rows[j])
            if batches[j] > 0:
                again = _units(a.reshape((batches[j], sizes[j] // batches[j])), None, True, rows[j])
                exact[j] = exact[j] or again

    @numba.njit(nogil=True, cache=True)
    def _units(a, thresholds, batched, row):  # pragma: no cover - compiled
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
    def _summarize(a, thresholds, batched, row):  # pragma: no cover - compiled
        """Moments and unit statistics of a ``[batch, units]`` array in one call; returns the exact flag."""
        exact = _moments(a.reshape(-1), None, None, row)
        if batched or thresholds is not None:
            again = _units(a, thresholds, batched, row)
            exact = exact or again
        return exact


if AVAILABLE:
    @numba.njit(nogil=True, cache=True)
    def _per_sample(a, thresholds):  # pragma: no cover - compiled
        """``per_sample`` in one compiled call: the rows allocated and set here, each sample widened to float64
        in a scratch row that ``_moments`` then reads (the same array type it gets for a float64 input)."""
        n, m = a.shape
        rows = np.zeros((n, _NUM_FIELDS))
        exact = np.zeros(n, dtype=np.bool_)
        wide = np.empty(m)
        for i in range(n):
            for j in range(m):
                wide[j] = a[i, j]
            row = rows[i]
            row[_COUNT] = m
            exact[i] = _moments(wide, None, None, row)
            if thresholds is not None:
                saturated = 0
                for j in range(m):
                    saturated += (wide[j] <= thresholds[0]) | (wide[j] >= thresholds[1])
                row[_BOUNDED] = m
                row[_SATURATED] = saturated
        return rows, exact


def per_sample(a: np.ndarray, thresholds: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """The moments of every row of a C-contiguous float32 or float64 ``[n, m]`` array (m >= 1), summed in
    float64 (a few samples: exact enough and cheap), with saturation counts when ``thresholds`` (float64, margin
    applied) are given: the per-sample statistics of a snapshot. Returns the ``[n, fields]`` rows (count set,
    unit fields at the merge identity) and the per-row "recompute exactly" flags (NaN, Inf, cancelling sums).

    >>> rows, exact = per_sample(np.array([[0.5, 0.0], [-2.0, 0.995]], dtype=np.float32), np.array([-0.99, 0.99]))
    >>> exact.tolist(), rows[:, FIELD["sum"]].tolist(), rows[:, FIELD["saturated"]].tolist()
    ([False, False], [0.5, -1.0049999952316284], [0.0, 2.0])
    """
    return _per_sample(a, thresholds)


def summarize(a: np.ndarray, row: np.ndarray, thresholds: np.ndarray | None, batched: bool) -> bool:
    """All host statistics of a C-contiguous ``[batch, units]`` array (``[1, n]`` for a batch-less one) in
    one compiled call: ``moments`` plus, when ``batched``, units, dead units and (from 2 samples on) the
    sample spread, and with ``thresholds`` (an array of a's dtype holding the saturation thresholds, margin
    applied) the saturation counts. Returns True when the moments or the spread need the exact recompute.

    >>> row = np.zeros(NUM_FIELDS)
    >>> summarize(np.array([[0.0, 0.995], [0.0, -0.2]], dtype=np.float32), row,
    ...           np.array([-0.99, 0.99], dtype=np.float32), True)
    False
    >>> [int(row[FIELD[f]]) for f in ("units", "dead_units", "bounded", "saturated", "saturated_units")]
    [2, 1, 4, 1, 0]
    """
    return bool(_summarize(a, thresholds, batched, row))


def moments(a: np.ndarray, row: np.ndarray, *, start: np.ndarray | None = None,
            copy_to: np.ndarray | None = None) -> bool:
    """Write zeros, Σx, Σx², Σ|x|, min and max of ``a`` (of ``a - start`` when given) into ``row``.

    ``a`` (and ``start``, ``copy_to``) are 1-D contiguous float32 or float64 arrays of one size, at least
    one element. Returns True when the row holds a non-finite or cancelling sum and must be recomputed
    exactly. ``copy_to`` receives a copy of ``a`` in the same pass.

    >>> row = np.zeros(NUM_FIELDS)
    >>> moments(np.array([3.0, -1.0, 0.0], dtype=np.float32), row)
    False
    >>> [float(row[FIELD[f]]) for f in ("zeros", "sum", "sum_sq", "sum_abs", "min", "max")]
    [1.0, 2.0, 10.0, 4.0, -1.0, 3.0]
    """
    return bool(_moments(a, start, copy_to, row))


def moments_many(dtype: np.dtype, addresses: np.ndarray, sizes: np.ndarray, rows: np.ndarray, *,
                 starts: np.ndarray | None = None, copies: np.ndarray | None = None,
                 batches: np.ndarray | None = None) -> np.ndarray:
    """``moments`` for many contiguous host arrays of one dtype in one call, given by the address of their
    first element and their size (int64 arrays); ``starts`` and ``copies`` are addresses too, 0 for none;
    ``batches`` holds the batch size of arrays whose units are counted (0 for none). Row ``j`` of ``rows``
    receives array ``j``'s fields; returns the boolean "recompute exactly" flags.

    The caller keeps the arrays alive and unchanged during the call.

    >>> a, b = np.array([1.0, -2.0], dtype=np.float32), np.array([0.5, 0.5, 0.0], dtype=np.float32)
    >>> rows = np.zeros((2, NUM_FIELDS))
    >>> moments_many(a.dtype, np.array([a.ctypes.data, b.ctypes.data]), np.array([2, 3]), rows)
    array([False, False])
    >>> rows[:, FIELD["sum"]].tolist(), rows[:, FIELD["zeros"]].tolist()
    ([-1.0, 1.0], [0.0, 1.0])
    """
    none = nones(len(sizes))
    exact = np.zeros(len(sizes), dtype=np.bool_)
    like = _LIKE.get(np.dtype(dtype).type)
    if like is None:
        like = np.empty(0, dtype=dtype)
    _moments_many(like, addresses, none if starts is None else starts, none if copies is None else copies, sizes,
                  none if batches is None else batches, rows, exact)
    return exact


_LIKE = {np.float32: np.empty(0, np.float32), np.float64: np.empty(0, np.float64)}
"""An empty array of each kernel dtype: what ``_moments_many`` reads the addressed elements as."""


@lru_cache(maxsize=64)
def nones(count: int) -> np.ndarray:
    """``count`` int64 zeros, cached: "no start, no copy, no batch" for every array of a ``moments_many``
    call (here and in ``parallel``); the kernels only read them, callers must not write them. Left writable:
    numba would compile another variant for a read-only array.

    >>> nones(3).tolist(), nones(3) is nones(3)
    ([0, 0, 0], True)
    """
    return np.zeros(count, dtype=np.int64)


def units(a: np.ndarray, row: np.ndarray, bounds: tuple[float, float] | None) -> bool:
    """Write the unit statistics of a ``[batch, units]`` array into ``row``, whose moments are already there:
    units, dead units, the sample spread (its Σx² is the row's) and, with ``bounds`` (the saturation
    thresholds, margin applied), bounded, saturated elements and saturated units. Returns True when the
    spread needs the exact recompute.

    >>> a, row = np.array([[0.0, 0.995], [0.0, -0.2]], dtype=np.float32), np.zeros(NUM_FIELDS)
    >>> moments(a.reshape(-1), row), units(a, row, (-0.99, 0.99))
    (False, False)
    >>> [int(row[FIELD[f]]) for f in ("units", "dead_units", "bounded", "saturated", "saturated_units")]
    [2, 1, 4, 1, 0]
    >>> round(float(row[FIELD["spread_dev_sq"]]), 4), int(row[FIELD["spread_count"]])  # 2 × ((0.995 + 0.2) / 2)²
    (0.714, 4)
    """
    thresholds = None if bounds is None else np.array(bounds, dtype=a.dtype)
    return bool(_units(a, thresholds, True, row))


def warm_up() -> None:
    """Compile (or load from numba's disk cache) every kernel variant the recorder uses, for float32 and
    float64, now rather than on the first recorded step: about 7 s the first time on a machine, 0.3 s
    once cached. Timing code calls it so that the one-time cost stays out of its measurements.

    >>> warm_up()
    """
    if not AVAILABLE:
        return
    for dtype in (np.float32, np.float64):
        a = np.arange(1.0, 7.0, dtype=dtype).reshape(2, 3)
        flat = a.reshape(-1)
        row = np.zeros(NUM_FIELDS)
        rows = np.zeros((2, NUM_FIELDS))
        thresholds = np.array([-0.9, 0.9], dtype=dtype)
        moments(flat, row)
        moments(flat, row, copy_to=np.empty_like(flat))
        moments(flat, row, start=flat.copy())
        for batched in (False, True):
            summarize(a, row, None, batched)
            summarize(a, row, thresholds, batched)
        addresses = np.array([flat.ctypes.data, flat.ctypes.data], dtype=np.int64)
        sizes = np.array([flat.size, flat.size], dtype=np.int64)
        moments_many(flat.dtype, addresses, sizes, rows)
        moments_many(flat.dtype, addresses, sizes, rows, batches=np.array([2, 0], dtype=np.int64))
        moments_many(flat.dtype, addresses, sizes, rows, copies=addresses)
        moments_many(flat.dtype, addresses, sizes, rows, starts=addresses)
        per_sample(a, None)
        per_sample(a, thresholds.astype(np.float64))

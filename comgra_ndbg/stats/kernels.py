"""Single-pass summary kernels for host arrays, compiled with numba: the checked Python entry points.

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
- Minimum and maximum are integer reductions on the IEEE-754 bit patterns (``compiled.bits``: integer min/max
  vectorise, NaN-aware float min/max do not): for non-negative floats the signed pattern orders like the
  value, for negative floats the unsigned one orders like the magnitude.
- NaN and ±Inf are never looked for: they make a sum non-finite, and such rows are reported back for an
  exact float64 recompute (as are rows whose shifted sums still cancel).

Batched arrays get a second pass for their unit statistics (dead and saturated units, the sample spread;
``compiled.units``), which flags its rows for the exact recompute by the same rules.

The loops are in ``compiled`` (``moments``, ``units``, ``bits``); they run from the module ``backend`` has
built ahead of time for this machine, or through numba's JIT. Neither checks what it is given, so the
functions here check every array's dtype, layout and size first and raise TypeError, never read or write
past an array.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from comgra_ndbg.stats import backend
from comgra_ndbg.stats.fields import NUM_FIELDS

__all__ = ["AVAILABLE", "BLOCK", "ROWS", "SPREAD_TOLERANCE", "addressed", "misfit", "moments", "moments_many",
           "nones", "per_sample", "summarize", "summary_entry", "units", "warm_up"]

AVAILABLE = backend.available()
"""Whether the compiled kernels run here (else the numpy path in host.py takes over); which backend runs
them, the module built ahead of time or numba's JIT, is decided on first use (``backend``)."""

BLOCK = 4096
"""Elements summed in the array's dtype before the partial sums move to float64."""
PROBES = 64
"""Evenly spaced elements that decide the shift of the sums."""
ROWS = 4096
"""Rows per unit (and elements per row) the unit statistics sum in the array's dtype before float64."""
SPREAD_TOLERANCE = 1e-2
"""A spread below this fraction of Σd² is recomputed exactly: the float32 sums cannot resolve it."""

_SUFFIX = {np.dtype(np.float32): "_f32", np.dtype(np.float64): "_f64"}
_F64, _I64, _BOOL = np.dtype(np.float64), np.dtype(np.int64), np.dtype(np.bool_)
_NAMES: dict[tuple[str, str], object] = {}


def _entry(name: str, suffix: str) -> object:
    """The compiled entry ``name + suffix`` of this process's backend."""
    found = _NAMES.get((name, suffix))
    if found is None:
        found = _NAMES[name, suffix] = getattr(backend.entries(), name + suffix)
    return found


def _kind(a: object, ndim: int, what: str) -> str:
    """The entry suffix for ``a``: a C-contiguous float32 or float64 array of ``ndim`` dimensions, at least
    one element (the compiled code reads its first element unchecked). Anything else is a TypeError."""
    if type(a) is np.ndarray and a.ndim == ndim and a.size and a.flags.c_contiguous:
        suffix = _SUFFIX.get(a.dtype)
        if suffix is not None:
            return suffix
    raise TypeError(f"{what} must be a non-empty C-contiguous float32 or float64 numpy array of {ndim} "
                    f"dimension(s), got {_describe(a)}; convert it with np.ascontiguousarray(x, np.float32)")


def _like(a: object, other: np.ndarray, what: str, writable: bool = False) -> None:
    """``a`` must be a C-contiguous array of ``other``'s dtype and shape (writable when asked)."""
    if not (type(a) is np.ndarray and a.dtype == other.dtype and a.shape == other.shape and a.flags.c_contiguous
            and (a.flags.writeable or not writable)):
        raise TypeError(f"{what} must be a C-contiguous{' writable' if writable else ''} {other.dtype} array of "
                        f"shape {other.shape}, got {_describe(a)}")


def _row(row: object, count: int = 0) -> None:
    """``row`` must be a writable C-contiguous float64 array of at least ``NUM_FIELDS`` values, with at least
    ``count`` rows when it is 2-D (``count`` > 0): the compiled code writes its fields unchecked. (The checks
    are ordered and spelled for speed: this runs for every summarised array.)"""
    if type(row) is np.ndarray and (row.dtype is _F64 or row.dtype == _F64):
        flags = row.flags
        if flags.c_contiguous and flags.writeable:
            if count == 0:
                if row.ndim == 1 and len(row) >= NUM_FIELDS:
                    return
            elif row.ndim == 2 and len(row) >= count and row.shape[1] >= NUM_FIELDS:
                return
    shape = f"[{count}, >= {NUM_FIELDS}]" if count else f"[>= {NUM_FIELDS}]"
    raise TypeError(f"the statistics row(s) must be a writable C-contiguous float64 array of shape {shape}, "
                    f"got {_describe(row)}")


def _thresholds(thresholds: object, dtype: np.dtype) -> None:
    if not (type(thresholds) is np.ndarray and thresholds.dtype == dtype and thresholds.ndim == 1
            and thresholds.shape[0] >= 2 and thresholds.flags.c_contiguous):
        raise TypeError(f"saturation thresholds must be a C-contiguous {dtype} array (low, high), got "
                        f"{_describe(thresholds)}")


def _describe(a: object) -> str:
    if isinstance(a, np.ndarray):
        layout = "C-contiguous" if a.flags.c_contiguous else "not C-contiguous"
        return f"a {a.dtype} array of shape {a.shape}, {layout}{'' if a.flags.writeable else ', read-only'}"
    return type(a).__name__


def per_sample(a: np.ndarray, thresholds: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """The moments of every row of a C-contiguous float32 or float64 ``[n, m]`` array (m >= 1), summed in
    float64 (a few samples: exact enough and cheap), with saturation counts when ``thresholds`` (float64, margin
    applied) are given: the per-sample statistics of a snapshot. Returns the ``[n, fields]`` rows (count set,
    unit fields at the merge identity) and the per-row "recompute exactly" flags (NaN, Inf, cancelling sums).

    >>> from comgra_ndbg.stats.fields import FIELD
    >>> rows, exact = per_sample(np.array([[0.5, 0.0], [-2.0, 0.995]], dtype=np.float32), np.array([-0.99, 0.99]))
    >>> exact.tolist(), rows[:, FIELD["sum"]].tolist(), rows[:, FIELD["saturated"]].tolist()
    ([False, False], [0.5, -1.0049999952316284], [0.0, 2.0])
    """
    suffix = _kind(a, 2, "per_sample's array")
    if thresholds is None:
        return _entry("per_sample", suffix)(a)
    _thresholds(thresholds, _F64)
    return _entry("per_sample_bounded", suffix)(a, thresholds)


def summarize(a: np.ndarray, row: np.ndarray, thresholds: np.ndarray | None, batched: bool) -> bool:
    """All host statistics of a C-contiguous ``[batch, units]`` array (``[1, n]`` for a batch-less one) in
    one compiled call: ``moments`` plus, when ``batched``, units, dead units and (from 2 samples on) the
    sample spread, and with ``thresholds`` (an array of a's dtype holding the saturation thresholds, margin
    applied) the saturation counts. Returns True when the moments or the spread need the exact recompute.

    >>> from comgra_ndbg.stats.fields import FIELD
    >>> row = np.zeros(NUM_FIELDS)
    >>> summarize(np.array([[0.0, 0.995], [0.0, -0.2]], dtype=np.float32), row,
    ...           np.array([-0.99, 0.99], dtype=np.float32), True)
    False
    >>> [int(row[FIELD[f]]) for f in ("units", "dead_units", "bounded", "saturated", "saturated_units")]
    [2, 1, 4, 1, 0]
    """
    suffix = _kind(a, 2, "summarize's array")
    _row(row)
    if thresholds is None:
        return bool(_entry("summarize", suffix)(a, bool(batched), row))
    _thresholds(thresholds, a.dtype)
    return bool(_entry("summarize_bounded", suffix)(a, thresholds, bool(batched), row))


def summary_entry(dtype: np.dtype, bounded: bool) -> object:
    """The compiled ``summarize`` entry for arrays of ``dtype`` (float32 or float64), with saturation
    thresholds when ``bounded``, for a caller that has checked its arguments once and calls it many times
    (the recorder's registration plans): ``entry(a, batched, row)`` or ``entry(a, thresholds, batched,
    row)``, returning the "recompute exactly" flag. It checks nothing: ``a`` must be a non-empty C-contiguous
    2-D array of ``dtype``, ``row`` a writable C-contiguous float64 array of at least ``NUM_FIELDS`` values
    and ``thresholds`` a C-contiguous array of ``dtype`` (low, high), as ``summarize`` checks them.

    >>> from comgra_ndbg.stats.fields import FIELD
    >>> row = np.zeros(NUM_FIELDS)
    >>> summarize_f32 = summary_entry(np.dtype(np.float32), False)
    >>> bool(summarize_f32(np.ones((2, 3), np.float32), True, row)), float(row[FIELD["sum"]])
    (False, 6.0)
    """
    suffix = _SUFFIX.get(np.dtype(dtype))
    if suffix is None:
        raise TypeError(f"the summary kernels read float32 or float64 arrays, not {dtype}")
    return _entry("summarize_bounded" if bounded else "summarize", suffix)


def moments(a: np.ndarray, row: np.ndarray, *, start: np.ndarray | None = None,
            copy_to: np.ndarray | None = None) -> bool:
    """Write zeros, Σx, Σx², Σ|x|, min and max of ``a`` (of ``a - start`` when given) into ``row``.

    ``a`` (and ``start``, ``copy_to``) are 1-D contiguous float32 or float64 arrays of one size, at least
    one element. Returns True when the row holds a non-finite or cancelling sum and must be recomputed
    exactly. ``copy_to`` receives a copy of ``a`` in the same pass.

    >>> from comgra_ndbg.stats.fields import FIELD
    >>> row = np.zeros(NUM_FIELDS)
    >>> moments(np.array([3.0, -1.0, 0.0], dtype=np.float32), row)
    False
    >>> [float(row[FIELD[f]]) for f in ("zeros", "sum", "sum_sq", "sum_abs", "min", "max")]
    [1.0, 2.0, 10.0, 4.0, -1.0, 3.0]
    """
    suffix = _kind(a, 1, "moments' array")
    _row(row)
    if start is not None:
        _like(start, a, "start")
        if copy_to is not None:
            _like(copy_to, a, "copy_to", writable=True)
            return bool(_entry("moments_start_copy", suffix)(a, start, copy_to, row))
        return bool(_entry("moments_start", suffix)(a, start, row))
    if copy_to is not None:
        _like(copy_to, a, "copy_to", writable=True)
        return bool(_entry("moments_copy", suffix)(a, copy_to, row))
    return bool(_entry("moments", suffix)(a, row))


def moments_many(dtype: np.dtype, addresses: np.ndarray, sizes: np.ndarray, rows: np.ndarray, *,
                 starts: np.ndarray | None = None, copies: np.ndarray | None = None,
                 batches: np.ndarray | None = None) -> np.ndarray:
    """``moments`` for many contiguous host arrays of one dtype in one call, given by the address of their
    first element and their size (int64 arrays); ``starts`` and ``copies`` are addresses too, 0 for none;
    ``batches`` holds the batch size of arrays whose units are counted (0 for none). Row ``j`` of ``rows``
    receives array ``j``'s fields; returns the boolean "recompute exactly" flags.

    The caller keeps the arrays alive and unchanged during the call.

    >>> from comgra_ndbg.stats.fields import FIELD
    >>> a, b = np.array([1.0, -2.0], dtype=np.float32), np.array([0.5, 0.5, 0.0], dtype=np.float32)
    >>> rows = np.zeros((2, NUM_FIELDS))
    >>> moments_many(a.dtype, np.array([a.ctypes.data, b.ctypes.data]), np.array([2, 3]), rows)
    array([False, False])
    >>> rows[:, FIELD["sum"]].tolist(), rows[:, FIELD["zeros"]].tolist()
    ([-1.0, 1.0], [0.0, 1.0])
    """
    suffix, arrays = addressed(dtype, addresses, sizes, rows, starts, copies, batches)
    exact = np.zeros(len(sizes), dtype=np.bool_)
    misfit(_entry("moments_many", suffix)(_LIKE[suffix], *arrays, rows, exact), arrays)
    return exact


def misfit(bad: int, arrays: tuple[np.ndarray, ...]) -> None:
    """Raise for the array ``bad`` (>= 0) that the compiled pass refused to read (it reads none when one is
    misdescribed); -1 is fine."""
    if bad >= 0:
        address, _, _, size, batch = (int(a[bad]) for a in arrays)
        raise ValueError(f"array {bad} of moments_many cannot be read as described (address {address:#x}, size "
                         f"{size}, batch {batch}): it needs an address, at least one element, and a batch size of 0 "
                         f"(no unit statistics) or one that divides its size")


def addressed(dtype: np.dtype, addresses: np.ndarray, sizes: np.ndarray, rows: np.ndarray,
              starts: np.ndarray | None, copies: np.ndarray | None,
              batches: np.ndarray | None) -> tuple[str, tuple[np.ndarray, ...]]:
    """The checks of ``moments_many``'s arguments (shared with ``parallel``): the entry suffix of ``dtype``
    and the five int64 arrays (addresses, starts, copies, sizes, batches; ``nones`` for a missing one). What
    the addresses point at cannot be checked: that is the caller's promise."""
    suffix = _SUFFIX.get(np.dtype(dtype))
    if suffix is None:
        raise TypeError(f"moments_many sums float32 or float64 arrays, not {dtype}")
    count = len(sizes)
    none = nones(count)
    arrays = (addresses, none if starts is None else starts, none if copies is None else copies, sizes,
              none if batches is None else batches)
    shape = (count,)
    for array in arrays:  # (each array's values, sizes > 0 and batches that divide them, the compiled pass checks)
        if not (type(array) is np.ndarray and (array.dtype is _I64 or array.dtype == _I64) and array.shape == shape
                and array.flags.c_contiguous):
            name = ("addresses", "starts", "copies", "sizes", "batches")[[a is array for a in arrays].index(True)]
            raise TypeError(f"moments_many's {name} must be a C-contiguous int64 array of {count} values (one per "
                            f"array), got {_describe(array)}")
    _row(rows, count)
    return suffix, arrays


_LIKE = {"_f32": np.empty(0, np.float32), "_f64": np.empty(0, np.float64)}
"""An empty array of each kernel dtype: what the compiled ``moments_many`` reads the addressed elements as."""


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

    >>> from comgra_ndbg.stats.fields import FIELD
    >>> a, row = np.array([[0.0, 0.995], [0.0, -0.2]], dtype=np.float32), np.zeros(NUM_FIELDS)
    >>> moments(a.reshape(-1), row), units(a, row, (-0.99, 0.99))
    (False, False)
    >>> [int(row[FIELD[f]]) for f in ("units", "dead_units", "bounded", "saturated", "saturated_units")]
    [2, 1, 4, 1, 0]
    >>> round(float(row[FIELD["spread_dev_sq"]]), 4), int(row[FIELD["spread_count"]])  # 2 × ((0.995 + 0.2) / 2)²
    (0.714, 4)
    """
    suffix = _kind(a, 2, "units' array")
    _row(row)
    if bounds is None:
        return bool(_entry("units", suffix)(a, True, row))
    thresholds = np.array(bounds, dtype=a.dtype)
    _thresholds(thresholds, a.dtype)
    return bool(_entry("units_bounded", suffix)(a, thresholds, True, row))


def warm_up() -> None:
    """Load the kernels now rather than on the first recorded step, and run every entry the recorder uses
    for float32 and float64 once: the first time on a machine (or after an upgrade) this builds the module
    ahead of time (about 30 s, ``backend``), later it takes milliseconds; on numba's JIT it compiles every
    variant (about 7 s the first time, 0.3 s from numba's cache). Timing code calls it so that the one-time
    cost stays out of its measurements, and so can a container's build step.

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

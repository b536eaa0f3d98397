"""Per-unit statistics of a ``[batch, units]`` host array in one compiled pass: dead units, saturated units
and the sample spread.

A *unit* is a non-batch position; these statistics compare each unit's values across the samples of the
batch. The pass walks the array row by row and keeps a few numbers per unit (vectorised across units):

- dead units: the bitwise OR of the bit patterns of ``|x|`` down the batch is 0 (±0 is zero, NaN is alive);
- saturated units: with thresholds, no sample of the unit lies strictly inside them;
- the sample spread Σ_u Σ_i (x[i,u] - m_u)², m_u the unit's mean over the batch. It is summed around each
  unit's first sample c_u = x[0,u]: with d = x - c_u the pass keeps Σ_i d per unit and Σ d² over all
  elements, and the spread is Σ d² - Σ_u (Σ_i d)² / batch. Nearly identical samples, the case the statistic
  exists for, give small d computed without rounding (Sterbenz), and identical ones d = 0 exactly, so the
  sums do not cancel where a plain Σx² - (Σx)²/batch would lose every digit.

Sums run in the array's dtype over at most ``ROWS`` rows per unit and ``ROWS`` elements per row (units are
taken ``ROWS`` at a time), then in float64. NaN, ±Inf and float32 overflow are not looked for element by
element: they make the totals non-finite, and ``deviation`` asks the caller to recompute the row exactly,
as it does when the first sample lies so far from the others that the shifted sums still cancel.

numba's JIT disk cache keys each compiled function on its own source file only: the kernels of ``moments``
and ``team`` that call into this module keep their cached code when only this file changes, so clear that
cache (``*.nbi``, ``*.nbc`` in ``__pycache__`` or ``NUMBA_CACHE_DIR``) after editing it. The module built
ahead of time is keyed on every file of this package and is rebuilt by itself (``stats.backend``).
"""
from __future__ import annotations

import numba
import numpy as np

from comgra_ndbg.stats.compiled.bits import unsigned_bits
from comgra_ndbg.stats.kernels import ROWS, SPREAD_TOLERANCE

__all__ = ["unit_counts", "deviation"]


@numba.njit(fastmath=True, nogil=True, cache=True)
def _columns(a, bounds, spread, low, high, out):  # pragma: no cover - compiled
    """``unit_counts`` for at most ``ROWS`` units: each row's slice is read once, in one loop that numba
    vectorises (plain slices and no inner bounds: a 2-D index or a nested block loop here made the pass
    several times slower)."""
    batch = a.shape[0]
    width = high - low
    one = np.ones(1, a.dtype)[0]
    zero = one - one
    alive = np.full(width, unsigned_bits(zero))
    unsaturated = np.zeros(width if bounds is not None else 0, dtype=a.dtype)
    shifted = np.zeros(width if spread else 0, dtype=a.dtype)  # Σ_i d of the current block of rows
    wide = np.zeros(width if spread else 0)  # Σ_i d of the blocks before, in float64
    first = a[0, low:high]
    saturated = 0.0
    total_sq = 0.0
    for r in range(batch):
        row = a[r, low:high]
        hits = zero
        q = zero
        for k in range(width):
            x = row[k]
            alive[k] |= unsigned_bits(abs(x))
            if bounds is not None:
                hit = (one if x <= bounds[0] else zero) + (one if x >= bounds[1] else zero)
                hits += hit
                unsaturated[k] += one - hit
            if spread:
                d = x - first[k]
                shifted[k] += d
                q += d * d
        saturated += hits
        total_sq += q
        if spread and (r + 1) % ROWS == 0:
            for k in range(width):
                wide[k] += shifted[k]
                shifted[k] = zero
    dead = 0
    all_saturated = 0
    between = 0.0
    for k in range(width):
        dead += alive[k] == 0
        if bounds is not None:
            all_saturated += unsaturated[k] == 0
        if spread:
            s = wide[k] + shifted[k]
            between += s * s
    out[0] += dead
    out[1] += saturated
    out[2] += all_saturated
    out[3] += total_sq
    out[4] += between / batch


@numba.njit(nogil=True, cache=True)
def unit_counts(a, bounds, spread, low, high, out):  # pragma: no cover - compiled
    """The per-unit statistics of the units ``[low, high)`` of a ``[batch, units]`` array, into ``out``
    (5 floats): the dead units; with ``bounds = (low, high)`` (the saturation thresholds, margin applied)
    the saturated elements and the saturated units; with ``spread``, Σd² and Σ_u (Σ_i d)² / batch for
    d = x - x[0, u] (0 and 0 otherwise; ``deviation`` turns them into the spread). Units are taken
    ``ROWS`` at a time, so that no float32 sum runs over more than ``ROWS`` terms."""
    out[:] = 0.0
    for begin in range(low, high, ROWS):
        _columns(a, bounds, spread, begin, min(begin + ROWS, high), out)


@numba.njit(nogil=True, cache=True)
def deviation(out):  # pragma: no cover - compiled, without fastmath: it tests for NaN
    """The spread Σd² - Σ_u (Σ_i d)² / batch from ``unit_counts``' ``out``, and whether the row needs the
    exact recompute: a non-finite sum (NaN, ±Inf, float32 overflow) or a spread that cancels."""
    total, between = out[3], out[4]
    if not (np.isfinite(total) and np.isfinite(between)):
        return 0.0, True
    spread = total - between
    return max(spread, 0.0), total > 0.0 and spread < SPREAD_TOLERANCE * total

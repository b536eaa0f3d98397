"""The drift checks of ``stats.drift`` as numba source: one pass over the parameters' value rows
(``observe``) and one over their gradient rows (``gradients``); what they find is told there."""
from __future__ import annotations

import numba
import numpy as np

from comgra_ndbg.stats.drift import (_FACTS, _HIGH, _INF, _LOW, _NAN, _SCALE, _SQ, _SUM_SQ, BEYOND, JUMPED, NONFINITE,
                                    STILL, STOPPED)


@numba.njit(nogil=True, cache=True)
def observe(rows, facts, moving, limits, fraction, compare, stopped, check):  # pragma: no cover - compiled
    n = rows.shape[0]
    found = 0
    for i in range(n):
        if rows[i, _NAN] > 0 or rows[i, _INF] > 0:
            found = NONFINITE
    any_stopped = False
    any_beyond = False
    for i in range(n):
        changed = False
        d_low = 0.0
        d_high = 0.0
        for k in range(_FACTS.shape[0]):
            value = rows[i, _FACTS[k]]
            old = facts[i, k]
            if value != old:
                a, b = abs(rows[i, _FACTS[_SCALE[k]]]), abs(facts[i, _SCALE[k]])
                scale = a if a > b or a != a else b  # (a NaN stays, as numpy's maximum keeps it)
                if not (abs(value - old) <= STILL * scale and scale < np.inf):  # NaN and ±Inf: changed
                    changed = True
            if k == _LOW:
                d_low = abs(value - facts[i, k])
            elif k == _HIGH:
                d_high = abs(value - facts[i, k])
        if compare and found == 0:
            if stopped and moving[i] and not changed:
                any_stopped = True
            if check:
                norm, norm_old = np.sqrt(rows[i, _FACTS[_SQ]]), np.sqrt(facts[i, _SQ])
                scale = max(abs(rows[i, _FACTS[_LOW]]), abs(rows[i, _FACTS[_HIGH]]), abs(facts[i, _LOW]),
                            abs(facts[i, _HIGH]))
                if (abs(norm - norm_old) > limits[i, 0] + fraction * max(norm, norm_old)
                        or max(d_low, d_high) > limits[i, 1] + fraction * scale):
                    any_beyond = True
        if compare:
            moving[i] = changed
        for k in range(_FACTS.shape[0]):
            facts[i, k] = rows[i, _FACTS[k]]
    if found:
        return found
    if any_stopped:
        return STOPPED
    if any_beyond:
        return BEYOND
    return 0


@numba.njit(nogil=True, cache=True)
def gradients(rows, norms, compare, factor):  # pragma: no cover - compiled
    nonfinite = False
    jumped = False
    total = 0.0
    for i in range(rows.shape[0]):
        square = rows[i, _SUM_SQ]
        if rows[i, _NAN] != 0 or rows[i, _INF] != 0:
            nonfinite = True
        total += square
        if compare:
            before = norms[i]
            if square > factor * before or before > factor * square:
                jumped = True
        norms[i] = square
    if nonfinite or not np.isfinite(total):
        return NONFINITE
    return JUMPED if jumped else 0

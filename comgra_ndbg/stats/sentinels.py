"""Sentinel rows: summary rows that hold only the few statistics saying whether a tensor moved.

Recordings made with an earlier ``detail="tiered"`` hold them for parameter values and updates between
complete rows: the element count, Σx² (so the norm and the rms), the minimum and the maximum (so the largest
magnitude) and exact non-finite counts. The fields they did not compute — Σx, Σ|x|, the zero count — are
NaN, so the statistics derived from them (mean, std, mean absolute value, zero fraction) read as absent at
that step rather than as a wrong number. Readers (the GUI's timelines and statistic tables) tell them
apart with :func:`is_sentinel`; today's tiers (``recorder/tiers.py``) write complete rows or none.
"""
from __future__ import annotations

import numpy as np

from comgra_ndbg.stats.fields import FIELD

__all__ = ["SENTINEL_FIELDS", "ABSENT_FIELDS", "is_sentinel"]

SENTINEL_FIELDS = ("count", "nan", "inf", "sum_sq", "min", "max")
"""The fields a sentinel row holds."""
ABSENT_FIELDS = ("sum", "sum_abs", "zeros")
"""The fields a sentinel row leaves NaN: the statistics derived from them are absent at its step."""

_COUNT = FIELD["count"]


def is_sentinel(rows: np.ndarray) -> np.ndarray:
    """Which rows ``[..., NUM_FIELDS]`` are sentinel rows (elements counted, Σx absent).

    >>> from comgra_ndbg.stats.fields import identity_rows
    >>> row = identity_rows(1)[0]; row[FIELD["count"]], row[FIELD["sum"]] = 4, np.nan
    >>> is_sentinel(row).tolist()
    True
    """
    rows = np.asarray(rows, dtype=np.float64)
    return (rows[..., _COUNT] > 0) & np.isnan(rows[..., FIELD["sum"]])

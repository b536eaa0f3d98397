"""Synthetic summary rows with chosen statistics, for tests, examples and docs.

>>> import numpy as np
>>> from comgra_ndbg.stats.statistics import derive
>>> steps, r = summary_rows(rms=np.array([1.0, 0.5]), dead=np.array([0.0, 0.75]))
>>> stats = derive(r)
>>> stats["rms"].tolist(), stats["dead_fraction"].tolist()
([1.0, 0.5], [0.0, 0.75])
"""
from __future__ import annotations

import numpy as np

from comgra_ndbg.store.schema import FIELD, identity_row

__all__ = ["summary_rows"]


def summary_rows(*, rms: np.ndarray, count: int = 64, units: int = 8, dead: np.ndarray | None = None,
                 saturated: np.ndarray | None = None, nonfinite: np.ndarray | None = None,
                 abs_max: np.ndarray | None = None, start: int = 0, mean: np.ndarray | None = None,
                 abs_mean: np.ndarray | None = None, low: np.ndarray | float | None = None,
                 high: np.ndarray | float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, rows)`` of a batched tensor with ``count`` elements over ``units`` units whose finite elements
    are ±``rms`` (so rms and abs-mean equal ``rms``); ``dead``/``saturated`` are shares of units/elements,
    ``nonfinite`` counts of NaN elements, ``abs_max`` overrides the extremes. Steps start at ``start``.
    ``mean``, ``abs_mean``, ``low`` and ``high`` override the mean, the mean absolute value, the minimum and
    the maximum (one-sided signals: a ReLU's output has ``mean == abs_mean`` and ``low == 0``)."""
    rms = np.asarray(rms, dtype=np.float64)
    n = len(rms)
    rows = np.tile(identity_row(), (n, 1))
    bad = np.zeros(n) if nonfinite is None else np.asarray(nonfinite, dtype=np.float64)
    finite = count - bad
    rows[:, FIELD["count"]] = count
    rows[:, FIELD["nan"]] = bad
    rows[:, FIELD["sum"]] = 0.0
    rows[:, FIELD["sum_sq"]] = np.square(rms) * finite
    rows[:, FIELD["sum_abs"]] = rms * finite
    extreme = rms if abs_max is None else np.asarray(abs_max, dtype=np.float64)
    rows[:, FIELD["min"]], rows[:, FIELD["max"]] = -extreme, extreme
    if mean is not None:
        rows[:, FIELD["sum"]] = np.asarray(mean, dtype=np.float64) * finite
    if abs_mean is not None:
        rows[:, FIELD["sum_abs"]] = np.asarray(abs_mean, dtype=np.float64) * finite
    if low is not None:
        rows[:, FIELD["min"]] = low
    if high is not None:
        rows[:, FIELD["max"]] = high
    rows[:, FIELD["zeros"]] = np.where(rms == 0, finite, 0)
    rows[:, FIELD["units"]] = units
    if dead is not None:
        rows[:, FIELD["dead_units"]] = np.round(np.asarray(dead) * units)
    if saturated is not None:
        rows[:, FIELD["bounded"]] = count
        rows[:, FIELD["saturated"]] = np.round(np.asarray(saturated) * count)
    return np.arange(start, start + n), rows

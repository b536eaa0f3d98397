"""Statistics derived from stored sufficient statistics — pure numpy, shared by reader, analysis and GUI.

The recorder stores, per tensor and step, a row of mergeable sums (see ``stats.fields.STAT_FIELDS``).
Everything a user reads (mean, std, abs-mean, fractions …) is derived here, so no formula exists twice and
merging iterations or steps is a plain sum / min / max, never a mean of means.

>>> import numpy as np
>>> from comgra_ndbg.stats.fields import FIELD, identity_row
>>> row = identity_row()
>>> row[[FIELD["count"], FIELD["sum"], FIELD["sum_sq"], FIELD["sum_abs"]]] = 4, 2.0, 6.0, 4.0
>>> row[[FIELD["min"], FIELD["max"]]] = -1.0, 2.0
>>> round(float(derive(row[None])["std"][0]), 4), float(derive(row[None])["abs_max"][0])
(1.118, 2.0)
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from comgra_ndbg.stats.fields import FIELD, MAX_FIELDS, MIN_FIELDS, NUM_FIELDS

__all__ = ["STATISTICS", "derive", "derive_one", "merge_rows", "merge_groups"]


def _finite_count(r: np.ndarray) -> np.ndarray:
    return r[..., FIELD["count"]] - r[..., FIELD["nan"]] - r[..., FIELD["inf"]]


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def _mean(r: np.ndarray) -> np.ndarray:
    return _ratio(r[..., FIELD["sum"]], _finite_count(r))


def _var(r: np.ndarray) -> np.ndarray:
    n = _finite_count(r)
    mean = _mean(r)
    return np.maximum(_ratio(r[..., FIELD["sum_sq"]], n) - mean * mean, 0.0)


def _extreme(r: np.ndarray, field: str) -> np.ndarray:
    return np.where(_finite_count(r) > 0, r[..., FIELD[field]], np.nan)


def _abs_max(r: np.ndarray) -> np.ndarray:
    return np.fmax(np.abs(_extreme(r, "min")), np.abs(_extreme(r, "max")))


def _unit_ratio(field: str) -> Callable[[np.ndarray], np.ndarray]:
    return lambda r: _ratio(r[..., FIELD[field]], r[..., FIELD["units"]])


def _sample_spread(r: np.ndarray) -> np.ndarray:
    """The share of the second moment that varies across the samples of the batch: 0 when every sample is the
    same, 1 when every unit has mean 0 over the batch (clipped to 1 against rounding)."""
    return np.minimum(_ratio(r[..., FIELD["spread_dev_sq"]], r[..., FIELD["spread_sum_sq"]]), 1.0)


def _sample_spread_rms(r: np.ndarray) -> np.ndarray:
    """The rms deviation of an element from its unit's mean over the batch (the pooled across-sample std)."""
    return np.sqrt(_ratio(r[..., FIELD["spread_dev_sq"]], r[..., FIELD["spread_count"]]))


# Name -> function of a [..., NUM_FIELDS] array. Population statistics over the finite elements; NaN where
# the tensor had no finite element (or, for fractions, where the denominator is 0). The sample spread is NaN
# where it is unknown: no batch, one sample, every unit holding a NaN or ±Inf, rows from format version 1.
STATISTICS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "count": lambda r: r[..., FIELD["count"]],
    "nonfinite": lambda r: r[..., FIELD["nan"]] + r[..., FIELD["inf"]],
    "nan": lambda r: r[..., FIELD["nan"]],
    "inf": lambda r: r[..., FIELD["inf"]],
    "nonfinite_fraction": lambda r: _ratio(r[..., FIELD["nan"]] + r[..., FIELD["inf"]], r[..., FIELD["count"]]),
    "zero_fraction": lambda r: _ratio(r[..., FIELD["zeros"]], r[..., FIELD["count"]]),
    "mean": _mean,
    "std": lambda r: np.sqrt(_var(r)),
    "abs_mean": lambda r: _ratio(r[..., FIELD["sum_abs"]], _finite_count(r)),
    "abs_max": _abs_max,
    "min": lambda r: _extreme(r, "min"),
    "max": lambda r: _extreme(r, "max"),
    "l2": lambda r: np.where(_finite_count(r) > 0, np.sqrt(np.maximum(r[..., FIELD["sum_sq"]], 0.0)), np.nan),
    "rms": lambda r: np.sqrt(np.maximum(_ratio(r[..., FIELD["sum_sq"]], _finite_count(r)), 0.0)),
    "dead_fraction": _unit_ratio("dead_units"),
    "saturated_fraction": lambda r: _ratio(r[..., FIELD["saturated"]], r[..., FIELD["bounded"]]),
    "saturated_unit_fraction": _unit_ratio("saturated_units"),
    "sample_spread": _sample_spread,
    "sample_spread_rms": _sample_spread_rms,
}


def derive(rows: np.ndarray) -> dict[str, np.ndarray]:
    """Every statistic of ``STATISTICS`` for an array of sufficient-statistic rows ``[..., NUM_FIELDS]``."""
    rows = _check(rows)
    return {name: fn(rows) for name, fn in STATISTICS.items()}


def derive_one(rows: np.ndarray, stat: str) -> np.ndarray:
    """One named statistic for rows ``[..., NUM_FIELDS]``; raises ``KeyError`` listing the valid names."""
    try:
        fn = STATISTICS[stat]
    except KeyError:
        raise KeyError(f"unknown statistic {stat!r}; choose one of {sorted(STATISTICS)}") from None
    return fn(_check(rows))


def merge_rows(rows: np.ndarray, axis: int = 0) -> np.ndarray:
    """Merge sufficient-statistic rows along ``axis``: sums add, min takes the min, max the max.

    >>> from comgra_ndbg.stats.fields import FIELD, identity_row
    >>> a, b = identity_row(), identity_row()
    >>> a[FIELD["count"]], a[FIELD["max"]], b[FIELD["count"]], b[FIELD["max"]] = 2, 5.0, 3, 1.0
    >>> m = merge_rows(np.stack([a, b]))
    >>> float(m[FIELD["count"]]), float(m[FIELD["max"]])
    (5.0, 5.0)
    """
    rows = _check(rows)
    axis = axis % rows.ndim
    if axis == rows.ndim - 1:
        raise ValueError("cannot merge along the field axis")
    out = rows.sum(axis=axis)
    out[..., list(MIN_FIELDS)] = np.take(rows, list(MIN_FIELDS), axis=-1).min(axis=axis)
    out[..., list(MAX_FIELDS)] = np.take(rows, list(MAX_FIELDS), axis=-1).max(axis=axis)
    return out


def merge_groups(keys: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge consecutive-or-not rows sharing a key (e.g. the iterations of one step).

    ``keys`` is ``[n]``, ``rows`` is ``[n, NUM_FIELDS]``; returns the sorted unique keys and the merged rows.
    """
    rows = _check(rows)
    unique, inverse = np.unique(keys, return_inverse=True)
    if len(unique) == len(keys):
        order = np.argsort(keys, kind="stable")
        return keys[order], rows[order]
    out = np.zeros((len(unique), NUM_FIELDS), dtype=np.float64)
    np.add.at(out, inverse, rows)
    for f in MIN_FIELDS:
        out[:, f] = np.inf
        np.minimum.at(out[:, f], inverse, rows[:, f])
    for f in MAX_FIELDS:
        out[:, f] = -np.inf
        np.maximum.at(out[:, f], inverse, rows[:, f])
    return unique, out


def _check(rows: np.ndarray) -> np.ndarray:
    rows = np.asarray(rows, dtype=np.float64)
    if rows.shape[-1] != NUM_FIELDS:
        raise ValueError(f"expected rows with {NUM_FIELDS} fields in the last axis, got shape {rows.shape}")
    return rows

"""The sufficient-statistic row: which field sits at which column, and the row that merges as nothing.

Every kernel and reduction of this package writes rows of this layout, and ``store/schema.py`` stores them
as they are (it re-exports these names, so the file format and the arithmetic share one definition).
Defining the layout here keeps ``stats`` a bottom layer: it needs nothing from the store above it.

>>> NUM_FIELDS, FIELD["sum"], float(identity_row()[FIELD["min"]])
(17, 4, inf)
"""
from __future__ import annotations

import numpy as np

__all__ = ["STAT_FIELDS", "FIELD", "NUM_FIELDS", "MIN_FIELDS", "MAX_FIELDS", "identity_row", "identity_rows"]

# Sufficient statistics. Every field merges across iterations, steps or devices by SUM, except MIN (min)
# and MAX (max). Moments cover the finite elements only; NaN and ±Inf are counted, never summed.
STAT_FIELDS = (
    "count",  # elements, finite or not
    "nan",  # NaN elements
    "inf",  # +Inf or -Inf elements
    "zeros",  # elements exactly 0
    "sum",  # Σx over finite elements
    "sum_sq",  # Σx² over finite elements
    "sum_abs",  # Σ|x| over finite elements
    "min",  # smallest finite element (+inf if none)
    "max",  # largest finite element (-inf if none)
    "units",  # units observed: non-batch positions of a batched tensor (0 for batch-less tensors)
    "dead_units",  # units that are exactly 0 for every sample of the batch
    "bounded",  # elements whose saturation bound is known (0 when no bound is known)
    "saturated",  # elements within the saturation margin of a bound
    "saturated_units",  # units saturated for every sample of the batch
    # Sample spread (format version 3): over the elements of the units with no NaN or ±Inf in any sample, of a
    # batched tensor with at least 2 samples (all three are 0 otherwise, which derives NaN).
    "spread_count",  # those elements
    "spread_sum_sq",  # Σx² over those elements
    "spread_dev_sq",  # Σ_u Σ_i (x[i,u] - mean_i x[i,u])² over those elements: deviation from the unit's batch mean
)
FIELD = {name: i for i, name in enumerate(STAT_FIELDS)}
NUM_FIELDS = len(STAT_FIELDS)
MIN_FIELDS = (FIELD["min"],)
MAX_FIELDS = (FIELD["max"],)


def identity_row() -> np.ndarray:
    """The merge identity: what an absent tensor contributes (no elements, +inf min, -inf max)."""
    return _IDENTITY.copy()


_IDENTITY = np.zeros(NUM_FIELDS, dtype=np.float64)
_IDENTITY[FIELD["min"]] = np.inf
_IDENTITY[FIELD["max"]] = -np.inf


def identity_rows(count: int) -> np.ndarray:
    """``count`` rows of the merge identity, ``[count, NUM_FIELDS]``."""
    return np.repeat(_IDENTITY[None], count, axis=0)

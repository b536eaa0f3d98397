"""Drift of parameter summaries between consecutive steps: did a parameter stop, or move further than its
updates allow?

The statistic tiers (``recorder/tiers.py``) measure parameter updates at some steps only and watch the
value rows of every step in between. Per parameter, from its value row now and at the step before:

- *moving*: any of Σx, Σx², Σ|x|, min, max differs by more than :data:`STILL` of its magnitude (of Σ|x|
  for Σx, whose own magnitude cancels), a few float32 ulps: a parameter whose summary is the same within
  them did not change; one that was moving and now is not has stopped. A parameter whose updates are at the
  resolution of its values moves an extreme or a sum by an ulp at some steps and by none at others;
  counted as moving, it would seem to stop and start again with the rounding;
- *beyond*: its norm moved further than ``allowed[:, 0]`` plus ``fraction`` of the larger norm, or its
  minimum or maximum further than ``allowed[:, 1]`` plus ``fraction`` of its largest magnitude (the norm
  moves at most by the update's norm, the extremes at most by its largest element).

Per parameter gradient, from its row now and its squared norm at the step before (:func:`gradients_moved`):
*non-finite* (a NaN or ±Inf element, a squared norm that is not finite, or squared norms whose sum
overflows) or *jumped* (its norm changed by more than a factor either way, to or from exactly 0 included).

One compiled pass over the rows (a few microseconds for hundreds of parameters, where numpy's dozen
small-array calls cost about twenty, and several times that right after a kernel has streamed the
parameters through the caches); numpy does the same where numba is unavailable.

>>> from comgra_ndbg.stats.fields import NUM_FIELDS
>>> rows = np.zeros((1, NUM_FIELDS)); rows[0, FIELD["sum_sq"]] = 4.0; rows[0, FIELD["max"]] = 2.0
>>> state = DriftState(1)
>>> state.observe(rows, compare=False, allowed=None, fraction=0.01)
0
>>> rows[0, FIELD["sum_sq"]] = 400.0; rows[0, FIELD["max"]] = 20.0
>>> state.observe(rows, compare=True, allowed=np.full((1, 2), 0.1), fraction=0.01) == BEYOND
True
"""
from __future__ import annotations

import numpy as np

from comgra_ndbg.stats.backend import entries
from comgra_ndbg.stats.kernels import AVAILABLE
from comgra_ndbg.stats.fields import FIELD, NUM_FIELDS

__all__ = ["DriftState", "NONFINITE", "STOPPED", "BEYOND", "JUMPED", "STILL", "gradients_moved"]

NONFINITE, STOPPED, BEYOND, JUMPED = 1, 2, 3, 4
"""What :meth:`DriftState.observe` (the first three) and :func:`gradients_moved` (``NONFINITE``, ``JUMPED``)
found (0: nothing), in the order they look."""

_NAN, _INF = FIELD["nan"], FIELD["inf"]
_FACTS = np.array([FIELD[f] for f in ("sum", "sum_sq", "sum_abs", "min", "max")], dtype=np.int64)
_SQ, _LOW, _HIGH = 1, 3, 4  # positions of Σx², min and max among the facts
_SCALE = np.array([2, 1, 2, 3, 4], dtype=np.int64)  # per fact, the fact whose magnitude its resolution follows
_SUM_SQ = FIELD["sum_sq"]

STILL = 2.0 ** -21
"""How far, relative to its magnitude, a fact may change and still count as unchanged: 4 ulps of a float32
near the bottom of its binade, 2 near the top."""


class DriftState:
    """The facts and the moving flags of ``n`` parameters at the last observed step."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.facts = np.zeros((n, len(_FACTS)))
        self.moving = np.zeros(n, dtype=np.bool_)
        self.moving_known = False
        self._no_limits = np.zeros((n, 2))

    def observe(self, rows: np.ndarray, *, compare: bool, allowed: np.ndarray | None, fraction: float) -> int:
        """Take the value rows ``[n, NUM_FIELDS]`` of a step; with ``compare`` (the previous observation was
        the step before) tell what moved since: :data:`NONFINITE`, :data:`STOPPED`, :data:`BEYOND` or 0.
        ``allowed`` (``[n, 2]``, or None for no *beyond* check) is how far norms and extremes may move."""
        check = allowed is not None
        limits = np.ascontiguousarray(allowed, dtype=np.float64) if check else self._no_limits
        rows = _rows(rows, self.n)
        if limits.shape != (self.n, 2):
            raise ValueError(f"allowed must hold two limits per parameter, shape ({self.n}, 2), got {limits.shape}")
        if AVAILABLE:
            found = entries().observe(rows, self.facts, self.moving, limits, float(fraction), bool(compare),
                                      bool(compare and self.moving_known), check)
        else:
            found = _observe_numpy(rows, self.facts, self.moving, limits, fraction, compare,
                                   compare and self.moving_known, check)
        self.moving_known = compare
        return int(found)


def gradients_moved(rows: np.ndarray, norms: np.ndarray, compare: bool, factor: float) -> int:
    """Whether parameter gradients moved, from their rows ``[n, NUM_FIELDS]``: :data:`NONFINITE` (a NaN or
    ±Inf element, or a sum of squared norms that is not finite: a non-finite norm or an overflow), else, with
    ``compare``, :data:`JUMPED` when a squared norm is more than ``factor`` times, or less than 1/``factor``
    of, its value in ``norms`` (the step before's); else 0. ``norms`` (``[n]``) receives the squared norms now.

    >>> from comgra_ndbg.stats.fields import NUM_FIELDS
    >>> rows, norms = np.zeros((2, NUM_FIELDS)), np.zeros(2)
    >>> rows[:, FIELD["sum_sq"]] = [1.0, 4.0]
    >>> gradients_moved(rows, norms, False, 100.0), norms.tolist()
    (0, [1.0, 4.0])
    >>> rows[1, FIELD["sum_sq"]] = 0.01
    >>> gradients_moved(rows, norms, True, 100.0) == JUMPED
    True
    """
    if not (isinstance(norms, np.ndarray) and norms.shape == (len(rows),) and norms.dtype == np.float64
            and norms.flags.c_contiguous and norms.flags.writeable):
        raise ValueError(f"gradients_moved needs norms as a writable contiguous float64 array of {len(rows)} "
                         f"values (one per row), got {getattr(norms, 'shape', type(norms).__name__)}")
    if AVAILABLE:  # (the compiled pass writes norms[i] unchecked: hence the check above)
        return int(entries().gradients(_rows(rows, len(norms)), norms, bool(compare), float(factor)))
    squares = rows[:, _SUM_SQ].copy()
    before = norms.copy()
    norms[:] = squares
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is what this looks for
        if rows[:, _NAN].any() or rows[:, _INF].any() or not np.isfinite(squares.sum()):
            return NONFINITE
        if compare and ((squares > factor * before).any() or (before > factor * squares).any()):
            return JUMPED
    return 0


def _rows(rows: np.ndarray, n: int) -> np.ndarray:
    """``rows`` as the C-contiguous float64 ``[n, >= NUM_FIELDS]`` array the compiled passes read unchecked."""
    rows = np.ascontiguousarray(rows, dtype=np.float64)
    if rows.ndim != 2 or rows.shape[0] != n or rows.shape[1] < NUM_FIELDS:
        raise ValueError(f"drift checks need statistics rows of shape ({n}, {NUM_FIELDS}), got {rows.shape}")
    return rows


def _observe_numpy(rows, facts, moving, limits, fraction, compare, stopped, check):  # noqa: ANN001
    now = rows[:, _FACTS]
    old = facts.copy()
    facts[:] = now
    nonfinite = bool((rows[:, [_NAN, _INF]] > 0).any())
    if not compare:
        return NONFINITE if nonfinite else 0
    delta = np.abs(now - old)
    scale = np.maximum(np.abs(now[:, _SCALE]), np.abs(old[:, _SCALE]))  # (a NaN stays: counts as changed)
    was = moving.copy()
    with np.errstate(invalid="ignore"):
        still = (delta <= STILL * scale) & (scale < np.inf)
    moving[:] = ((now != old) & ~still).any(axis=1)
    if nonfinite:
        return NONFINITE
    if stopped and (was > moving).any():
        return STOPPED
    if not check:
        return 0
    norm, norm_old = np.sqrt(now[:, _SQ]), np.sqrt(old[:, _SQ])
    scale = np.abs(np.stack([now[:, _LOW], now[:, _HIGH], old[:, _LOW], old[:, _HIGH]])).max(axis=0)
    with np.errstate(invalid="ignore"):
        beyond = ((np.abs(norm - norm_old) > limits[:, 0] + fraction * np.fmax(norm, norm_old))
                  | (np.fmax(delta[:, _LOW], delta[:, _HIGH]) > limits[:, 1] + fraction * scale))
    return BEYOND if beyond.any() else 0

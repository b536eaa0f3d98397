"""The shared detector: level shifts of a series against its own recent history, with hysteresis.

A series (usually ``log10`` of a statistic, so shifts are in decades) *enters* a shifted state at index i
when it is at least ``enter`` away from the median of its previous ``window`` finite values and stays at
least ``exit`` away (same side, same frozen baseline) for ``persist`` consecutive finite values; it *leaves*
when ``persist`` consecutive finite values are back within ``exit``. A brief excursion is therefore not a
shift, and a slow drift (whose median follows it) never is. Values inside a finished shift are left out of
later baselines, so a recovery is not mistaken for a shift the other way.

>>> import numpy as np
>>> x = np.r_[np.zeros(30), np.full(20, -3.0)]
>>> [(s.start, s.end, s.direction, s.censored) for s in level_shifts(x, window=20, min_history=10, enter=1,
...                                                                   exit=0.5, persist=3)]
[(30, 49, -1, True)]
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

__all__ = ["Shift", "log_level", "rolling_median", "level_shifts", "measured_shifts", "sparse_positions", "runs",
           "strength"]

FLOOR = 1e-30  # exact zeros become this before the log, so a collapse to 0 is a (large) finite shift


@dataclass(frozen=True)
class Shift:
    """Indices ``start``..``end`` (inclusive) of a shifted state; ``direction`` +1 up, -1 down; ``baseline``
    the frozen pre-shift median; ``peak`` the largest deviation (positive); ``censored`` when the series
    ended while still shifted; ``jump`` how far the series moved (in the shift's direction) from the finite
    value before ``start`` to the one at ``start`` — a step change jumps the whole way at once, a drift
    creeps across the threshold."""

    start: int
    end: int
    direction: int
    baseline: float
    peak: float
    censored: bool
    jump: float = float("nan")


def log_level(values: np.ndarray) -> np.ndarray:
    """``log10`` of non-negative values; 0 maps to ``log10(FLOOR)``, NaN/negative/inf stay NaN."""
    v = np.asarray(values, dtype=np.float64)
    out = np.full(v.shape, np.nan)
    ok = np.isfinite(v) & (v >= 0)
    out[ok] = np.log10(np.maximum(v[ok], FLOOR))
    return out


def rolling_median(x: np.ndarray, window: int, min_history: int) -> np.ndarray:
    """Median of the previous ``window`` finite values at each index (NaN with fewer than ``min_history``).

    >>> rolling_median(np.arange(5.0), window=2, min_history=1).tolist()
    [nan, 0.0, 0.5, 1.5, 2.5]
    """
    x = np.asarray(x, dtype=np.float64)
    n = len(x)
    out = np.full(n, np.nan)
    if n < 2:
        return out
    padded = np.r_[np.full(window, np.nan), np.where(np.isfinite(x), x, np.nan)]
    views = np.lib.stride_tricks.sliding_window_view(padded[:-1], window)  # views[i] = x[i-window:i]
    ordered = np.sort(views, axis=1)  # NaN sorts last, so the finite values lead each row
    counts = np.isfinite(views).sum(axis=1)
    ok = counts >= max(min_history, 1)
    rows = np.flatnonzero(ok)
    low, high = ordered[rows, (counts[rows] - 1) // 2], ordered[rows, counts[rows] // 2]
    out[rows] = (low + high) / 2
    return out


def level_shifts(x: np.ndarray, *, window: int, min_history: int, enter: float, exit: float, persist: int,
                 directions: tuple[int, ...] = (-1, 1)) -> list[Shift]:
    """Shifted states of ``x`` (see the module docstring); NaN values are skipped, never counted."""
    x = np.asarray(x, dtype=np.float64)
    history = x.copy()  # what baselines see: the values of a finished shift are masked out of it
    base = rolling_median(history, window, min_history)
    finite = np.flatnonzero(np.isfinite(x))
    position = np.full(len(x), -1)
    position[finite] = np.arange(len(finite))
    shifts: list[Shift] = []
    i = 0
    while i < len(x):
        dev = x[i] - base[i]
        if not (np.isfinite(dev) and abs(dev) >= enter):
            i += 1
            continue
        direction = 1 if dev > 0 else -1
        if direction not in directions:
            i += 1
            continue
        b = base[i]
        following = finite[position[i]:]
        inside = direction * (x[following] - b) >= exit
        if not inside[:persist].all():
            i += 1
            continue
        last, below, censored = 0, 0, True
        for j in range(1, len(following)):
            if inside[j]:
                last, below = j, 0
            else:
                below += 1
                if below >= persist:
                    censored = False
                    break
        end = int(following[last])
        peak = float(np.max(direction * (x[following[:last + 1]] - b)))
        earlier = finite[:position[i]]
        jump = float(direction * (x[i] - x[earlier[-1]])) if len(earlier) else float("nan")
        shifts.append(Shift(int(i), end, direction, float(b), peak, censored, jump))
        history[i:end + 1] = np.nan
        base = rolling_median(history, window, min_history)
        i = end + 1
    return shifts


def sparse_positions(x: np.ndarray) -> np.ndarray | None:
    """The finite positions of ``x`` when it holds a value at fewer than half of its positions from its first
    finite one on — a statistic measured at some steps only (``detail="tiered"`` measures parameter updates
    every k-th step and where something changed) — else None."""
    finite = np.flatnonzero(np.isfinite(x))
    if len(finite) == 0 or 2 * len(finite) >= len(x) - finite[0]:
        return None
    return finite


def measured_shifts(x: np.ndarray, *, window: int, min_history: int, enter: float, exit: float, persist: int,
                    directions: tuple[int, ...] = (-1, 1)) -> list[Shift]:
    """:func:`level_shifts` of a series that may be measured at some steps only: a sparse one
    (:func:`sparse_positions`) is read as its measured values in a row, with ``min_history`` scaled by the
    share of steps measured (at least ``persist``), and its shifts are returned at their positions in ``x``.

    >>> x = np.full(150, np.nan); x[::10] = 0.0; x[75:78] = 2.0
    >>> [(s.start, s.end) for s in measured_shifts(x, window=20, min_history=10, enter=1, exit=0.5, persist=3)]
    [(75, 77)]
    """
    positions = sparse_positions(x)
    if positions is None:
        return level_shifts(x, window=window, min_history=min_history, enter=enter, exit=exit, persist=persist,
                            directions=directions)
    share = len(positions) / (len(x) - positions[0])
    shifts = level_shifts(np.asarray(x, dtype=np.float64)[positions], window=window,
                          min_history=max(persist, int(np.ceil(min_history * share))), enter=enter, exit=exit,
                          persist=persist, directions=directions)
    return [replace(s, start=int(positions[s.start]), end=int(positions[s.end])) for s in shifts]


def runs(mask: np.ndarray, min_length: int) -> list[tuple[int, int]]:
    """``(start, end)`` inclusive index ranges where ``mask`` is True for at least ``min_length`` in a row.

    >>> runs(np.array([0, 1, 1, 0, 1, 1, 1], bool), 3)
    [(4, 6)]
    """
    mask = np.asarray(mask, dtype=bool)
    edges = np.diff(np.r_[0, mask.astype(np.int8), 0])
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1) - 1
    return [(int(s), int(e)) for s, e in zip(starts, ends) if e - s + 1 >= min_length]


def strength(magnitude: float, threshold: float) -> float:
    """How far past its threshold a rule fired, in [0, 1]: 0.5 at the threshold, 1 at three times it.

    >>> strength(1.0, 1.0), strength(3.0, 1.0), strength(0.0, 1.0)
    (0.5, 1.0, 0.25)
    """
    if not np.isfinite(magnitude) or threshold <= 0:
        return 1.0
    return float(np.clip(0.25 + 0.25 * magnitude / threshold, 0.0, 1.0))

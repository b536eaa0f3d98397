"""Statistic tiers: how much of each tracked parameter's value and update a recorded step summarises.

``detail="full"`` summarises every parameter's value, gradient and update completely at every recorded
step. ``detail="tiered"`` (``Tiers()``) keeps the gradients complete and takes
*sentinel* rows of values and updates (``stats/sentinels.py``: count, non-finite counts, Σx², min, max, in
one pass over the parameter and its start-of-step copy) except on

- every ``full_every``-th step (``step % full_every == 0``), and
- every step at which a sentinel *moved*, and the ``hold`` steps after it. Then every parameter's value and
  update is summarised completely at once, so the step where something changed holds all of it.

A sentinel moves when a value or an update holds NaN or ±Inf, when a parameter's norm or extremes changed
since the previous step by more than ``edit_fraction`` of its scale beyond what the previous update explains
(an edit under ``torch.no_grad()``: the bound of ``analysis/parameter_edits.py``), when the norm of all
updates together left ``[1/update_factor, update_factor]`` times its running reference (a learning-rate
change), or when a parameter that moved stopped moving (a frozen layer). Single small tensors' updates are
not compared on their own: a bias of a few elements changes its update norm tenfold between healthy steps. The state is a few floats per parameter; deciding costs microseconds.

>>> tiers = as_tiers("tiered")
>>> tiers.full_every, as_tiers("full") is None
(10, True)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from comgra_ndbg.errors import InvalidArgumentError
from comgra_ndbg.stats.fields import FIELD

__all__ = ["DETAILS", "Tiers", "TierState", "as_tiers"]

DETAILS = ("full", "tiered")
"""The named presets of ``detail=``."""

_NAN, _INF, _SUM_SQ, _MIN, _MAX = FIELD["nan"], FIELD["inf"], FIELD["sum_sq"], FIELD["min"], FIELD["max"]


@dataclass(frozen=True)
class Tiers:
    """Sentinel rows for parameter values and updates between complete ones (see the module docstring)."""

    full_every: int = 10
    edit_fraction: float = 0.01
    update_factor: float = 4.0
    hold: int = 2
    memory: float = 0.3  # weight of the newest update norm in the running reference (of its logarithm)

    def __post_init__(self) -> None:
        if not isinstance(self.full_every, int) or isinstance(self.full_every, bool) or self.full_every < 1:
            raise InvalidArgumentError(f"Tiers(full_every=...) must be an int >= 1, got {self.full_every!r}")
        if not isinstance(self.hold, int) or isinstance(self.hold, bool) or self.hold < 0:
            raise InvalidArgumentError(f"Tiers(hold=...) must be an int >= 0, got {self.hold!r}")
        if not (0 < self.edit_fraction < 1) or not (self.update_factor > 1) or not (0 < self.memory <= 1):
            raise InvalidArgumentError(f"Tiers needs 0 < edit_fraction < 1, update_factor > 1 and 0 < memory <= 1, "
                                       f"got {self.edit_fraction!r}, {self.update_factor!r}, {self.memory!r}")

    def describe(self) -> str:
        return (f"parameter values and updates: complete every {self.full_every} steps and when a sentinel moves "
                f"(edit > {self.edit_fraction:g}, update x{self.update_factor:g}, non-finite), sentinels between")


def as_tiers(detail: object) -> Tiers | None:
    """``detail=`` as a :class:`Tiers`, or None for ``"full"`` (everything complete at every recorded step)."""
    if isinstance(detail, Tiers):
        return detail
    if detail == "full":
        return None
    if detail == "tiered":
        return Tiers()
    raise InvalidArgumentError(f"detail must be one of {DETAILS} or a Tiers(...), got {detail!r}")


class TierState:
    """What the sentinels of the previous steps were, and the decision for the next step."""

    def __init__(self, tiers: Tiers) -> None:
        self.tiers = tiers
        self._last_step: int | None = None
        self._values: np.ndarray | None = None  # [n, 3]: norm, min, max of each value at the last step
        self._updates: np.ndarray | None = None  # [n, 2]: norm, largest magnitude of each update at the last step
        self._moving: np.ndarray | None = None  # [n]: whether each parameter's last update was not zero
        self._reference = np.nan  # running mean of log10 of the norm of all updates together
        self._hold_until = -1

    def complete(self, step: int) -> bool:
        """Whether ``step`` summarises every parameter completely whatever its sentinels say."""
        return step % self.tiers.full_every == 0 or step <= self._hold_until

    def moved(self, step: int, values: np.ndarray, updates: np.ndarray, kept: np.ndarray) -> str:
        """Why the sentinel rows of ``step`` (``values`` of every parameter, ``updates`` of those ``kept``)
        call for complete statistics, or ``""``."""
        if (values[:, [_NAN, _INF]] > 0).any() or (updates[:, [_NAN, _INF]] > 0).any():
            return "sentinel: non-finite parameter or update"
        norm, low, high = _value_facts(values)
        if self._last_step == step - 1 and self._values is not None and len(self._values) == len(norm):
            before, update = self._values, self._updates
            with np.errstate(divide="ignore", invalid="ignore"):
                by_norm = np.maximum(np.abs(norm - before[:, 0]) - update[:, 0], 0.0) / np.fmax(norm, before[:, 0])
                scale = np.fmax(np.fmax(np.abs(low), np.abs(high)), np.fmax(np.abs(before[:, 1]), np.abs(before[:, 2])))
                shift = np.fmax(np.abs(high - before[:, 2]), np.abs(low - before[:, 1]))
                by_extreme = np.maximum(shift - update[:, 1], 0.0) / scale
            if (np.nan_to_num(np.fmax(by_norm, by_extreme), nan=0.0) > self.tiers.edit_fraction).any():
                return "sentinel: a parameter changed beyond its update"
        if self._moving is not None and len(self._moving) == len(kept):
            if (self._moving[kept] & (updates[:, _SUM_SQ] == 0)).any():
                return "sentinel: a parameter stopped changing"
            total = _log_norm(updates[:, _SUM_SQ].sum())
            if np.isfinite(self._reference) and abs(total - self._reference) > np.log10(self.tiers.update_factor):
                return "sentinel: the updates' size jumped"
        return ""

    def observe(self, step: int, values: np.ndarray, updates: np.ndarray, kept: np.ndarray, *,
                moved: bool) -> None:
        """Remember the rows of ``step`` (sentinel or complete) for the next decision."""
        norm, low, high = _value_facts(values)
        size = np.zeros((len(kept), 2))
        size[kept] = np.stack([np.sqrt(updates[:, _SUM_SQ]), np.fmax(np.abs(updates[:, _MIN]),
                                                                     np.abs(updates[:, _MAX]))], axis=1)
        self._values, self._updates = np.stack([norm, low, high], axis=1), size
        self._last_step = step
        moving = np.zeros(len(kept), dtype=bool)
        moving[kept] = updates[:, _SUM_SQ] > 0
        self._moving = moving
        total = _log_norm(updates[:, _SUM_SQ].sum())
        if moved or not np.isfinite(self._reference):
            self._reference = total  # a move starts the reference anew: the new regime is the normal one
        elif np.isfinite(total):
            self._reference += self.tiers.memory * (total - self._reference)
        if moved:
            self._hold_until = step + self.tiers.hold


def _value_facts(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.sqrt(values[:, _SUM_SQ]), values[:, _MIN], values[:, _MAX]


def _log_norm(sum_sq: float) -> float:
    """log10 of a norm from its Σx²; -inf for zero, NaN for NaN."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(0.5 * np.log10(sum_sq))

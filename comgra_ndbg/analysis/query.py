"""Ask your own questions of a recorded run without rerunning it.

A :class:`Query` wraps the run's aligned series (and, optionally, its diagnosis):

>>> import numpy as np
>>> from comgra_ndbg.analysis.series import build_series
>>> from comgra_ndbg.store.schema import FIELD, identity_row
>>> rows = np.tile(identity_row(), (60, 1)); rows[:, FIELD["count"]] = 1
>>> rows[:, FIELD["sum_abs"]] = np.r_[np.ones(40), np.linspace(1, 8, 20)]
>>> loss = np.ones(60); loss[55] = 40.0
>>> q = Query(build_series({("h", "value"): (np.arange(60), rows)}, roles={"h": "intermediate"},
...                        kpis={"loss": (np.arange(60), loss)}))
>>> q.loss_spikes()
[55]
>>> q.grew_before("h", "value", "abs_mean", event_step=55)  # did |h| grow before the loss spiked?
True
>>> q.first_step("h", "value", "abs_mean", above=4.0)
49
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from comgra_ndbg.analysis.events import Diagnosis, Event
from comgra_ndbg.analysis.series import RunSeries
from comgra_ndbg.analysis.shift import log_level, rolling_median
from comgra_ndbg.errors import InvalidArgumentError

__all__ = ["Query"]


class Query:
    """Questions about one run's recorded series: values, changes, first crossings, order of events."""

    def __init__(self, series: RunSeries, diagnosis: Diagnosis | None = None) -> None:
        self.run = series
        self.diagnosis = diagnosis

    # ---- series ----------------------------------------------------------------------------------------
    def nodes(self, role: str | None = None) -> list[str]:
        """Node names in forward order, optionally only those of one role."""
        return [n.name for n in self.run.nodes if role is None or n.role == role]

    def series(self, node: str, kind: str = "value", stat: str = "rms") -> tuple[np.ndarray, np.ndarray]:
        """``(steps, values)`` of one statistic of one node; ``node="loss"`` with ``kind="kpi"`` (or any KPI
        name with ``kind="kpi"``) gives a KPI."""
        if kind == "kpi":
            return self.run.steps, self.run.kpi(node)
        return self.run.steps, self.run.get(node, kind, stat)

    def at(self, node: str, kind: str, stat: str, step: int) -> float:
        """The statistic at one step."""
        return float(self.series(node, kind, stat)[1][self.run.index(step)])

    def median(self, node: str, kind: str, stat: str, start: int, stop: int) -> float:
        """Median over steps ``start <= step < stop`` (NaN values ignored; NaN if none)."""
        steps, values = self.series(node, kind, stat)
        chosen = values[(steps >= start) & (steps < stop)]
        return float(np.nanmedian(chosen)) if np.isfinite(chosen).any() else float("nan")

    # ---- questions ---------------------------------------------------------------------------------------
    def change(self, node: str, kind: str, stat: str, *, at: int, window: int = 20) -> float:
        """Decades between the median of the ``window`` steps from ``at`` on and of the ``window`` before."""
        before = self.median(node, kind, stat, at - window, at)
        after = self.median(node, kind, stat, at, at + window)
        return float(log_level(np.array([after]))[0] - log_level(np.array([before]))[0])

    def grew_before(self, node: str, kind: str, stat: str, *, event_step: int, window: int = 20,
                    factor: float = 2.0) -> bool:
        """Whether the statistic's median over the ``window`` steps before ``event_step`` was at least
        ``factor`` × its median over the ``window`` steps before those."""
        recent = self.median(node, kind, stat, event_step - window, event_step)
        earlier = self.median(node, kind, stat, event_step - 2 * window, event_step - window)
        return bool(np.isfinite(recent) and np.isfinite(earlier) and recent >= factor * earlier)

    def first_step(self, node: str, kind: str, stat: str, *, above: float | None = None,
                   below: float | None = None, after: int | None = None) -> int | None:
        """The first step (from ``after`` on) where the statistic is above ``above`` or below ``below``."""
        if (above is None) == (below is None):
            raise InvalidArgumentError("first_step needs exactly one of above=... or below=...")
        steps, values = self.series(node, kind, stat)
        test: Callable[[np.ndarray], np.ndarray] = (lambda v: v > above) if above is not None else (lambda v: v < below)
        with np.errstate(invalid="ignore"):
            hits = np.flatnonzero(test(values) & (steps >= (after if after is not None else steps.min(initial=0))))
        return int(steps[hits[0]]) if len(hits) else None

    def loss_spikes(self, factor: float = 10.0, window: int = 20) -> list[int]:
        """Steps where the loss exceeded ``factor`` × the median of its previous ``window`` steps (or was
        non-finite after finite values)."""
        loss = self.run.loss
        base = rolling_median(np.where(np.isfinite(loss), loss, np.nan), window, min(5, window))
        with np.errstate(invalid="ignore"):
            hits = (loss > factor * base) | (np.isfinite(base) & np.isinf(loss))
        return [int(s) for s in self.run.steps[hits]]

    def precedes(self, first: tuple[str, str, str], second: tuple[str, str, str], *, factor: float = 10.0,
                 window: int = 20) -> bool | None:
        """Whether series ``first`` (node, kind, stat) moved by ``factor`` against its recent median before
        series ``second`` did; None when either never moved that much."""
        a, b = self._first_move(*first, factor=factor, window=window), self._first_move(*second, factor=factor,
                                                                                          window=window)
        return None if a is None or b is None else a < b

    def _first_move(self, node: str, kind: str, stat: str, *, factor: float, window: int) -> int | None:
        steps, values = self.series(node, kind, stat)
        x = log_level(np.abs(values))
        moved = np.abs(x - rolling_median(x, window, min(5, window))) >= np.log10(factor)
        hits = np.flatnonzero(moved)
        return int(steps[hits[0]]) if len(hits) else None

    # ---- the diagnosis -----------------------------------------------------------------------------------
    def events(self, *, node: str | None = None, family: str | None = None, state: str | None = None) -> list[Event]:
        """Events of the diagnosis, filtered by node, family and target state."""
        if self.diagnosis is None:
            return []
        return [e for e in self.diagnosis.events if (node is None or e.node == node)
                and (family is None or e.family == family) and (state is None or e.to_state == state)]

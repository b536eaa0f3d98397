"""Parameter edits: a parameter's value changed between two steps by more than the optimizer's update.

A parameter's value at step ``t + 1`` is its value at ``t`` plus the update of ``t`` (ΔW, recorded), unless
something else wrote it in between — an in-place edit under ``torch.no_grad()``, a checkpoint loaded into
the model, a re-initialisation, a buggy weight constraint. The recorded summaries bound what the update can
explain exactly, whatever the optimizer:

- sums add: ``Σ W(t+1) − Σ W(t) = Σ ΔW(t)``;
- norms move at most by the update's norm: ``| ‖W(t+1)‖ − ‖W(t)‖ | ≤ ‖ΔW(t)‖`` (triangle inequality);
- extremes move at most by the update's largest element: ``|max W(t+1) − max W(t)| ≤ max |ΔW(t)|``.

The share of the change none of these explains, relative to the weight's own scale, is the *unexplained
change*; above ``edit_fraction`` at one step, and not recurring (a weight constraint applied every step is
part of the training: see :data:`RECURRING`), it is an ``edited`` event of the parameter node. An edit is not a failure by itself:
it becomes the origin of a hypothesis only through the harm that follows it.

>>> import numpy as np
>>> from comgra_ndbg.analysis.series import build_series
>>> from comgra_ndbg.analysis.synthetic import summary_rows
>>> w = np.full(40, 1.0); w[25:] = 20.0  # the weight was set to 20x at step 25
>>> s = build_series({("p", "value"): summary_rows(rms=w), ("p", "update"): summary_rows(rms=np.full(40, 1e-3))},
...                  roles={"p": "parameter"}, kpis={})
>>> [(e.node, e.onset, round(e.magnitude, 2)) for e in edit_events(s)]
[('p', 25, 1.3)]
"""
from __future__ import annotations

import numpy as np

from comgra_ndbg.analysis.config import Thresholds
from comgra_ndbg.analysis.events import Event, Evidence
from comgra_ndbg.analysis.series import NodeSeries, RunSeries
from comgra_ndbg.analysis.shift import strength

__all__ = ["edit_events", "unexplained_change", "FAMILY", "RECURRING"]

FAMILY = "parameter_edit"
RECURRING = 1e-6
"""An unexplained change whose median over the steps around an edit reaches this share is part of the
training (weight clipping, a norm constraint applied every step): pure optimizer updates explain every
change to float rounding, about 1e-8 of the weight's scale."""


def _recurring(neighbours: np.ndarray) -> bool:
    return bool(np.isfinite(neighbours).any() and np.nanmedian(neighbours) >= RECURRING)


def unexplained_change(series: RunSeries, node: NodeSeries) -> np.ndarray:
    """Per step index ``i``: the share of the change from step ``i - 1`` to ``i`` that the update of step
    ``i - 1`` cannot explain, relative to the weight's scale (NaN where the steps are not consecutive or a
    series is missing; where that update was not measured, against the updates measured around it:
    :data:`UNMEASURED_FACTOR`)."""
    value, update = node.stats["value"], node.stats["update"]
    out = np.full(len(series.steps), np.nan)
    if len(series.steps) < 2:
        return out
    consecutive = np.diff(series.steps) == 1
    n0, n1, u = value["l2"][:-1], value["l2"][1:], update["l2"][:-1]
    count = value["count"] - value["nonfinite"]
    total = value["mean"] * count
    total_update = update["mean"] * (update["count"] - update["nonfinite"])
    scale_sum = (value["abs_mean"] * count)[:-1] + (value["abs_mean"] * count)[1:]
    a = update["abs_max"][:-1]
    extreme = np.fmax(value["abs_max"][:-1], value["abs_max"][1:])
    with np.errstate(divide="ignore", invalid="ignore"):
        by_norm = np.maximum(np.abs(n1 - n0) - u, 0.0) / np.fmax(n0, n1)
        by_sum = np.abs(total[1:] - total[:-1] - total_update[:-1]) / scale_sum
        by_extreme = np.maximum(np.maximum(np.abs(value["max"][1:] - value["max"][:-1]),
                                           np.abs(value["min"][1:] - value["min"][:-1])) - a, 0.0) / extreme
        change = np.fmax(np.fmax(by_norm, by_sum), by_extreme)
        change = np.where(np.isfinite(u), change, _loose_change(value, update, n0, n1, extreme))
    change[~consecutive] = np.nan
    out[1:] = change
    return out


UNMEASURED_FACTOR = 4.0
"""Where the update of a step was not measured (``detail="tiered"`` measures updates every k-th step and
where something changed), the largest update measured in the steps around it, this many times over, stands
in for it: a looser bound, so only edits well beyond any update are seen there."""
AROUND = 10
"""How many steps either side of an unmeasured update the stand-in looks at."""


def _loose_change(value: dict, update: dict, n0: np.ndarray, n1: np.ndarray, extreme: np.ndarray) -> np.ndarray:
    """``unexplained_change`` from norms and extremes alone, against the largest update measured within
    :data:`AROUND` steps (times :data:`UNMEASURED_FACTOR`); NaN where none was."""
    u, a = update["l2"][:-1], update["abs_max"][:-1]
    if not np.isfinite(u).any():
        return np.full(len(u), np.nan)
    u_near, a_near = _largest_near(u), _largest_near(a)
    with np.errstate(divide="ignore", invalid="ignore"):
        by_norm = np.maximum(np.abs(n1 - n0) - UNMEASURED_FACTOR * u_near, 0.0) / np.fmax(n0, n1)
        by_extreme = np.maximum(np.maximum(np.abs(value["max"][1:] - value["max"][:-1]),
                                           np.abs(value["min"][1:] - value["min"][:-1]))
                                - UNMEASURED_FACTOR * a_near, 0.0) / extreme
        return np.fmax(by_norm, by_extreme)


def _largest_near(x: np.ndarray) -> np.ndarray:
    """The largest finite value of ``x`` within :data:`AROUND` positions of each position (NaN if none)."""
    padded = np.r_[np.full(AROUND, np.nan), x, np.full(AROUND, np.nan)]
    windows = np.lib.stride_tricks.sliding_window_view(padded, 2 * AROUND + 1)
    with np.errstate(invalid="ignore"):
        finite = np.isfinite(windows).any(axis=1)
        out = np.full(len(x), np.nan)
        out[finite] = np.nanmax(windows[finite], axis=1)
    return out


def edit_events(series: RunSeries, thresholds: Thresholds = Thresholds(), *, stop: int | None = None) -> list[Event]:
    """One ``edited`` event per step at which a parameter node changed by more than its update explains."""
    t = thresholds
    steps = series.steps
    events: list[Event] = []
    for node in series.parameters:
        if not (node.has("value") and node.has("update")):
            continue
        change = unexplained_change(series, node)[:stop]
        norm = node.stats["value"]["l2"]
        for i in np.flatnonzero(np.nan_to_num(change, nan=0.0) >= t.edit_fraction):
            if _recurring(change[max(0, i - t.window):i]) or _recurring(change[i + 1:i + 1 + t.window]):
                continue  # a change at every step is a constraint of the training, not an event
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = float(norm[i] / norm[i - 1])
            decades = abs(float(np.log10(ratio))) if np.isfinite(ratio) and ratio > 0 else float("inf")
            evidence = Evidence(f"{node.name}/value/l2", (int(steps[i - 1]), int(steps[i])),
                                (float(norm[i - 1]), float(norm[i])), float(change[i]))
            events.append(Event(FAMILY, node.name, "value", "trained", "edited", int(steps[i]), int(steps[i]),
                                decades, strength(float(change[i]), t.edit_fraction), (evidence,)))
    return events

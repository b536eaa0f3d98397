"""Update stagnation: a parameter stops changing while the rest of the model trains.

Read from the parameter values themselves, whatever froze them: a learning rate of 0 in its param group
(the gradient is there, the update is 0), ``requires_grad_(False)`` (no gradient at all), a layer left out
of the optimizer. A node is *frozen* at a step when its update is exactly 0 — or, for a parameter that no longer needs a
gradient and so has no update recorded, when its value's summary is exactly the previous step's — while at
least ``optimizer_share`` of the other parameter nodes moved; ``frozen_steps`` such steps in a row make an
event.

Freezing from the first step is usually intended (a frozen backbone, an embedding kept fixed): such an
event is ``at_start`` and carries whether the node had a gradient, because a parameter that receives
gradients and never moves is not frozen on purpose — it is missing from the optimizer.

A node that the loop invariants saw getting gradients in no optimizer's param groups and that never moved
is theirs to report (a failure, or a note when it reads as chosen): no event of its own here, and it does not
count among the trainable nodes. When most trainable parameter nodes (those that moved or received
gradients at some point) stop together, the cause is the loop or the optimizer, not a layer: one ``frozen``
event of the node ``optimizer`` (e.g. ``optimizer.step()`` no longer called, every rate 0).

>>> from collections.abc import Mapping

import numpy as np
>>> from comgra_ndbg.analysis.series import build_series
>>> from comgra_ndbg.analysis.synthetic import summary_rows
>>> moving = summary_rows(rms=np.full(60, 1e-3)); stopped = np.full(60, 1e-3); stopped[30:] = 0.0
>>> rows = {("a", "update"): moving, ("b", "update"): moving, ("c", "update"): summary_rows(rms=stopped)}
>>> s = build_series(rows, roles={"a": "parameter", "b": "parameter", "c": "parameter"}, kpis={})
>>> [(e.node, e.onset, e.at_start) for e in stagnation_events(s)]
[('c', 30, False)]
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from comgra_ndbg.analysis.config import Thresholds
from comgra_ndbg.analysis.events import Event, Evidence
from comgra_ndbg.analysis.optimizer_stability import FAMILY, OPTIMIZER
from comgra_ndbg.analysis.series import NodeSeries, RunSeries
from comgra_ndbg.analysis.shift import runs, strength

__all__ = ["stagnation_events", "had_gradient", "stopped_share", "change_bound"]


def _change(series: RunSeries, node: NodeSeries) -> np.ndarray:
    """How much the node changed at each step: its update's largest element where an update was recorded,
    else (a parameter that needs no gradient gets no update row; ``detail="tiered"`` measures updates at
    some steps only) from its value's summary against the step before: 0 where it is exactly the same, a
    lower bound of the largest element of the change where it is not (:func:`change_bound`), NaN where the
    step before was not recorded."""
    n = len(series.steps)
    change = node.stats["update"]["abs_max"].copy() if node.has("update") else np.full(n, np.nan)
    if not node.has("value") or n < 2:
        return change
    value = node.stats["value"]
    before, after = np.arange(n - 1), np.arange(1, n)
    same = same_summary(value, before, after)
    bound = np.where(same, 0.0, change_bound(value, before, after))
    bound[np.diff(series.steps) != 1] = np.nan
    unknown = np.flatnonzero(~np.isfinite(change[1:])) + 1
    change[unknown] = bound[unknown - 1]
    return change


def change_bound(value: Mapping[str, np.ndarray], before: np.ndarray, after: np.ndarray) -> np.ndarray:
    """A lower bound of ``max |W_after - W_before|`` from two value summaries: the minimum, the maximum and
    the mean each move by at most that much, and the norm by at most ``sqrt(count)`` times it. Positive
    wherever one of them differs; NaN where they cannot be read."""
    with np.errstate(invalid="ignore", divide="ignore"):
        shifts = [np.abs(value[stat][after] - value[stat][before]) for stat in ("min", "max", "mean")]
        shifts.append(np.abs(value["l2"][after] - value["l2"][before]) / np.sqrt(value["count"][after]))
        return np.fmax.reduce(shifts)


SENTINEL_RTOL = 1e-6
"""How far the norm of a sentinel row (``stats/sentinels.py``, torch's float32 norm) and of a complete row
(the compiled kernels' float64 sums) of the same unchanged tensor may differ."""


def same_summary(value: Mapping[str, np.ndarray], before: np.ndarray, after: np.ndarray) -> np.ndarray:
    """Whether a node's value summary at step indices ``after`` is the one at ``before``: count, min and max
    exactly; the mean where both steps have one (a sentinel row has none); the norm exactly, or within
    :data:`SENTINEL_RTOL` where one row is a sentinel and the other complete (other arithmetic, same values)."""
    same = np.ones(len(before), dtype=bool)
    for stat in ("min", "max", "count"):
        same &= value[stat][after] == value[stat][before]
    mean_a, mean_b = value["mean"][before], value["mean"][after]
    same &= (mean_a == mean_b) | np.isnan(mean_a) | np.isnan(mean_b)
    norm_a, norm_b = value["l2"][before], value["l2"][after]
    mixed = np.isnan(mean_a) != np.isnan(mean_b)
    with np.errstate(invalid="ignore"):
        close = np.abs(norm_b - norm_a) <= SENTINEL_RTOL * np.fmax(np.abs(norm_a), np.abs(norm_b))
    return same & ((norm_a == norm_b) | (mixed & close))


def _left_behind(grad: Mapping[str, np.ndarray], start: int, stop: int) -> bool:
    """Whether a gradient's summary is finite, non-zero and exactly the same at every one of at least
    ``STALE_STEPS`` recorded steps in ``[start, stop]``."""
    columns = [grad[k][start:stop + 1] for k in ("abs_max", "l2", "mean") if k in grad]
    if not columns or len(columns[0]) < STALE_STEPS:
        return False
    present = np.isfinite(columns[0])
    if present.sum() < STALE_STEPS or not (columns[0][present] > 0).all():
        return False
    return all(np.all(c[present] == c[present][0]) for c in columns)


STALE_STEPS = 10
"""Recorded steps with one and the same gradient summary that make a ``.grad`` left behind, not a gradient."""


def had_gradient(node: NodeSeries, start: int, stop: int) -> bool:
    """Whether the node received a gradient at some step index in ``[start, stop]``: a non-zero one, or one
    exactly 0 at most of those steps (its backward path cut — a hook, a detach — which is no choice to freeze
    it: a frozen parameter gets no gradient at all). A gradient whose summary is the same at every recorded
    step is none: the ``.grad`` an earlier phase left behind (trained, then frozen with ``requires_grad_(False)``
    and never cleared), which no backward pass of the run writes."""
    if not node.has("grad"):
        return False
    grad = node.stats["grad"]["abs_max"][start:stop + 1]
    if _left_behind(node.stats["grad"], start, stop):
        return False
    if np.nan_to_num(grad, nan=0.0).max(initial=0.0) > 0:
        return True
    count = node.stats["grad"]["count"][start:stop + 1] if "count" in node.stats["grad"] else None
    return count is not None and len(count) > 0 and bool((np.nan_to_num(count, nan=0.0) > 0).mean() > 0.5)


def stagnation_events(series: RunSeries, thresholds: Thresholds = Thresholds(), *,
                      stop: int | None = None) -> list[Event]:
    """Frozen parameter nodes while the others train, and the whole model frozen at once (``optimizer``)."""
    t = thresholds
    nodes = [n for n in series.parameters if n.has("update") or n.has("value")]
    if not nodes:
        return []
    update = np.stack([_change(series, n)[:stop] for n in nodes])
    recorded = np.isfinite(update)
    still = recorded & (update == 0)
    moved = recorded & (update > 0)
    last = update.shape[1] - 1
    outside = series.loop.outside_optimizer() if series.loop is not None else frozenset()
    untrained = np.array([n.name in outside and not moved[k].any() for k, n in enumerate(nodes)])
    trainable = np.array([moved[k].any() or had_gradient(n, 0, last) for k, n in enumerate(nodes)]) & ~untrained
    events: list[Event] = []
    for k, node in enumerate(nodes):
        if untrained[k]:  # in no optimizer from the start: the loop invariant's failure or note says so
            continue
        others = np.delete(moved, k, axis=0)[np.delete(trainable, k)]
        share = others.mean(axis=0) if len(others) else np.zeros(still.shape[1])
        events += _node_events(series, node, still[k] & (share >= t.optimizer_share), update[k], t)
    if trainable.sum() >= 2:
        held = still & ~np.stack([_without_gradient(n, update.shape[1]) for n in nodes])
        shares = held[trainable].mean(axis=0)
        events += _whole_model_events(series, shares, moved, t)
    return events


def _without_gradient(node: NodeSeries, n: int) -> np.ndarray:
    """Steps at which a node that records gradients got none (``requires_grad`` off: frozen on purpose, as a
    backbone before it is unfrozen); all False for a node whose gradients are not recorded at all."""
    if not node.has("grad") or "count" not in node.stats["grad"]:
        return np.zeros(n, bool)
    count, largest = node.stats["grad"]["count"][:n], node.stats["grad"]["abs_max"][:n]
    return ~(np.isfinite(count) & (count > 0) & np.isfinite(largest))


def _whole_model_events(series: RunSeries, shares: np.ndarray, moved: np.ndarray, t: Thresholds) -> list[Event]:
    """The trainable parameter nodes stopping together (a share above ``1 - optimizer_share`` of them at
    once, when no node's own event can be told apart from the rest)."""
    out = []
    for i, j in runs(shares > 1 - t.optimizer_share, t.frozen_steps):
        moved_before = bool(moved[:, :i].any())
        evidence = Evidence("optimizer/update/share_exactly_0", tuple(int(v) for v in series.steps[i:i + 3]),
                            tuple(float(v) for v in shares[i:i + 3]))
        out.append(Event(FAMILY, OPTIMIZER, "update", "stable", "frozen", int(series.steps[i]),
                         int(series.steps[j]), float(j - i + 1), strength(j - i + 1, t.frozen_steps), (evidence,),
                         at_start=not moved_before and i < t.start_steps))
    return out


def _node_events(series: RunSeries, node: NodeSeries, frozen: np.ndarray, update: np.ndarray,
                 t: Thresholds) -> list[Event]:
    out = []
    steps = series.steps
    for i, j in runs(frozen, t.frozen_steps):
        moved_before = bool(np.nan_to_num(update[:i], nan=0.0).max(initial=0.0) > 0)
        at_start = not moved_before and i < t.start_steps
        window = slice(i, min(i + 3, len(update)))
        baseline = float(np.nanmedian(update[max(0, i - t.window):i])) if moved_before else float("nan")
        evidence = Evidence(f"{node.name}/update/abs_max", tuple(int(v) for v in steps[window]),
                            tuple(float(v) for v in update[window]), baseline)
        gradient = had_gradient(node, i, j)
        out.append(Event(FAMILY, node.name, "update", "stable" if moved_before else "initial",
                         "frozen" if moved_before or gradient else "fixed", int(steps[i]), int(steps[j]),
                         float(j - i + 1), strength(j - i + 1, t.frozen_steps), (evidence,), at_start=at_start))
    return out


def stopped_share(event: Event) -> float:
    """The share of the trainable parameter nodes that had stopped when a whole-model ``frozen`` event began
    (1.0: every one; the rule also fires when most, not all, stop together)."""
    return min(event.evidence[0].values, default=1.0) if event.evidence else 1.0

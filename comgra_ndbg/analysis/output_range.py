"""Output range: the prediction cannot reach its targets, because a node on its path squashes one side.

A model whose last activation does not match its targets trains without any scale shift, dead layer or
non-finite value: a ReLU on a regression output with negative targets, a sigmoid for targets outside
[0, 1], a LeakyReLU before a sigmoid (its negative side 100× compressed, so the sigmoid's output stays
near 0.5 for targets of 0), probabilities passed to a cross-entropy that expects logits. The loss keeps
pushing the prediction beyond a limit it cannot pass, and stays high.

The rule looks at the *prediction* — the node the loss compares with the targets: a node of role
``output``, else the first node going back from the loss whose gradient is not the same for every element
(a per-sample loss averaged into the loss has a constant gradient: it is part of the loss) — over the last
``1/tail`` of the run, and asks which side it cannot reach:

- *target*: a recorded target with as many elements as the prediction (at some step) lies beyond the
  prediction's extreme by ``gap`` of the target's range or more on one side (median over the window);
- *gradient*: without such a target, the gradient at the prediction keeps one sign on average —
  |mean| ≥ ``push`` × rms at ``persist_share`` of the steps — which a free output bias would have
  removed (the bias' gradient is the mean); half that push suffices, of one sign at as many steps, when
  the prediction is a bounded activation pinned at the bound it is pushed towards (targets beyond both
  bounds partly cancel in the mean);
- *probabilities*: the prediction is a probability vector (values in [0, 1], mean exactly 1/C) and the
  loss sits at or above log(1 + (C − 1)/e), the lowest a cross-entropy can reach on inputs in [0, 1].

A prediction that different forward passes of the same step pull to opposite ends — one pass's gradient
pushing it up by ``push`` × rms or more, another's down as hard, at ``persist_share`` of the steps — is in
a game, not short of a range: a GAN's discriminator on real samples (target 1) and on generated ones
(target 0). What its merged gradient keeps wanting is the balance of the two objectives, which the other
player moves, so nothing is said (``RunSeries.pass_push`` holds the passes' pushes).

The failure is named only when it was there from the start — the prediction fell short on that route over
the first ``window`` steps too, or the same node squashed the same side then (a ReLU cuts its negative side
from step 0, before training has fitted what it can and the gradient turns one-sided); a shortfall that
begins mid-run follows from what changed then — the data, the optimizer — which other rules name — the loss did not fall below
``loss_share`` of its first steps' median, and a node on the prediction's signal path squashes that side
(:mod:`~comgra_ndbg.analysis.output_path`); without such a node the prediction may still be learning, and
nothing is said. The event sits at the squashing node, present from the first step (``at_start``).

>>> import numpy as np
>>> from comgra_ndbg.analysis.series import build_series
>>> from comgra_ndbg.analysis.synthetic import summary_rows
>>> from comgra_ndbg.graph.model import DependencyGraph, GraphEdge, GraphNode
>>> n = lambda name, role="intermediate": GraphNode(name, role, "", (name,), False)
>>> g = DependencyGraph((n("act"), n("out", "output"), n("loss", "loss")),
...                     (GraphEdge("act", "out", "forward"), GraphEdge("out", "loss", "forward")))
>>> one = np.ones(60)
>>> rows = {("act", "value"): summary_rows(rms=one, mean=0.6 * one, abs_mean=0.6 * one, low=0.0),
...         ("out", "value"): summary_rows(rms=one, mean=0.6 * one, abs_mean=0.6 * one, low=0.0),
...         ("out", "grad"): summary_rows(rms=one, mean=0.5 * one)}
>>> s = build_series(rows, roles={"act": "intermediate", "out": "output", "loss": "loss"},
...                  kpis={"loss": (np.arange(60), one)}, graph=g)
>>> [(e.node, e.to_state, e.at_start) for e in output_range_events(s)]
[('act', 'out_of_reach', True)]
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from comgra_ndbg.analysis.config import Thresholds
from comgra_ndbg.analysis.events import Event, Evidence
from comgra_ndbg.analysis.output_path import Squash, pinned, squashing_node
from comgra_ndbg.analysis.series import RunSeries
from comgra_ndbg.analysis.shift import strength
from comgra_ndbg.analysis.structure import parents

__all__ = ["output_range_events", "prediction_nodes", "Reach", "reach", "contested", "FAMILY", "STATE"]

FAMILY = "output_range"
STATE = "out_of_reach"


@dataclass(frozen=True)
class Reach:
    """What a prediction cannot reach: ``side`` (``low``: it cannot go down far enough; ``high``; ``both``
    for probabilities), how that was seen (``route``: ``target``, ``gradient``, ``probabilities``), the size
    of the shortfall (``gap``: share of the target range, |mean| / rms of the gradient, or loss ÷ the
    cross-entropy floor), and the prediction's extreme on that side against the target's (``reached``,
    ``wanted``; NaN where not known)."""

    prediction: str
    side: str
    route: str
    gap: float
    reached: float = float("nan")
    wanted: float = float("nan")


def _bounds(series: RunSeries, name: str, window: slice) -> tuple[float, ...]:
    """``(low, high)`` of a bounded activation's range (sigmoid or softmax: 0 to 1, tanh: −1 to 1), or ()."""
    value = series.node(name).stats["value"]
    if not np.isfinite(value["saturated_fraction"][window]).any():
        return ()
    return (0.0, 1.0) if np.nanmin(value["min"][window]) >= 0 else (-1.0, 1.0)


def prediction_nodes(series: RunSeries) -> list[str]:
    """The nodes the loss compares with the targets (see the module docstring)."""
    outputs = [n.name for n in series.nodes if n.role == "output" and n.has("value")]
    if outputs:
        return outputs
    names = {n.name for n in series.nodes}
    found: list[str] = []
    frontier = [n.name for n in series.nodes if n.role == "loss"]
    seen = set(frontier)
    while frontier:
        current = frontier.pop(0)
        for parent in parents(series.graph, current):
            if parent in seen or parent not in names:
                continue
            seen.add(parent)
            node = series.node(parent)
            if node.is_parameter or node.role in ("input", "target") or not node.has("value"):
                continue
            if node.role == "loss" or _constant_gradient(series, parent):
                frontier.append(parent)
            else:
                found.append(parent)
    return found


def _constant_gradient(series: RunSeries, name: str) -> bool:
    node = series.node(name)
    if not node.has("grad"):
        return False
    grad = node.stats["grad"]
    std, mean = grad["std"], np.abs(grad["mean"])
    ok = np.isfinite(std) & np.isfinite(mean) & (mean > 0)
    return bool(ok.any() and np.median(std[ok] / mean[ok]) < 1e-3)


def _window(series: RunSeries, tail: int, stop: int | None) -> slice:
    end = len(series.steps) if stop is None else stop
    return slice(max(0, end - max(end // tail, 1)), end)


def _target_reach(series: RunSeries, prediction: str, window: slice, t: Thresholds) -> Reach | None:
    value = series.node(prediction).stats["value"]
    for node in series.nodes:
        if node.role != "target" or not node.has("value"):
            continue
        target = node.stats["value"]
        if not np.any(target["count"] == value["count"]):
            continue  # class indices, or another shape: not values to compare with
        low, high = target["min"][window], target["max"][window]
        reached_low, reached_high = value["min"][window], value["max"][window]
        ok = np.isfinite(low) & np.isfinite(high) & np.isfinite(reached_low) & np.isfinite(reached_high)
        if not ok.any():
            continue
        span = float(np.median(high[ok] - low[ok]))
        if span <= 0:
            continue
        below = float(np.median(reached_low[ok] - low[ok])) / span
        above = float(np.median(high[ok] - reached_high[ok])) / span
        if max(below, above) >= t.range_gap:
            if below >= above:
                return Reach(prediction, "low", "target", below, float(np.median(reached_low[ok])),
                             float(np.median(low[ok])))
            return Reach(prediction, "high", "target", above, float(np.median(reached_high[ok])),
                         float(np.median(high[ok])))
        return None
    return _gradient_reach(series, prediction, window, t)


def _gradient_reach(series: RunSeries, prediction: str, window: slice, t: Thresholds) -> Reach | None:
    node = series.node(prediction)
    if not node.has("grad"):
        return None
    grad = node.stats["grad"]
    with np.errstate(divide="ignore", invalid="ignore"):  # a zero gradient has no direction: dropped below
        ratio = grad["mean"][window] / grad["rms"][window]
    ratio = ratio[np.isfinite(ratio)]
    if len(ratio) < t.min_history:
        return None
    down = float(np.median(ratio)) > 0  # a positive gradient: the loss wants the values lower
    pushed = float(np.mean(np.abs(ratio) >= t.range_push))
    if pushed < t.range_persist_share or np.all(np.sign(ratio) == 0):
        # targets on both sides of a bounded output partly cancel in the mean: a prediction pinned at the
        # bound it is pushed towards needs only half the push, of one sign at as many steps
        one_sign = float(np.mean(ratio > 0 if down else ratio < 0))
        if not (one_sign >= t.range_persist_share and np.median(np.abs(ratio)) >= t.range_push / 2
                and pinned(series, prediction, "low" if down else "high", window)):
            return None
    value = node.stats["value"]["min" if down else "max"][window]
    return Reach(prediction, "low" if down else "high", "gradient", float(np.median(np.abs(ratio))),
                 float(np.nanmedian(value)) if np.isfinite(value).any() else float("nan"))


def _probability_reach(series: RunSeries, prediction: str, window: slice) -> Reach | None:
    value = series.node(prediction).stats["value"]
    mean = value["mean"][window]
    bounded = np.isfinite(value["saturated_fraction"][window]).any()
    ok = np.isfinite(mean) & (mean > 0)
    if not bounded or not ok.any() or np.nanmin(value["min"][window]) < 0 or np.nanmax(value["max"][window]) > 1:
        return None
    classes = np.round(1.0 / mean[ok])
    if classes[0] < 2 or np.any(classes != classes[0]) or np.any(np.abs(mean[ok] * classes - 1) > 1e-3):
        return None
    floor = float(np.log1p((classes[0] - 1) / np.e))
    loss = series.loss[window]
    loss = loss[np.isfinite(loss)]
    if not len(loss) or np.median(loss) < 0.95 * floor:
        return None
    return Reach(prediction, "both", "probabilities", float(np.median(loss) / floor), float(np.median(loss)),
                 floor)


def reach(series: RunSeries, prediction: str, window: slice, t: Thresholds = Thresholds()) -> Reach | None:
    """What ``prediction`` cannot reach over the steps in ``window``, or None (see the module docstring)."""
    return _probability_reach(series, prediction, window) or _target_reach(series, prediction, window, t)


def contested(series: RunSeries, prediction: str, window: slice, t: Thresholds = Thresholds()) -> bool:
    """Whether passes of the same step pull ``prediction`` to opposite ends, each as hard as the gradient
    route's push, at ``range_persist_share`` of the steps in ``window`` (see the module docstring)."""
    found = (series.pass_push or {}).get(prediction)
    if found is None:
        return False
    low, high = found[0][window], found[1][window]
    if not len(low):
        return False
    opposed = (low <= -t.range_push) & (high >= t.range_push)  # NaN (one pass) compares False
    return bool(np.mean(opposed) >= t.range_persist_share)


def _loss_stays_high(series: RunSeries, window: slice, t: Thresholds) -> bool:
    loss = series.loss
    start, late = loss[:t.start_steps], loss[window]
    start, late = start[np.isfinite(start)], late[np.isfinite(late)]
    if not len(start) or not len(late):
        return True
    return bool(np.median(late) >= t.range_loss_share * np.median(start))


def _squash_for(series: RunSeries, found: Reach, window: slice, t: Thresholds) -> Squash | None:
    sides = ("low", "high") if found.side == "both" else (found.side,)
    for side in sides:
        squash = squashing_node(series, found.prediction, side, window, compression=t.range_compression)
        if squash is not None:
            return squash
    return None


def _same_node(squash: Squash | None, node: str) -> bool:
    return squash is not None and squash.node == node


def output_range_events(series: RunSeries, thresholds: Thresholds = Thresholds(), *,
                        stop: int | None = None) -> list[Event]:
    """One ``out_of_reach`` event per prediction that cannot reach its targets, at its squashing node."""
    t = thresholds
    if len(series.steps) < 2 * t.min_history:
        return []
    window = _window(series, t.range_tail, stop)
    if not _loss_stays_high(series, window, t):
        return []
    events = []
    for prediction in prediction_nodes(series):
        found = reach(series, prediction, window, t)
        if found is None or contested(series, prediction, window, t):
            continue
        squash = _squash_for(series, found, window, t)
        early = slice(0, min(t.window, window.start))
        if squash is None or not (reach(series, prediction, early, t) is not None
                                  or _same_node(_squash_for(series, replace(found, side=squash.side), early, t),
                                                squash.node)):
            continue  # nothing squashes, or the shortfall began mid-run: what changed then is another rule's
        events.append(_event(series, found, squash, window, t))
    return events


def _event(series: RunSeries, found: Reach, squash: Squash, window: slice, t: Thresholds) -> Event:
    steps = series.steps
    tail = steps[window]
    reached = Evidence(f"{found.prediction}/value/{'min' if found.side == 'low' else 'max'}",
                       tuple(int(v) for v in tail[-3:]), (found.reached,), found.wanted)
    how = Evidence(f"{squash.node}/value/{squash.how}:{squash.side}", tuple(int(v) for v in tail[-3:]),
                   (squash.ratio, squash.bound), float(found.gap))
    magnitude = float(np.log10(squash.ratio)) if np.isfinite(squash.ratio) else float("inf")
    threshold = {"target": t.range_gap, "gradient": t.range_push, "probabilities": 1.0}[found.route]
    route = Evidence(f"route/{found.route}/{found.prediction}", (), _bounds(series, found.prediction, window))
    return Event(FAMILY, squash.node, "value", "normal", STATE, int(steps[0]), int(steps[window.stop - 1]),
                 magnitude, strength(found.gap, threshold), (reached, how, route), at_start=True)

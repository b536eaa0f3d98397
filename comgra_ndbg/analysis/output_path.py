"""Where a prediction's range is cut: the walk from the model's output back to the node that squashes one
side of the signal.

A prediction that cannot reach its targets on one side (too low: it cannot go down far enough; too high: it
cannot go up) is limited by a node on its own signal path — the output itself or a node it passes through
unit by unit (:func:`~comgra_ndbg.analysis.structure.passes_through`). A node *squashes* a side when, over
the steps looked at, it is

- *pinned* at a bound of a bounded activation (a sigmoid, tanh or softmax whose extreme on that side lies
  within ``pin_margin`` of the range's width from its bound), or
- *compressed* (a node of unbounded range): the mass of its values on that side (Σ of the negative or positive parts, from the summary's
  mean and mean absolute value) is ``compression`` × or more below the other side's — a LeakyReLU with slope
  0.01 on symmetric inputs makes its negative side about 100× smaller, a ReLU removes it (ratio ∞).

The walk starts at the prediction and goes back while the current node passes its input through; the node
named is the most upstream one of the first run of squashing nodes (a ReLU's output, not the container that
returns it). A node with weights of its own (a Linear) ends the walk: it mixes units, so whatever limits the
range lies after it.

>>> import numpy as np
>>> from comgra_ndbg.analysis.series import build_series
>>> from comgra_ndbg.analysis.synthetic import summary_rows
>>> from comgra_ndbg.graph.model import DependencyGraph, GraphEdge, GraphNode
>>> n = lambda name: GraphNode(name, "intermediate", "", (name,), False)
>>> g = DependencyGraph((n("fc"), n("act"), n("out")), (GraphEdge("fc", "act", "forward"),
...                                                     GraphEdge("act", "out", "forward")))
>>> one = np.ones(30)
>>> rows = {("fc", "value"): summary_rows(rms=one),
...         ("act", "value"): summary_rows(rms=one, mean=0.495 * one, abs_mean=0.505 * one, low=-0.01),
...         ("out", "value"): summary_rows(rms=one, mean=0.6 * one, abs_mean=0.6 * one, low=0.5, high=0.7)}
>>> s = build_series(rows, roles={"fc": "intermediate", "act": "intermediate", "out": "intermediate"},
...                  kpis={}, graph=g)
>>> found = squashing_node(s, "out", "low", slice(0, 30))
>>> found.node, found.how, round(found.ratio)
('act', 'compressed', 100)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from comgra_ndbg.analysis.series import RunSeries
from comgra_ndbg.analysis.structure import parents, passes_through

__all__ = ["Squash", "squashing_node", "side_masses", "signal_path", "pinned", "bounded"]


@dataclass(frozen=True)
class Squash:
    """A node that limits one side of a signal: ``how`` is ``removed`` (no values on that side), ``compressed``
    (that side ``ratio`` × smaller than the other) or ``pinned`` (at the bound ``bound`` of a bounded
    activation); ``side`` is ``low`` (the negative side) or ``high``."""

    node: str
    side: str
    how: str
    ratio: float
    bound: float = float("nan")


def signal_path(series: RunSeries, prediction: str, max_hops: int = 6) -> list[str]:
    """``prediction`` and the nodes it passes through, going back one computed input at a time."""
    path = [prediction]
    info = series.info or {}
    current = prediction
    for _ in range(max_hops):
        if not passes_through(series.graph, info, current):
            break
        computed = [p for p in parents(series.graph, current)
                    if not info.get(p) or not info[p].parameter_ranks]
        computed = [p for p in computed if _has_value(series, p)]
        if len(computed) != 1 or computed[0] in path:
            break
        current = computed[0]
        path.append(current)
    return path


def _has_value(series: RunSeries, name: str) -> bool:
    try:
        node = series.node(name)
    except KeyError:
        return False
    return node.has("value") and not node.is_parameter


def side_masses(series: RunSeries, name: str, window: slice) -> tuple[float, float]:
    """Median over ``window`` of the mean negative part (−Σ min(x, 0) / n) and the mean positive part of the
    node's values: ``(abs_mean − mean) / 2`` and ``(abs_mean + mean) / 2``."""
    value = series.node(name).stats["value"]
    mean, abs_mean = value["mean"][window], value["abs_mean"][window]
    ok = np.isfinite(mean) & np.isfinite(abs_mean)
    if not ok.any():
        return float("nan"), float("nan")
    negative = np.maximum((abs_mean[ok] - mean[ok]) / 2, 0.0)
    positive = np.maximum((abs_mean[ok] + mean[ok]) / 2, 0.0)
    return float(np.median(negative)), float(np.median(positive))


def _squash(series: RunSeries, name: str, side: str, window: slice, compression: float,
            pin_margin: float) -> Squash | None:
    value = series.node(name).stats["value"]
    lows, highs = value["min"][window], value["max"][window]
    if not (np.isfinite(lows).any() and np.isfinite(highs).any()):  # (a node recorded non-finite throughout)
        return None
    low, high = np.nanmedian(lows), np.nanmedian(highs)
    if not (np.isfinite(low) and np.isfinite(high)):
        return None
    if bounded(series, name, window):
        floor = 0.0 if low >= 0 else -1.0  # sigmoid / softmax: (0, 1); tanh: (-1, 1)
        width = 1.0 - floor
        if side == "low" and low - floor <= pin_margin * width:
            return Squash(name, side, "pinned", float("inf"), floor)
        if side == "high" and 1.0 - high <= pin_margin * width:
            return Squash(name, side, "pinned", float("inf"), 1.0)
        return None  # a bounded activation's values lie on one side by design: only a bound limits them
    negative, positive = side_masses(series, name, window)
    small, large = (negative, positive) if side == "low" else (positive, negative)
    if not (np.isfinite(small) and np.isfinite(large)) or large <= 0:
        return None
    if small == 0:
        return Squash(name, side, "removed", float("inf"))
    ratio = large / small
    return Squash(name, side, "compressed", float(ratio)) if ratio >= compression else None


def bounded(series: RunSeries, name: str, window: slice) -> bool:
    """Whether the node is the output of an activation of known bounds (sigmoid, tanh, softmax)."""
    return bool(np.isfinite(series.node(name).stats["value"]["saturated_fraction"][window]).any())


def pinned(series: RunSeries, name: str, side: str, window: slice, pin_margin: float = 0.02) -> bool:
    """Whether the bounded node ``name`` sits at its bound on ``side`` over ``window``."""
    squash = _squash(series, name, side, window, float("inf"), pin_margin)
    return squash is not None and squash.how == "pinned"


def squashing_node(series: RunSeries, prediction: str, side: str, window: slice, *, compression: float = 20.0,
                   pin_margin: float = 0.02) -> Squash | None:
    """The node on ``prediction``'s signal path that squashes ``side`` (``low`` or ``high``) over the steps
    in ``window``, or None when no node on the path does (see the module docstring)."""
    found: Squash | None = None
    for name in signal_path(series, prediction):
        squash = _squash(series, name, side, window, compression, pin_margin)
        if squash is None and found is not None:
            break
        if squash is not None:
            found = squash
    return found

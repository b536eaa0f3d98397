"""Gradient health: healthy → vanishing / exploding, measured against the output's gradient.

A node's gradient rms is divided by the rms of the output node's gradient at the same step (the
*cross-layer ratio*). When a task is learned and the loss goes to 0, every gradient shrinks together and
the ratio stays put; when a block in the middle starts to attenuate or amplify, the ratio of every node
behind it moves. Two rules:

- relative: the ratio's log10 shifts by ``enter_decades`` against its own recent history (hysteresis); the
  shift is *sudden* (harm by itself) only when the node's own gradient jumped with the ratio in one step;
- absolute, from step 0: the median ratio over the first ``start_steps`` is beyond
  ``start_gradient_decades`` (an architecture or initialisation that cannot carry gradients).

Sudden shifts of the same size, in the same step and direction, in most parameter nodes while no module
output's gradient moved are one event of the node ``optimizer``: the backward pass delivered the gradients
it always did, and something between it and the optimizer's step scaled every parameter's gradient alike
(``clip_grad_norm_`` with a tiny ``max_norm``, a ``.grad`` multiplied by hand). Read one by one they were
each a vanishing (or exploding) layer.

>>> import numpy as np
>>> from comgra_ndbg.analysis.series import build_series
>>> from comgra_ndbg.store.schema import FIELD, identity_row
>>> def rows(rms):
...     r = np.tile(identity_row(), (len(rms), 1)); r[:, FIELD["count"]] = 1; r[:, FIELD["sum_sq"]] = np.square(rms)
...     return np.arange(len(rms)), r
>>> decay = np.logspace(0, -3, 100)  # the loss goes to 0: every gradient shrinks 1000×
>>> s = build_series({("h", "grad"): rows(decay * 0.1), ("out", "grad"): rows(decay)},
...                  roles={"h": "intermediate", "out": "output"}, kpis={})
>>> gradient_events(s)
[]
>>> broken = decay * 0.1; broken[60:] *= 1e-3
>>> s = build_series({("h", "grad"): rows(broken), ("out", "grad"): rows(decay)},
...                  roles={"h": "intermediate", "out": "output"}, kpis={})
>>> [(e.to_state, e.onset, round(e.magnitude, 1)) for e in gradient_events(s)]
[('vanishing', 60, 3.0)]
"""
from __future__ import annotations

import numpy as np

from comgra_ndbg.analysis.config import Thresholds
from comgra_ndbg.analysis.events import Event, Evidence
from comgra_ndbg.analysis.optimizer_stability import OPTIMIZER
from comgra_ndbg.analysis.series import NodeSeries, RunSeries
from comgra_ndbg.analysis.shift import Shift, level_shifts, log_level, strength

__all__ = ["gradient_events", "reference_node", "normalized_gradient", "scaled_after_backward", "FAMILY"]

FAMILY = "gradient_health"


def reference_node(series: RunSeries) -> NodeSeries | None:
    """The node whose gradient normalises the others: the output node, else the last node with a gradient."""
    with_grad = [n for n in series.nodes if n.has("grad") and n.role != "loss"]
    outputs = [n for n in with_grad if n.role == "output"]
    if outputs:
        return outputs[-1]
    computed = [n for n in with_grad if not n.is_parameter]
    return computed[-1] if computed else None


def normalized_gradient(series: RunSeries, node: NodeSeries, reference: NodeSeries) -> np.ndarray:
    """``log10(rms grad of node / rms grad of reference)`` per step (NaN where either is missing)."""
    return log_level(node.stats["grad"]["rms"]) - log_level(reference.stats["grad"]["rms"])


def gradient_events(series: RunSeries, thresholds: Thresholds = Thresholds(), *, stop: int | None = None,
                    settle: int = 0) -> list[Event]:
    """Gradient events of every node with a gradient, over the steps before index ``stop``; relative rules
    start at index ``settle``."""
    t = thresholds
    reference = reference_node(series)
    if reference is None:
        return []
    events: list[Event] = []
    for node in series.nodes:
        if node is reference or not node.has("grad") or node.role == "loss":
            continue
        ratio = normalized_gradient(series, node, reference)[:stop]
        own = log_level(node.stats["grad"]["rms"])[:stop]
        events += _start_events(series, node, ratio, t)
        x = ratio.copy()
        x[:settle] = np.nan
        for s in _shifts(x, t):
            state = "exploding" if s.direction > 0 else "vanishing"
            enter = _entry(t, s.direction)
            window = slice(s.start, min(s.start + 3, len(x)))
            evidence = Evidence(f"{node.name}/grad/rms÷{reference.name}/grad/rms",
                                tuple(int(v) for v in series.steps[window]),
                                tuple(float(10 ** v) for v in x[window]), float(10 ** s.baseline))
            events.append(Event(FAMILY, node.name, "grad", "healthy", state, int(series.steps[s.start]),
                                int(series.steps[s.end]), s.peak, strength(s.peak, enter), (evidence,),
                                sudden=_sudden(s, x, own, t.sudden_fraction * enter, series.step_types)))
    return events


UNIFORM_DECADES = 0.5
"""How far apart (decades) the parameter nodes' shifts may be to count as one scaling of every gradient."""


def scaled_after_backward(series: RunSeries, events: list[Event], t: Thresholds = Thresholds()) -> list[Event]:
    """``events`` (of every family) with each group of sudden, same-sized, same-step gradient shifts in at
    least ``optimizer_share`` of the parameter nodes (two at least) replaced by one event of the node
    ``optimizer`` (module docstring) — when no event of another node (an input, a module output's value or
    gradient) lies within ``same_time`` steps: a parameter's gradient is its module's input times its output's
    gradient, so a change in the forward pass moves the parameters' gradients alone as well."""
    parameters = {n.name for n in series.parameters if n.has("grad")}
    if len(parameters) < 2:
        return events
    out, used = list(events), set()
    for first in events:
        if first.key in used or first.node not in parameters or not first.sudden or first.at_start:
            continue
        if first.family != FAMILY:
            continue
        group = [e for e in events if e.family == FAMILY and e.node in parameters and e.sudden and not e.at_start
                 and e.key not in used and e.onset == first.onset and e.to_state == first.to_state]
        sizes = [e.magnitude for e in group]
        others = [e for e in events if e.node not in parameters and abs(e.onset - first.onset) <= t.same_time]
        if (len(group) < max(2, t.optimizer_share * len(parameters)) or max(sizes) - min(sizes) > UNIFORM_DECADES
                or others):
            continue
        used.update(e.key for e in group)
        magnitude = float(np.median(sizes))
        out = [e for e in out if e.key not in used]
        out.append(Event(FAMILY, OPTIMIZER, "grad", "healthy", first.to_state, first.onset, max(e.end for e in group),
                         magnitude, strength(magnitude, _entry(t, 1 if first.to_state == "exploding" else -1)),
                         tuple(e.evidence[0] for e in group[:4]), sudden=True))
    return out


def _sudden(shift: Shift, ratio: np.ndarray, own: np.ndarray, least: float, types: np.ndarray | None) -> bool:
    """Whether the ratio's shift is a step change of the node itself: the ratio jumped by at least ``least``
    decades in one step, and so did the node's own gradient level ``own``. A ratio also jumps when only its
    reference does — the output's gradient of a noisy batch under gradient clipping, which caps every
    parameter's gradient and not the output's — and that shows no change in the node. In a run of several
    step types (``types``), "one step" is the last earlier step of the same type: a sequence of ten
    iterations carries a gradient decades smaller than one of a single iteration, so gradients jump from
    one step to the next whenever the type changes, and that is no change of the node either."""
    if not shift.jump >= least:
        return False
    before = _previous(shift.start, ratio, own, types)
    if before is None or not np.isfinite(own[shift.start]):
        return False
    return bool(shift.direction * (ratio[shift.start] - ratio[before]) >= least
                and shift.direction * (own[shift.start] - own[before]) >= least)


def _previous(i: int, ratio: np.ndarray, own: np.ndarray, types: np.ndarray | None) -> int | None:
    """The last index before ``i`` where both series are finite — of the same step type as ``i`` when the
    run has several types among its finite steps — or None."""
    earlier = np.isfinite(ratio[:i]) & np.isfinite(own[:i])
    if types is not None and len(types) >= len(ratio):
        kinds = types[:len(ratio)][np.isfinite(own)]
        if len(set(kinds.tolist())) > 1:
            earlier &= types[:i] == types[i]
    found = np.flatnonzero(earlier)
    return int(found[-1]) if len(found) else None


def _entry(t: Thresholds, direction: int) -> float:
    """The relative rule's entry shift on one side: ``vanishing_decades`` / ``exploding_decades`` where set."""
    chosen = t.exploding_decades if direction > 0 else t.vanishing_decades
    return t.enter_decades if chosen is None else float(chosen)


def _shifts(x: np.ndarray, t: Thresholds) -> list[Shift]:
    """Level shifts of the log ratio ``x``: one pass over both sides with ``enter_decades``, or, when a side
    has its own entry shift, one pass per side (each side's hysteresis and baseline of its own)."""
    common = dict(window=t.window, min_history=t.min_history, exit=t.exit_decades, persist=t.persist)
    down, up = _entry(t, -1), _entry(t, 1)
    if down == up == t.enter_decades:
        return level_shifts(x, enter=t.enter_decades, **common)
    both = (level_shifts(x, enter=down, directions=(-1,), **common)
            + level_shifts(x, enter=up, directions=(1,), **common))
    return sorted(both, key=lambda s: s.start)


def _start_events(series: RunSeries, node: NodeSeries, ratio: np.ndarray, t: Thresholds) -> list[Event]:
    """A gradient ratio off by ``start_gradient_decades`` over the first steps: the architecture or the
    initialisation — unless step 0, before any update, was recorded inside the band: then the first
    updates moved it there, and the event is theirs (the optimizer's), not the network's."""
    head = ratio[:t.start_steps]
    if not np.isfinite(head).any():
        return []
    if np.nan_to_num(node.stats["grad"]["abs_max"][:t.start_steps], nan=0.0).max(initial=0.0) == 0:
        return []  # exactly 0: a cut backward path, which update stagnation reads, not an attenuation
    if (len(series.steps) and series.steps[0] == 0 and np.isfinite(ratio[0])
            and abs(ratio[0]) < t.start_gradient_decades - t.exit_decades):
        return []
    level = float(np.nanmedian(head))
    if abs(level) < t.start_gradient_decades:
        return []
    state = "exploding" if level > 0 else "vanishing"
    same_side = np.sign(level) * ratio >= t.start_gradient_decades - t.exit_decades
    leaving = np.flatnonzero(~np.nan_to_num(same_side, nan=True))
    end = int(leaving[0]) - 1 if len(leaving) else len(ratio) - 1
    window = slice(0, min(3, len(ratio)))
    evidence = Evidence(f"{node.name}/grad/rms÷output/grad/rms", tuple(int(v) for v in series.steps[window]),
                        tuple(float(10 ** v) for v in ratio[window]))
    return [Event(FAMILY, node.name, "grad", "healthy", state, int(series.steps[0]), int(series.steps[max(end, 0)]),
                  abs(level), strength(abs(level), t.start_gradient_decades), (evidence,), at_start=True)]

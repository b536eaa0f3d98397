"""Non-finite values: the first NaN/Inf of every series, in the order the step computed them.

Within a step the forward pass runs first (inputs, then nodes in forward order), then the backward pass
(gradients from the output back to the inputs), then the optimizer update; a parameter's *value* at a
step is the result of the previous step's update. :func:`phase_key` encodes that order, so sorting
events by it finds the true first occurrence.
"""
from __future__ import annotations

import numpy as np

from comgra_ndbg.analysis.events import Event, Evidence
from comgra_ndbg.analysis.series import RunSeries

__all__ = ["nonfinite_events", "first_nonfinite_index", "phase_key", "FAMILY"]

FAMILY = "nonfinite"
_PHASES = {"value": 1, "grad": 2, "update": 3}


# Within one node and step: units die or saturate (and then the scale moves), a scale shift precedes the
# collapse it causes (a shrunken signal leaves only its bias) and the non-finite values it overflows into.
_STATE_ORDER = {"dead": 0, "saturated": 0, "frozen": 0, "collapsed": 1.5, "non-finite": 2}


def phase_key(event: Event, series: RunSeries) -> tuple[int, int, float, float]:
    """``(onset, phase, position, within)``: the order in which the step produced the event's series.

    Parameter values come first (phase 0: they were set by the previous update), then the forward pass in
    forward order ending with KPIs such as the loss, the backward pass in reverse forward order, and the
    update (a whole-model event such as the optimizer's before the parameters' own). Within one node and
    step, dead or saturated units come before a scale shift, and a scale shift before non-finite values.
    """
    order = {n.name: n.order for n in series.nodes}
    position = order.get(event.node, len(order))
    within = _STATE_ORDER.get(event.to_state, 1)
    if event.kind == "kpi":  # a KPI such as the loss is computed at the end of the forward pass
        return (event.onset, 1, len(order), within)
    if event.node not in order:  # a whole-model event (the optimizer) precedes its parameters' updates
        return (event.onset, _PHASES.get(event.kind, 4), -1, within)
    if event.kind == "value" and series.node(event.node).is_parameter:
        return (event.onset, 0, position, within)
    if event.kind == "grad" or event.kind.startswith("grad:"):
        return (event.onset, 2, -position, within)
    return (event.onset, _PHASES.get(event.kind, 4), position, within)


def first_nonfinite_index(series: RunSeries) -> int | None:
    """Index (into ``series.steps``) of the first step where any series or the loss is non-finite."""
    first = len(series.steps)
    for node in series.nodes:
        for stats in node.stats.values():
            hits = np.flatnonzero(stats["nonfinite"] > 0)
            if len(hits):
                first = min(first, int(hits[0]))
    if "loss" in series.kpis:
        hits = np.flatnonzero(~np.isfinite(series.kpis["loss"]) & series.kpi_recorded("loss"))
        if len(hits):
            first = min(first, int(hits[0]))
    return None if first == len(series.steps) else first


def nonfinite_events(series: RunSeries) -> list[Event]:
    """One event per (node, kind) that ever held a NaN or Inf, plus one for a non-finite loss KPI.

    ``onset`` is the first such step, ``end`` the last, ``magnitude`` the non-finite share at onset.
    """
    steps = series.steps
    events: list[Event] = []
    for node in series.nodes:
        for kind, stats in node.stats.items():
            bad = stats["nonfinite"] > 0
            hits = np.flatnonzero(bad)
            if not len(hits):
                continue
            i, j = int(hits[0]), int(hits[-1])
            share = float(stats["nonfinite_fraction"][i])
            evidence = Evidence(f"{node.name}/{kind}/nonfinite_fraction",
                                tuple(int(s) for s in steps[i:i + 3]),
                                tuple(float(v) for v in stats["nonfinite_fraction"][i:i + 3]), 0.0)
            events.append(Event(FAMILY, node.name, kind, "finite", "non-finite", int(steps[i]), int(steps[j]),
                                share, 1.0, (evidence,), at_start=i == 0))
    if "loss" in series.kpis:
        loss = series.kpis["loss"]
        hits = np.flatnonzero(~np.isfinite(loss) & series.kpi_recorded("loss"))
        if len(hits):
            i, j = int(hits[0]), int(hits[-1])
            evidence = Evidence("kpi/loss", tuple(int(s) for s in steps[max(0, i - 2):i + 1]),
                                tuple(float(v) for v in loss[max(0, i - 2):i + 1]))
            events.append(Event(FAMILY, "loss", "kpi", "finite", "non-finite", int(steps[i]), int(steps[j]),
                                1.0, 1.0, (evidence,), at_start=i == 0))
    return sorted(events, key=lambda e: phase_key(e, series))

"""Abrupt failures: what jumped in the last steps before a run turned non-finite.

Relative rules need a state to last ``persist`` steps, so a brief excursion is not a shift. A run killed
within one or two steps — a learning rate ×1000, a gradient multiplied by 1e4 — never gives them the time:
the next step is already NaN and every family but ``nonfinite`` stops there. Yet the steps just before the
first non-finite value say what happened first: an update that jumped in most parameters at once (the
optimizer), a gradient that jumped in one node (the backward pass there). So in the ``abrupt_steps`` steps
before the first non-finite step, the relative and absolute rules run again with ``persist = 1`` and
``abrupt_decades`` as the jump they need; what they find that the persistent rules did not is added, and
ordering by :func:`~comgra_ndbg.analysis.nonfinite.phase_key` finds the first.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from comgra_ndbg.analysis.activation_regime import activation_events
from comgra_ndbg.analysis.config import Thresholds
from comgra_ndbg.analysis.events import Event
from comgra_ndbg.analysis.gradient_health import gradient_events
from comgra_ndbg.analysis.optimizer_stability import cluster_events, update_events
from comgra_ndbg.analysis.series import RunSeries

__all__ = ["abrupt_events"]


def abrupt_events(series: RunSeries, existing: Sequence[Event], thresholds: Thresholds = Thresholds(), *,
                  stop: int | None) -> list[Event]:
    """Single-step jumps within ``abrupt_steps`` steps before index ``stop`` (the first non-finite step)
    that no event in ``existing`` already covers."""
    t = thresholds
    if stop is None or stop == 0:
        return []
    quick = replace(t, persist=1, enter_decades=t.abrupt_decades, exit_decades=t.abrupt_decades / 2)
    first = max(0, stop - t.abrupt_steps)
    updates = update_events(series, quick, stop=stop)
    found = activation_events(series, quick, stop=stop) + gradient_events(series, quick, stop=stop)
    found += updates + cluster_events(series, updates, quick)
    covered = {(e.label, e.node, e.kind) for e in existing}
    out = []
    for event in found:
        i = int(np.searchsorted(series.steps, event.onset))
        if i >= first and (event.label, event.node, event.kind) not in covered:
            out.append(event)
    return out

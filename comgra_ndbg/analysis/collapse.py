"""Mode collapse: a node's values become nearly identical across the samples of a batch.

``sample_spread`` (see :mod:`comgra_ndbg.stats.statistics`) is the share of a tensor's second moment that varies
across the samples of its batch: about 1 when each unit is centred over the batch, 0 when every sample
gives the same values. A representation that stops telling samples apart — a generator producing one
image, a layer whose weights were zeroed so only its bias remains, a pooled feature flattened by a bug — has
its spread fall by orders of magnitude while its scale may stay where it was, which no scale rule sees.

A node *collapses* when the log10 of its spread shifts down by ``collapse_decades`` against its recent
history (the relative rule with hysteresis of :mod:`~comgra_ndbg.analysis.shift`) and the new level is
below ``collapse_level``: a spread that falls from 0.9 to 0.08 is a narrowing, from 0.9 to 0.005 a collapse.
A spread that is unknown (batch-less tensors, batches of one, older recordings) is NaN and never collapses.

>>> import numpy as np
>>> from comgra_ndbg.analysis.series import NodeSeries, RunSeries
>>> spread = np.r_[np.full(80, 0.8), np.full(40, 1e-4)]
>>> node = NodeSeries("h", "intermediate", 0, {"value": {"sample_spread": spread}})
>>> [(e.node, e.to_state, e.onset) for e in collapse_events(RunSeries(np.arange(120), (node,), {}))]
[('h', 'collapsed', 80)]
"""
from __future__ import annotations

import numpy as np

from comgra_ndbg.analysis.config import Thresholds
from comgra_ndbg.analysis.events import Event, Evidence
from comgra_ndbg.analysis.series import RunSeries
from comgra_ndbg.analysis.shift import level_shifts, log_level, strength

__all__ = ["collapse_events", "FAMILY", "SPREAD"]

FAMILY = "representation"
SPREAD = "sample_spread"


def collapse_events(series: RunSeries, thresholds: Thresholds = Thresholds(), *, stop: int | None = None,
                    settle: int = 0) -> list[Event]:
    """Collapse events of every forward node whose spread across samples was recorded."""
    t = thresholds
    events: list[Event] = []
    for node in series.activations:
        stats = node.stats.get("value", {})
        if SPREAD not in stats:
            continue
        spread = np.asarray(stats[SPREAD][:stop], dtype=np.float64)
        x = log_level(spread)
        x[:settle] = np.nan
        for s in level_shifts(x, window=t.window, min_history=t.min_history, enter=t.collapse_decades,
                              exit=t.collapse_decades / 2, persist=t.persist, directions=(-1,)):
            level = float(np.nanmedian(spread[s.start:s.end + 1]))
            if not level < t.collapse_level:
                continue
            window = slice(s.start, min(s.start + 3, len(spread)))
            evidence = Evidence(f"{node.name}/value/{SPREAD}", tuple(int(v) for v in series.steps[window]),
                                tuple(float(v) for v in spread[window]), float(10 ** s.baseline))
            events.append(Event(FAMILY, node.name, "value", "diverse", "collapsed", int(series.steps[s.start]),
                                int(series.steps[s.end]), s.peak, strength(s.peak, t.collapse_decades), (evidence,),
                                sudden=bool(s.jump >= t.sudden_fraction * t.collapse_decades)))
    return events

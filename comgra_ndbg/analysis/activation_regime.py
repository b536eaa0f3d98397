"""Activation regime of forward nodes: normal → vanishing / exploding (scale), dead, saturated.

- *scale*: the rms of a node's value shifts by ``enter_decades`` against its own recent history (relative
  rule with hysteresis, see :mod:`~comgra_ndbg.analysis.shift`);
- *dead*: the share of units that are exactly 0 for every sample reaches ``dead_enter`` — from the first
  steps (absolute rule) or, mid-run, rising by ``dead_rise`` above its recent median;
- *saturated*: the share of elements of a bounded activation (tanh, sigmoid) within the saturation
  margin of a bound reaches ``saturated_enter``, with the same two forms.

>>> import numpy as np
>>> from comgra_ndbg.analysis.series import build_series
>>> from comgra_ndbg.store.schema import FIELD, identity_row
>>> rows = np.tile(identity_row(), (100, 1))
>>> rows[:, FIELD["count"]], rows[:, FIELD["units"]] = 8, 4
>>> rows[60:, FIELD["dead_units"]] = 4
>>> s = build_series({("h", "value"): (np.arange(100), rows)}, roles={"h": "intermediate"}, kpis={})
>>> [(e.to_state, e.onset, e.end) for e in activation_events(s)]
[('dead', 60, 99)]
"""
from __future__ import annotations

import numpy as np

from comgra_ndbg.analysis.config import Thresholds
from comgra_ndbg.analysis.events import Event, Evidence
from comgra_ndbg.analysis.series import NodeSeries, RunSeries
from comgra_ndbg.analysis.shift import level_shifts, log_level, rolling_median, runs, strength

__all__ = ["activation_events", "fraction_events", "FAMILY"]

FAMILY = "activation_regime"


def activation_events(series: RunSeries, thresholds: Thresholds = Thresholds(), *,
                      stop: int | None = None, settle: int = 0) -> list[Event]:
    """Events of every forward node over the steps before index ``stop`` (the first non-finite step).

    Relative (scale) rules start at index ``settle``; absolute rules apply from the first step.
    """
    t = thresholds
    events: list[Event] = []
    scale = _input_scale(series)
    for node in series.activations:
        if not node.has("value"):
            continue
        stats = node.stats["value"]
        events += _scale_events(series, node, t, stop, settle)
        if node.role not in ("input", "target") and scale is not None:
            events += _initial_scale_events(series, node, scale, stop)
        if node.role != "input":
            events += fraction_events(series, node, stats["dead_fraction"], "dead", t.dead_enter, t.dead_exit,
                                      t.dead_rise, t, stop)
            events += fraction_events(series, node, stats["saturated_fraction"], "saturated", t.saturated_enter,
                                      t.saturated_exit, t.saturated_rise, t, stop)
    return events


def _scale_events(series: RunSeries, node: NodeSeries, t: Thresholds, stop: int | None,
                  settle: int) -> list[Event]:
    values = node.stats["value"]["rms"][:stop]
    x = log_level(values)
    x[:settle] = np.nan
    out = []
    for s in level_shifts(x, window=t.window, min_history=t.min_history, enter=t.enter_decades,
                          exit=t.exit_decades, persist=t.persist):
        state = "exploding" if s.direction > 0 else "vanishing"
        window = slice(s.start, min(s.start + 3, len(values)))
        evidence = Evidence(f"{node.name}/value/rms", tuple(int(v) for v in series.steps[window]),
                            tuple(float(v) for v in values[window]), float(10 ** s.baseline))
        out.append(Event(FAMILY, node.name, "value", "normal", state, int(series.steps[s.start]),
                         int(series.steps[s.end]), s.peak, strength(s.peak, t.enter_decades), (evidence,),
                         sudden=bool(s.jump >= t.sudden_fraction * t.enter_decades)))
    return out


INITIAL_RMS = 10.0
"""An activation of the untrained model (step 0) at or above this rms, and this many times the largest input's,
explodes in the forward pass from the initialisation (no update has run yet)."""


def _input_scale(series: RunSeries) -> float | None:
    """The largest rms of the model's inputs at step 0 (None when step 0, before any update, is not recorded
    or no input is)."""
    if not len(series.steps) or series.steps[0] != 0:
        return None
    found = [float(n.stats["value"]["rms"][0]) for n in series.activations
             if n.role == "input" and n.has("value") and np.isfinite(n.stats["value"]["rms"][0])]
    return max(found) if found else None


def _initial_scale_events(series: RunSeries, node: NodeSeries, scale: float, stop: int | None) -> list[Event]:
    """A node whose rms at step 0 is at least :data:`INITIAL_RMS` and that many times the inputs' (an RNN whose
    recurrent weights amplify, a gain wrong at initialisation): exploding from the first step, before the
    first update could be the cause."""
    rms = node.stats["value"]["rms"][:stop]
    if not len(rms) or not np.isfinite(rms[0]) or rms[0] < INITIAL_RMS or rms[0] < INITIAL_RMS * scale:
        return []
    ratio = float(rms[0] / max(scale, 1e-30))
    evidence = Evidence(f"{node.name}/value/rms", (int(series.steps[0]),), (float(rms[0]),), scale)
    decades = float(np.log10(ratio))
    return [Event(FAMILY, node.name, "value", "normal", "exploding", int(series.steps[0]), int(series.steps[0]),
                  decades, strength(decades, 1.0), (evidence,), at_start=True)]


def fraction_events(series: RunSeries, node: NodeSeries, fraction: np.ndarray, state: str, enter: float,
                    exit: float, rise: float, t: Thresholds, stop: int | None) -> list[Event]:
    """Absolute-level states of a share in [0, 1] (dead units, saturation), with hysteresis.

    The state is entered after ``persist`` steps at or above ``enter``; it is left after ``persist`` steps
    below ``exit``. A state present in the median of the first ``start_steps`` steps is an ``at_start``
    event at the first step — unless step 0, before any update, was recorded below ``exit``: then the
    first updates brought it (a learning rate wrong from the start), and it is an event at the step it
    was entered, measured against step 0. A later one must also have risen ``rise`` above its recent median.
    """
    f = np.asarray(fraction[:stop], dtype=np.float64)
    if not np.isfinite(f).any() or np.nanmax(f) < enter:
        return []
    steps = series.steps
    start_median = float(np.nanmedian(f[:t.start_steps])) if np.isfinite(f[:t.start_steps]).any() else np.nan
    base = rolling_median(f, t.window, t.min_history)
    untrained = f[0] if len(steps) and steps[0] == 0 and np.isfinite(f[0]) and f[0] < exit else np.nan
    base = np.where(np.isnan(base) & (np.arange(len(f)) < t.start_steps), untrained, base)
    out = []
    for i, _ in runs(np.nan_to_num(f, nan=-1.0) >= enter, t.persist):
        if out and steps[i] <= out[-1].end:
            continue
        at_start = bool(i < t.start_steps and start_median >= enter and np.isnan(untrained))
        if not at_start and not (np.isfinite(base[i]) and f[i] - base[i] >= rise):
            continue
        below = np.nan_to_num(f[i:], nan=1.0) < exit
        leave = runs(below, t.persist)
        end = i + leave[0][0] - 1 if leave else len(f) - 1
        onset = 0 if at_start else i
        window = slice(onset, min(onset + 3, len(f)))
        evidence = Evidence(f"{node.name}/value/{state}_fraction", tuple(int(v) for v in steps[window]),
                            tuple(float(v) for v in f[window]), float(base[i]) if not at_start else float("nan"))
        peak = float(np.nanmax(f[i:end + 1]))
        out.append(Event(FAMILY, node.name, "value", "normal", state, int(steps[onset]), int(steps[end]), peak,
                         strength(peak - (0.0 if at_start else base[i]), enter), (evidence,), at_start=at_start))
    return out

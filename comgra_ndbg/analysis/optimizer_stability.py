"""Optimizer stability: update sizes and the loss (spikes, divergence); frozen parameters are
:mod:`~comgra_ndbg.analysis.stagnation`'s.

- *unstable*: a parameter node's update/weight ratio ‖ΔW‖/‖W‖ jumps up by ``enter_decades`` against its
  recent history (relative, with hysteresis; drops are not failures — LR decay is legitimate), or stays
  above ``update_ratio_high`` for ``persist`` steps (absolute band, from step 0);
- *optimizer*: such jumps in at least ``optimizer_share`` of the parameter nodes within
  ``optimizer_spread`` steps form one event of the node ``optimizer``;
- loss *spike*: the loss above ``spike_factor`` × its recent median and, within ``spike_recovery_steps``,
  back under ``spike_recovery_factor`` × it or ``spike_factor`` × below the spike (transient: one batch,
  whatever damage its update left to heal), peaking at or above
  ``spike_floor`` × the loss of the untrained model (a trained model that does worse on one batch than it
  did before training saw something it should not; a noisy batch of a model at a loss of 1e-5 did not);
  *diverging*: above ``divergence_factor`` × for ``persist`` steps, and by at least ``harm_fraction`` of the
  untrained model's loss (a loss of 1e-7 rising to 1e-5 is noise, not divergence); *jumped*: above
  ``spike_factor`` × at once and above ``spike_recovery_factor`` × for the ``window`` steps after, their
  median higher by at least ``harm_fraction`` of the untrained model's loss (a lasting jump short of
  divergence: labels shuffled from one step on, the model still learning what it can).

>>> import numpy as np
>>> from comgra_ndbg.analysis.series import build_series
>>> loss = np.full(100, 1.0); loss[70] = 50.0
>>> s = build_series({}, roles={}, kpis={"loss": (np.arange(100), loss)})
>>> [(e.to_state, e.onset, e.end) for e in loss_events(s)]
[('spike', 70, 70)]
"""
from __future__ import annotations

import numpy as np

from comgra_ndbg.analysis.config import Thresholds
from comgra_ndbg.analysis.events import Event, Evidence
from comgra_ndbg.analysis.series import NodeSeries, RunSeries
from comgra_ndbg.analysis.shift import log_level, measured_shifts, rolling_median, runs, sparse_positions, strength

__all__ = ["optimizer_events", "update_events", "cluster_events", "loss_events", "update_ratio", "initial_loss",
           "FAMILY", "OPTIMIZER"]

FAMILY = "optimizer_stability"
OPTIMIZER = "optimizer"


def update_ratio(node: NodeSeries) -> np.ndarray:
    """‖ΔW‖ / ‖W‖ per step (NaN where either is missing)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return node.stats["update"]["l2"] / node.stats["value"]["l2"]


def optimizer_events(series: RunSeries, thresholds: Thresholds = Thresholds(), *, stop: int | None = None,
                     settle: int = 0) -> list[Event]:
    """Update, optimizer-cluster and loss events over the steps before index ``stop``."""
    updates = update_events(series, thresholds, stop=stop, settle=settle)
    return updates + cluster_events(series, updates, thresholds) + loss_events(series, thresholds, stop=stop,
                                                                               settle=settle)


def update_events(series: RunSeries, thresholds: Thresholds = Thresholds(), *, stop: int | None = None,
                  settle: int = 0) -> list[Event]:
    t = thresholds
    steps = series.steps
    events: list[Event] = []
    for node in series.parameters:
        if not (node.has("update") and node.has("value")):
            continue
        ratio = update_ratio(node)[:stop]
        x = log_level(ratio)
        relative = x.copy()
        relative[:settle] = np.nan
        for s in measured_shifts(relative, window=t.window, min_history=t.min_history, enter=t.enter_decades,
                                 exit=t.exit_decades, persist=t.persist, directions=(1,)):
            window = slice(s.start, min(s.start + 3, len(x)))
            evidence = Evidence(f"{node.name}/update/l2÷value/l2", tuple(int(v) for v in steps[window]),
                                tuple(float(v) for v in ratio[window]), float(10 ** s.baseline))
            events.append(Event(FAMILY, node.name, "update", "stable", "unstable", int(steps[s.start]),
                                int(steps[s.end]), s.peak, strength(s.peak, t.enter_decades), (evidence,)))
        for i, j in _band_runs(ratio, t.update_ratio_high, t.persist):
            if any(e.onset <= steps[i] <= e.end for e in events if e.node == node.name):
                continue
            magnitude = float(np.log10(np.nanmax(ratio[i:j + 1]) / t.update_ratio_high))
            evidence = Evidence(f"{node.name}/update/l2÷value/l2", tuple(int(v) for v in steps[i:i + 3]),
                                tuple(float(v) for v in ratio[i:i + 3]))
            events.append(Event(FAMILY, node.name, "update", "stable", "unstable", int(steps[i]), int(steps[j]),
                                magnitude, strength(magnitude + t.enter_decades, t.enter_decades), (evidence,),
                                at_start=i < t.start_steps))
    return events


def _band_runs(ratio: np.ndarray, high: float, persist: int) -> list[tuple[int, int]]:
    """Index ranges where ``ratio`` stays above ``high`` for ``persist`` values in a row: measured values in a
    row where the updates were measured at some steps only (``shift.sparse_positions``)."""
    above = np.nan_to_num(ratio, nan=0.0) > high
    positions = sparse_positions(ratio)
    if positions is None:
        return runs(above, persist)
    return [(int(positions[i]), int(positions[j])) for i, j in runs(above[positions], persist)]


def cluster_events(series: RunSeries, updates: list[Event], thresholds: Thresholds = Thresholds()) -> list[Event]:
    """One ``optimizer`` event where enough parameter nodes became unstable at (nearly) the same step."""
    t = thresholds
    total = sum(1 for n in series.parameters if n.has("update"))
    unstable = sorted((e for e in updates if e.to_state == "unstable"), key=lambda e: e.onset)
    if not total or not unstable:
        return []
    out: list[Event] = []
    used: set[tuple] = set()
    for first in unstable:
        if first.key in used:
            continue
        group = [e for e in unstable if first.onset <= e.onset <= first.onset + t.optimizer_spread
                 and e.key not in used]
        nodes = {e.node for e in group}
        if len(nodes) / total < t.optimizer_share:
            continue
        used.update(e.key for e in group)
        magnitude = float(np.median([e.magnitude for e in group]))
        evidence = tuple(e.evidence[0] for e in group[:4])
        out.append(Event(FAMILY, OPTIMIZER, "update", "stable", "unstable", first.onset,
                         max(e.end for e in group), magnitude,
                         strength(magnitude * len(nodes) / total / t.optimizer_share, t.enter_decades), evidence,
                         at_start=all(e.at_start for e in group)))
    return out


def initial_loss(loss: np.ndarray, t: Thresholds = Thresholds()) -> float:
    """The loss of the untrained model: the median of the first ``start_steps`` finite losses (NaN if none)."""
    finite = np.asarray(loss, dtype=np.float64)
    finite = finite[np.isfinite(finite)][:t.start_steps]
    return float(np.median(finite)) if len(finite) else float("nan")


NOISY_DECADES = 0.3
"""A loss whose typical step (the median over the run) is this many decades (2×) off its recent median is too
noisy for one batch to stand out as a transient spike: with batches of 2 it is 0.34 and single steps reach 47×;
with the usual batches 0.01–0.15 (a loss near 0 of a learned task up to 0.25), where the spike factor decides."""


def loss_events(series: RunSeries, thresholds: Thresholds = Thresholds(), *, stop: int | None = None,
                settle: int = 0) -> list[Event]:
    """Transient spikes and divergence of the loss (finite values; non-finite ones are the nonfinite
    family's). They are ratios to the loss's recent median, which only mean something for a loss that stays
    positive: a loss that goes below 0 (a WGAN critic's difference of means, a Gaussian NLL, a log-likelihood
    with its sign lost) has none."""
    t = thresholds
    loss = np.asarray(series.loss[:stop], dtype=np.float64)
    loss = np.where(np.isfinite(loss), loss, np.nan)
    if not np.isfinite(loss).any() or np.nanmin(loss) < 0:
        return []
    steps = series.steps
    initial = initial_loss(loss, t)
    base = rolling_median(loss, t.window, t.min_history)
    with np.errstate(divide="ignore", invalid="ignore"):
        factor = loss / base
    factor[:settle] = np.nan
    out: list[Event] = []
    i, n = 0, len(loss)
    entry = min(t.spike_factor, t.jump_factor)
    with np.errstate(divide="ignore", invalid="ignore"):
        swing = np.abs(np.log10(factor[np.isfinite(factor) & (factor > 0)]))
    noisy = bool(len(swing) and np.median(swing) >= NOISY_DECADES)
    while i < n:
        if not (np.isfinite(factor[i]) and factor[i] >= entry and base[i] > 0):
            i += 1
            continue
        b = base[i]
        floor = b + t.harm_fraction * initial if np.isfinite(initial) else b  # a loss of 1e-7 rising to 1e-5: noise
        if factor[i] < t.spike_factor:  # short of a spike: only a lasting jump at once (from under 3×) counts
            before = factor[i - 1] if i > 0 else np.nan
            at_once = np.isfinite(before) and before < t.spike_recovery_factor
            jump = _lasting_jump(series, loss, i, b, floor, t) if at_once else None
            if jump is not None:
                out.append(jump)
                break
            i += 1
            continue
        after = loss[i:i + t.spike_recovery_steps + 1] / b
        back = np.flatnonzero((after < t.spike_recovery_factor) | (after * t.spike_factor <= factor[i]))
        if len(back) and noisy:  # a loss that swings 2× at a typical step: one batch 10× off is its noise
            i += 1
            continue
        evidence = Evidence("kpi/loss", tuple(int(v) for v in steps[i:i + 3]), tuple(float(v) for v in loss[i:i + 3]),
                            float(b))
        if len(back):
            end = i + int(back[0]) - 1
            magnitude = float(np.nanmax(loss[i:end + 1]) / b)
            if np.nanmax(loss[i:end + 1]) < t.spike_floor * initial:
                i = end + 1  # a noisy batch of a trained model, still better than the untrained model
                continue
            out.append(Event(FAMILY, "loss", "kpi", "stable", "spike", int(steps[i]), int(steps[end]),
                             magnitude, strength(np.log10(magnitude), np.log10(t.spike_factor)), (evidence,)))
            i = end + 1
            continue
        high = (np.nan_to_num(loss[i:] / b, nan=np.inf) >= t.divergence_factor) & (np.nan_to_num(loss[i:], nan=np.inf)
                                                                                   >= floor)
        diverged = runs(high, t.persist)
        if diverged:
            start = i + diverged[0][0]
            magnitude = float(np.nanmax(loss[i:]) / b)
            at_once = start == i or bool(loss[start - 1] < t.spike_factor * b)  # one step from normal to ≥ 100×
            out.append(Event(FAMILY, "loss", "kpi", "stable", "diverging", int(steps[start]), int(steps[n - 1]),
                             magnitude, strength(np.log10(magnitude), np.log10(t.divergence_factor)), (evidence,),
                             sudden=at_once))
            break
        jump = _lasting_jump(series, loss, i, b, floor, t)
        if jump is not None:
            out.append(jump)
            break
        i += 1
    return out


def _lasting_jump(series: RunSeries, loss: np.ndarray, i: int, base: float, floor: float,
                  t: Thresholds) -> Event | None:
    """A ``jumped`` event at index ``i`` when the loss stays ≥ ``spike_recovery_factor`` × ``base`` for the
    ``window`` steps from there, their median at or above ``floor``."""
    stay = loss[i:i + t.window]
    if not (len(stay) == t.window and np.isfinite(stay).all() and (stay >= t.spike_recovery_factor * base).all()
            and np.median(stay) >= floor):
        return None
    steps = series.steps
    magnitude = float(np.median(stay) / base)
    evidence = Evidence("kpi/loss", tuple(int(v) for v in steps[i:i + 3]), tuple(float(v) for v in loss[i:i + 3]),
                        float(base))
    return Event(FAMILY, "loss", "kpi", "stable", "jumped", int(steps[i]), int(steps[i + t.window - 1]),
                 magnitude, strength(np.log10(magnitude), np.log10(t.jump_factor)), (evidence,), sudden=True)

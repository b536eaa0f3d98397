"""What held in a healthy reference run, and where another run first breaks it — one pure rule per invariant.

Each rule has a ``learn_*`` function that reads the reference's :class:`RunFacts` and returns the
:class:`Invariant` objects that held there, per node and step type, and a ``check_*`` function that reads the
run under test and returns a :class:`Finding` at the first step where one is broken, with the evidence of
both runs. :mod:`~comgra_ndbg.analysis.reference` orchestrates them and words the findings.

Rules and what keeps them quiet on a healthy run that differs only in its seed:

- ``frozen`` / ``trains``: a parameter node that never changed in the reference (update l2 exactly 0, or
  its value summary identical at every step) must not change; one that changed at most steps must not stay
  unchanged for :attr:`ReferenceThresholds.persist` steps in a row while the loss is still far from 0.
- ``dtype``: the dtype each node was recorded in.
- ``input_range``: the rms and largest magnitude of each input stay within a factor
  :attr:`ReferenceThresholds.input_factor` of the reference's range over all its steps.
- ``grad_ratio`` / ``update_ratio``: each layer's gradient (update) l2 norm relative to the median layer's,
  and relative to the previous layer's, at the same step stays within :attr:`ReferenceThresholds.ratio_margin`
  decades of the reference's range,
  compared only at steps whose loss is above :attr:`ReferenceThresholds.converged` × the run's first loss
  (a converged run's gradients are noise), and only after :attr:`ReferenceThresholds.persist` steps in a row.
- ``mode``: the share of elements a ``Dropout`` node zeroes beyond its input's (about ``p`` in train mode,
  exactly 0 in eval mode) per step type.

>>> import numpy as np
>>> runs_of(np.array([True, False, True, True, True, False]), 3)
2
"""
from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from comgra_ndbg.analysis.events import Evidence
from comgra_ndbg.analysis.series import RunSeries
from comgra_ndbg.analysis.stagnation import same_summary

__all__ = ["RunFacts", "Invariant", "Finding", "ReferenceThresholds", "LEARNERS", "CHECKS", "runs_of",
           "active_steps"]


@dataclass(frozen=True)
class RunFacts:
    """One run as the reference comparison reads it: its series, the step type of each of its steps (aligned
    with ``series.steps``), the shapes of each parameter node's tensors, and where it was read from."""

    series: RunSeries
    step_types: tuple[str, ...] = ()
    shapes: Mapping[str, tuple[tuple[int, ...], ...]] | None = None
    source: str = ""

    def types(self) -> np.ndarray:
        """The step type of every step (``""`` where unknown)."""
        if len(self.step_types) == len(self.series.steps):
            return np.array(self.step_types, dtype=object)
        return np.full(len(self.series.steps), "", dtype=object)


@dataclass(frozen=True)
class ReferenceThresholds:
    """Parameters of the reference rules; pass a modified copy (``dataclasses.replace``)."""

    converged: float = 1e-3  # ratio rules compare only while loss > converged × the first loss
    persist: int = 3  # consecutive compared steps a dynamic violation must last
    min_steps: int = 3  # reference steps of a step type needed to learn anything about it
    trains_share: float = 0.5  # a node changed at this share of the reference's steps trains
    input_factor: float = 10.0  # input rms or magnitude this far outside the reference's range
    ratio_margin: float = 1.0  # decades beyond the reference's range of a relative norm
    ratio_min_steps: int = 5  # compared reference steps needed to learn a relative norm's range
    drop_min: float = 0.03  # a Dropout zeroing at least this share beyond its input runs in train mode
    drop_fall: float = 3.0  # ... and in eval mode when its share falls below its reference median / this


@dataclass(frozen=True)
class Invariant:
    """Something that held in the reference: ``rule`` on ``node`` for steps of ``step_type``, with numeric
    bounds ``low``–``high`` or a ``value`` (a dtype, a mode), and the reference's evidence."""

    rule: str
    node: str
    step_type: str
    low: float = float("nan")
    high: float = float("nan")
    value: str = ""
    evidence: tuple[Evidence, ...] = ()


@dataclass(frozen=True)
class Finding:
    """An invariant broken at ``onset`` (the first step), with the evidence of both runs; ``measured`` is the
    run's value at the onset (``measured_text`` for a dtype or a mode), ``magnitude`` how far it is outside."""

    invariant: Invariant
    onset: int
    measured: float
    magnitude: float
    evidence: tuple[Evidence, ...]
    measured_text: str = ""
    others: tuple[str, ...] = ()  # further nodes breaking the same rule


def runs_of(mask: np.ndarray, length: int) -> int:
    """Index of the first of ``length`` True values in a row (the earliest such run); -1 when there is none."""
    run = 0
    for i, value in enumerate(mask):
        run = run + 1 if value else 0
        if run == length:
            return i - length + 1
    return -1


def active_steps(series: RunSeries, converged: float) -> np.ndarray:
    """Steps whose loss is above ``converged`` × the first finite loss (all steps when no loss is known)."""
    loss = np.abs(series.loss)
    finite = np.flatnonzero(np.isfinite(loss))
    if not len(finite):
        return np.ones(len(series.steps), bool)
    return np.isfinite(loss) & (loss > converged * loss[finite[0]])


def _stat(series: RunSeries, node: str, kind: str, stat: str) -> np.ndarray | None:
    try:
        found = series.node(node)
    except KeyError:
        return None
    return found.stats[kind][stat] if kind in found.stats else None


def _evidence(label: str, series: RunSeries, values: np.ndarray, where: np.ndarray, limit: int = 5) -> Evidence:
    picked = np.flatnonzero(where)[:limit]
    return Evidence(label, tuple(int(series.steps[i]) for i in picked), tuple(float(values[i]) for i in picked))


# ---- which parameters change ----------------------------------------------------------------------------------
def changes(series: RunSeries, node: str) -> tuple[np.ndarray, np.ndarray]:
    """``(known, changed)`` per step of a parameter node: from its update l2 where recorded (> 0: changed),
    else from its value summary at the next recorded step (values are recorded before the step's update; any
    difference: changed)."""
    n = len(series.steps)
    known, changed = np.zeros(n, bool), np.zeros(n, bool)
    update = _stat(series, node, "update", "l2")
    if update is not None:
        known = np.isfinite(update)
        changed = known & (update > 0)
    value = series.node(node).stats.get("value") if _stat(series, node, "value", "l2") is not None else None
    if value is not None:
        present = np.flatnonzero(np.isfinite(value["l2"]) & np.isfinite(value["min"]) & np.isfinite(value["max"]))
        for at, after in zip(present[:-1], present[1:]):  # a value is recorded before its step's update
            if not known[at]:
                known[at] = True
                changed[at] = not bool(same_summary(value, np.array([at]), np.array([after]))[0])
    return known, changed


def learn_changes(facts: RunFacts, t: ReferenceThresholds) -> list[Invariant]:
    series, types = facts.series, facts.types()
    out = []
    for node in series.parameters:
        known, changed = changes(series, node.name)
        for step_type in dict.fromkeys(types):
            seen = known & (types == step_type)
            if seen.sum() < t.min_steps:
                continue
            share = float(changed[seen].mean())
            label = f"reference:{node.name}/{'update' if node.has('update') else 'value'}/changed"
            evidence = (_evidence(label, series, changed.astype(float), seen),)
            if share == 0.0:
                out.append(Invariant("frozen", node.name, step_type, 0.0, 0.0, "", evidence))
            elif share >= t.trains_share:
                out.append(Invariant("trains", node.name, step_type, share, 1.0, "", evidence))
    return out


def check_frozen(inv: Invariant, facts: RunFacts, t: ReferenceThresholds) -> Finding | None:
    known, changed = changes(facts.series, inv.node)
    hit = np.flatnonzero(known & changed & (facts.types() == inv.step_type))
    if not len(hit):
        return None
    update = _stat(facts.series, inv.node, "update", "l2")
    value = float(update[hit[0]]) if update is not None and np.isfinite(update[hit[0]]) else float("nan")
    evidence = inv.evidence + ((_evidence(f"{inv.node}/update/l2", facts.series, update, known & changed)
                                if update is not None else
                                _evidence(f"{inv.node}/value/changed", facts.series, changed.astype(float), changed)),)
    return Finding(inv, int(facts.series.steps[hit[0]]), value, 1.0, evidence)


def check_trains(inv: Invariant, facts: RunFacts, t: ReferenceThresholds) -> Finding | None:
    known, changed = changes(facts.series, inv.node)
    where = known & (facts.types() == inv.step_type) & active_steps(facts.series, t.converged)
    positions = np.flatnonzero(where)
    start = runs_of(~changed[positions], t.persist)
    if start < 0:
        return None
    first = positions[start]
    still = ~changed[positions[start:]]
    stopped = int(np.argmin(still)) if not still.all() else len(still)
    evidence = inv.evidence + (_evidence(f"{inv.node}/changed", facts.series, changed.astype(float),
                                         np.isin(np.arange(len(changed)), positions[start:start + 5])),)
    return Finding(inv, int(facts.series.steps[first]), 0.0, float(stopped), evidence)


# ---- dtypes ---------------------------------------------------------------------------------------------------
def learn_dtypes(facts: RunFacts, t: ReferenceThresholds) -> list[Invariant]:
    series = facts.series
    return [Invariant("dtype", n.name, "", value=series.node_info(n.name).dtype)
            for n in series.nodes if series.node_info(n.name).dtype]


def check_dtype(inv: Invariant, facts: RunFacts, t: ReferenceThresholds) -> Finding | None:
    series = facts.series
    if inv.node not in {n.name for n in series.nodes}:
        return None
    dtype = series.node_info(inv.node).dtype
    if not dtype or dtype == inv.value:
        return None
    onset = int(series.steps[0]) if len(series.steps) else 0
    return Finding(inv, onset, float("nan"), 1.0, (), dtype)


# ---- the range of the inputs ------------------------------------------------------------------------------------
def learn_inputs(facts: RunFacts, t: ReferenceThresholds) -> list[Invariant]:
    series, types = facts.series, facts.types()
    out = []
    for node in series.nodes:
        if node.role != "input" or not node.has("value"):
            continue
        rms, top = node.stats["value"]["rms"], node.stats["value"]["abs_max"]
        for step_type in dict.fromkeys(types):
            seen = (types == step_type) & np.isfinite(rms) & np.isfinite(top)
            if seen.sum() < t.min_steps:
                continue
            out.append(Invariant("input_range", node.name, step_type, float(rms[seen].min()),
                                 float(rms[seen].max()), str(float(top[seen].max())),
                                 (_evidence(f"reference:{node.name}/value/rms", series, rms, seen),)))
    return out


def check_input(inv: Invariant, facts: RunFacts, t: ReferenceThresholds) -> Finding | None:
    rms = _stat(facts.series, inv.node, "value", "rms")
    top = _stat(facts.series, inv.node, "value", "abs_max")
    if rms is None or top is None:
        return None
    f, top_ref = t.input_factor, float(inv.value)
    with np.errstate(invalid="ignore"):
        outside = ((rms > inv.high * f) | (rms < inv.low / f) | (top > top_ref * f)) & np.isfinite(rms)
    outside &= facts.types() == inv.step_type
    hit = np.flatnonzero(outside)
    if not len(hit):
        return None
    value = float(rms[hit[0]])
    factor = value / inv.high if value > inv.high else inv.low / max(value, 1e-300)
    return Finding(inv, int(facts.series.steps[hit[0]]), value, float(np.log10(max(factor, 1.0))),
                   inv.evidence + (_evidence(f"{inv.node}/value/rms", facts.series, rms, outside),),
                   f"abs max {float(top[hit[0]]):.3g}")


# ---- gradient and update norms between layers -------------------------------------------------------------------
def log_norms(series: RunSeries, kind: str, nodes: list[str]) -> np.ndarray:
    """``[nodes, steps]``: log10 of each node's ``kind`` l2 norm (NaN where missing, zero or non-finite)."""
    rows = []
    for name in nodes:
        l2 = _stat(series, name, kind, "l2")
        with np.errstate(divide="ignore", invalid="ignore"):
            rows.append(np.where((l2 > 0) & np.isfinite(l2), np.log10(np.where(l2 > 0, l2, 1.0)), np.nan)
                        if l2 is not None else np.full(len(series.steps), np.nan))
    return np.array(rows) if rows else np.zeros((0, len(series.steps)))


def relative_norms(series: RunSeries, kind: str, nodes: list[str]) -> dict[tuple[str, str], np.ndarray]:
    """Per ``(node, against)``: log10 of the node's ``kind`` l2 norm over the median layer's (``against`` is
    ``""``) and over the previous node in ``nodes`` (``against`` names it) — a fault in one layer moves its
    ratio to the median; a fault that moves a whole half of the layers moves the ratio at the boundary."""
    logs = log_norms(series, kind, nodes)
    if not len(logs):
        return {}
    with warnings.catch_warnings():  # a step where no node has a norm: an all-NaN column, NaN is right there
        warnings.simplefilter("ignore", RuntimeWarning)
        median = np.nanmedian(logs, axis=0)
    out = {(name, ""): logs[i] - median for i, name in enumerate(nodes)}
    for i in range(1, len(nodes)):
        out[(nodes[i], nodes[i - 1])] = logs[i] - logs[i - 1]
    return out


def _ratio_nodes(facts: RunFacts, kind: str, common: frozenset[str] | None) -> list[str]:
    names = [n.name for n in facts.series.parameters if n.has(kind)]
    return [n for n in names if common is None or n in common]


def _ratio_label(kind: str, node: str, against: str) -> str:
    return f"{node}/{kind}/l2 over {repr(against) if against else 'the median layer'}'s (log10)"


def learn_ratios(facts: RunFacts, t: ReferenceThresholds, kind: str, common: frozenset[str] | None = None
                 ) -> list[Invariant]:
    nodes = _ratio_nodes(facts, kind, common)
    if len(nodes) < 2:
        return []
    types, active = facts.types(), active_steps(facts.series, t.converged)
    out = []
    for (name, against), row in relative_norms(facts.series, kind, nodes).items():
        for step_type in dict.fromkeys(types):
            seen = (types == step_type) & active & np.isfinite(row)
            if seen.sum() < t.ratio_min_steps:
                continue
            out.append(Invariant(f"{kind}_ratio", name, step_type, float(row[seen].min()), float(row[seen].max()),
                                 against, (_evidence("reference:" + _ratio_label(kind, name, against), facts.series,
                                                     row, seen),)))
    return out


def check_ratios(invariants: list[Invariant], facts: RunFacts, t: ReferenceThresholds, kind: str
                 ) -> Finding | None:
    """The first step where a layer's norm ratio has been outside its reference band (widened by
    ``ratio_margin`` decades) for ``persist`` compared steps in a row (ties: see :func:`_rank`)."""
    nodes = list(dict.fromkeys(inv.node for inv in invariants if not inv.value))
    if len(nodes) < 2:
        return None
    rows = relative_norms(facts.series, kind, nodes)
    types, active = facts.types(), active_steps(facts.series, t.converged)
    best: Finding | None = None
    for inv in invariants:
        row = rows.get((inv.node, inv.value))
        if row is None:
            continue
        where = np.flatnonzero((types == inv.step_type) & active & np.isfinite(row))
        excess = np.maximum(row[where] - (inv.high + t.ratio_margin), (inv.low - t.ratio_margin) - row[where])
        start = runs_of(excess > 0, t.persist)
        if start < 0:
            continue
        at = where[start]
        shown = np.isin(np.arange(len(row)), where[start:start + 5])
        finding = Finding(inv, int(facts.series.steps[at]), float(row[at]), float(excess[start] + t.ratio_margin),
                          inv.evidence + (_evidence(_ratio_label(kind, inv.node, inv.value), facts.series, row,
                                                    shown),))
        if best is None or _rank(finding) < _rank(best):
            best = finding
    return best


def _rank(finding: Finding) -> tuple[int, bool, float]:
    """Earliest first; at one step a layer against the median (it names the layer) before a neighbour pair."""
    return finding.onset, bool(finding.invariant.value), -finding.magnitude


# ---- train / eval mode ------------------------------------------------------------------------------------------
def drop_share(series: RunSeries, node: str) -> np.ndarray | None:
    """Share of elements a Dropout node zeroes beyond its input's, per step (None: not a Dropout node with a
    recorded input)."""
    if "Dropout" not in series.node_info(node).module_type or series.graph is None:
        return None
    roles = {n.name: n.role for n in series.nodes}
    parents = [e.source for e in series.graph.edges if e.target == node and e.source != node
               and e.kind != "iteration" and roles.get(e.source) not in (None, "parameter")]
    out = _stat(series, node, "value", "zero_fraction")
    for parent in parents:
        before = _stat(series, parent, "value", "zero_fraction")
        if before is not None and out is not None:
            return out - before
    return None


def learn_modes(facts: RunFacts, t: ReferenceThresholds) -> list[Invariant]:
    series, types = facts.series, facts.types()
    out = []
    for node in series.nodes:
        share = drop_share(series, node.name)
        if share is None:
            continue
        for step_type in dict.fromkeys(types):
            seen = (types == step_type) & np.isfinite(share)
            if seen.sum() < t.min_steps:
                continue
            median = float(np.median(share[seen]))
            evidence = (_evidence(f"reference:{node.name}/value/zero_fraction beyond its input", series, share, seen),)
            if median >= t.drop_min:
                out.append(Invariant("mode", node.name, step_type, median, median, "train", evidence))
            elif float(np.abs(share[seen]).max()) == 0.0:
                out.append(Invariant("mode", node.name, step_type, 0.0, 0.0, "eval", evidence))
    return out


def check_mode(inv: Invariant, facts: RunFacts, t: ReferenceThresholds) -> Finding | None:
    share = drop_share(facts.series, inv.node)
    if share is None:
        return None
    where = np.flatnonzero((facts.types() == inv.step_type) & np.isfinite(share))
    wrong = share[where] < inv.low / t.drop_fall if inv.value == "train" else share[where] >= t.drop_min
    start = runs_of(wrong, t.persist)
    if start < 0:
        return None
    at = where[start]
    return Finding(inv, int(facts.series.steps[at]), float(share[at]), 1.0,
                   inv.evidence + (_evidence(f"{inv.node}/value/zero_fraction beyond its input", facts.series, share,
                                             np.isin(np.arange(len(share)), where[start:start + 5])),),
                   "eval" if inv.value == "train" else "train")


LEARNERS = (learn_changes, learn_dtypes, learn_inputs, learn_modes)
"""Learners of the per-node rules; the ratio rules are learnt on the nodes both runs share."""
CHECKS = {"frozen": check_frozen, "trains": check_trains, "dtype": check_dtype, "input_range": check_input,
          "mode": check_mode}
"""The check of each per-node rule."""

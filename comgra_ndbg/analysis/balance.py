"""Imbalanced learning: one of two parallel paths' gradients or updates come to dwarf the other's.

Two paths are *parallel* when they meet in one node and each has parameters of its own: the towers of a
two-input model, the branches of a multi-branch block, two heads on one trunk. A residual connection is not
a pair (its skip path has no parameters of its own). For each pair the analysis follows the ratio of the
paths' gradient norms (every parameter node of a path, summed in squares) and of their update/weight
ratios; when one of these ratios shifts by ``imbalance_decades`` against its recent history and stays there
for ``imbalance_steps`` steps, one path has come to dominate: an ``imbalanced`` event whose node is the
output of the path that moved (the one whose own norm shifted more against its history).
Paths of different but steady scale — a wide and a narrow tower — never shift and raise nothing.

>>> from comgra_ndbg.graph.model import DependencyGraph, GraphEdge, GraphNode
>>> n = lambda name, param=False: GraphNode(name, "parameter" if param else "intermediate", "", (name,), param)
>>> g = DependencyGraph((n("x"), n("a"), n("b"), n("sum"), n("pa", True), n("pb", True)),
...                     tuple(GraphEdge(s, t, "forward") for s, t in
...                           (("x", "a"), ("x", "b"), ("pa", "a"), ("pb", "b"), ("a", "sum"), ("b", "sum"))))
>>> [(p.merge, p.paths) for p in parallel_paths(g)]
[('sum', (('a', ('pa',)), ('b', ('pb',))))]
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

import numpy as np

from comgra_ndbg.analysis.config import Thresholds
from comgra_ndbg.analysis.events import Event, Evidence
from comgra_ndbg.analysis.series import RunSeries
from comgra_ndbg.analysis.shift import log_level, measured_shifts, strength
from comgra_ndbg.graph.model import LAYERING_KINDS, DependencyGraph

__all__ = ["ParallelPaths", "parallel_paths", "path_members", "balance_events", "FAMILY"]

FAMILY = "path_balance"


@dataclass(frozen=True)
class ParallelPaths:
    """Paths that meet in ``merge``: each is ``(the node that enters the merge, its own parameter nodes)``."""

    merge: str
    paths: tuple[tuple[str, tuple[str, ...]], ...]


def _ancestors(graph: DependencyGraph) -> dict[str, frozenset[str]]:
    parents: dict[str, set[str]] = {name: set() for name in graph.node_names}
    for e in graph.edges:
        if e.kind in LAYERING_KINDS and e.source != e.target:
            parents[e.target].add(e.source)
    out: dict[str, frozenset[str]] = {}

    def visit(name: str) -> frozenset[str]:
        if name not in out:
            out[name] = frozenset()  # a cycle (none in a forward graph) ends here
            found: set[str] = set()
            for parent in parents[name]:
                found |= {parent} | visit(parent)
            out[name] = frozenset(found)
        return out[name]

    for name in graph.node_names:
        visit(name)
    return out


def path_members(graph: DependencyGraph | None, entry: str) -> frozenset[str]:
    """Every node (parameters included) that only the path entering its merge through ``entry`` holds,
    ``entry`` included; empty when ``entry`` begins no parallel path."""
    if graph is None:
        return frozenset()
    ancestors = _ancestors(graph)
    for group in parallel_paths(graph):
        entries = [p for p, _ in group.paths]
        if entry in entries:
            computed = sorted({e.source for e in graph.edges if e.target == group.merge and e.source != group.merge
                               and e.kind in LAYERING_KINDS})
            others = set().union(*(ancestors[q] | {q} for q in computed if q != entry))
            return frozenset((ancestors[entry] | {entry}) - others)
    return frozenset()


def parallel_paths(graph: DependencyGraph | None) -> list[ParallelPaths]:
    """Every node where at least two paths with parameters of their own meet (see the module docstring)."""
    if graph is None:
        return []
    ancestors = _ancestors(graph)
    parameters = {n.name for n in graph.nodes if n.is_parameter_group}
    out = []
    for node in graph.node_names:
        computed = sorted({e.source for e in graph.edges if e.target == node and e.kind in LAYERING_KINDS
                           and e.source != node and e.source not in parameters})
        if len(computed) < 2:
            continue
        reach = {p: ancestors[p] | {p} for p in computed}
        paths = []
        for p in computed:
            others = set().union(*(reach[q] for q in computed if q != p))
            own = tuple(sorted((reach[p] - others) & parameters))
            if own:
                paths.append((p, own))
        if len(paths) >= 2:
            out.append(ParallelPaths(node, tuple(paths)))
    return out


def _norm(series: RunSeries, nodes: tuple[str, ...], kind: str) -> np.ndarray:
    squares = [series.node(n).stats[kind]["l2"] ** 2 for n in nodes if series.node(n).has(kind)]
    if not squares:
        return np.full(len(series.steps), np.nan)
    return np.sqrt(np.stack(squares).sum(axis=0))


def _measures(series: RunSeries, nodes: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Per path: its gradient norm and its update/weight ratio (norms over its parameter nodes)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return {"grad": _norm(series, nodes, "grad"),
                "update": _norm(series, nodes, "update") / _norm(series, nodes, "value")}


def balance_events(series: RunSeries, thresholds: Thresholds = Thresholds(), *, stop: int | None = None,
                   settle: int = 0) -> list[Event]:
    """One ``imbalanced`` event per pair of parallel paths whose gradient or update ratio shifted lastingly."""
    t = thresholds
    known = {n.name for n in series.nodes}
    events: list[Event] = []
    for group in parallel_paths(series.graph):
        paths = [(p, tuple(n for n in own if n in known)) for p, own in group.paths]
        measures = {p: _measures(series, own) for p, own in paths if own}
        for (a, ma), (b, mb) in combinations(measures.items(), 2):
            for kind in ("grad", "update"):
                ratio = (log_level(ma[kind]) - log_level(mb[kind]))[:stop]
                ratio[:settle] = np.nan
                for s in measured_shifts(ratio, window=t.window, min_history=t.min_history,
                                         enter=t.imbalance_decades, exit=t.imbalance_decades / 2, persist=t.persist):
                    if s.end - s.start + 1 < t.imbalance_steps and not s.censored:
                        continue
                    moved = _moved(series, {a: ma[kind], b: mb[kind]}, s.start, t.window)
                    window = slice(s.start, min(s.start + 3, len(ratio)))
                    evidence = Evidence(f"{a}/{kind}/l2÷{b}/{kind}/l2", tuple(int(v) for v in series.steps[window]),
                                        tuple(float(10 ** v) for v in ratio[window]), float(10 ** s.baseline))
                    events.append(Event(FAMILY, moved, kind, "balanced", "imbalanced", int(series.steps[s.start]),
                                        int(series.steps[s.end]), s.peak, strength(s.peak, t.imbalance_decades),
                                        (evidence,), sudden=bool(s.jump >= t.sudden_fraction * t.imbalance_decades)))
    return events


def _moved(series: RunSeries, norms: dict[str, np.ndarray], i: int, window: int) -> str:
    """The path whose own norm moved more (in decades, medians of ``window`` steps) across index ``i``."""
    def shift(values: np.ndarray) -> float:
        x = log_level(values)
        before, after = x[max(0, i - window):i], x[i:i + window]
        if not np.isfinite(before).any() or not np.isfinite(after).any():
            return 0.0
        return abs(float(np.nanmedian(after) - np.nanmedian(before)))
    return max(norms, key=lambda name: shift(norms[name]))

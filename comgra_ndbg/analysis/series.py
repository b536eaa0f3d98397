"""``RunSeries``: the recorded summaries of one run as aligned arrays, in forward order of the graph.

Built by :func:`build_series` from plain arrays (what the reader returns), so every detector works on one
value object and never touches a file. Node-level rows merge the node's tensors (a Linear's weight and
bias) by the sufficient-statistic merge, then every statistic of :mod:`comgra_ndbg.stats.statistics` is derived.

>>> import numpy as np
>>> from comgra_ndbg.store.schema import FIELD, identity_row
>>> rows = np.stack([identity_row(), identity_row()])
>>> rows[:, FIELD["count"]], rows[:, FIELD["sum_sq"]] = 4, [4.0, 16.0]
>>> s = build_series({("h", "value"): (np.array([0, 1]), rows)}, roles={"h": "intermediate"}, kpis={})
>>> s.get("h", "value", "rms").tolist()
[1.0, 2.0]
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from comgra_ndbg.errors import UnknownSeriesError
from comgra_ndbg.graph.model import LAYERING_KINDS, PARAMETER_ROLE, DependencyGraph
from comgra_ndbg.analysis.structure import NodeInfo
from comgra_ndbg.analysis.shift import log_level
from comgra_ndbg.stats.statistics import derive, derive_one, merge_rows
from comgra_ndbg.store.schema import FIELD, NUM_FIELDS, identity_row

__all__ = ["NodeSeries", "RunSeries", "build_series", "forward_order", "hold_rows", "jumps"]

Rows = tuple[np.ndarray, np.ndarray]  # (steps [n], rows [n, NUM_FIELDS])
_COUNT, _NAN, _INF = FIELD["count"], FIELD["nan"], FIELD["inf"]


@dataclass(frozen=True)
class NodeSeries:
    """One node: its role, its position in forward order, and ``stats[kind][statistic]`` aligned with the
    run's steps (NaN where the kind was not recorded at a step)."""

    name: str
    role: str
    order: int
    stats: Mapping[str, Mapping[str, np.ndarray]]

    @property
    def is_parameter(self) -> bool:
        return self.role == PARAMETER_ROLE

    def has(self, kind: str) -> bool:
        return kind in self.stats


@dataclass(frozen=True)
class RunSeries:
    """Aligned series of one run: ``steps`` sorted, ``nodes`` in forward order, ``kpis`` aligned with
    ``steps`` (NaN where a KPI was not recorded), and the dependency ``graph`` when one was recorded."""

    steps: np.ndarray
    nodes: tuple[NodeSeries, ...]
    kpis: Mapping[str, np.ndarray]
    graph: DependencyGraph | None = None
    trial: str = ""
    kpi_present: Mapping[str, np.ndarray] | None = None  # per KPI: True at steps where it was recorded
    info: Mapping[str, NodeInfo] | None = None  # per node: module class, shape, parameter ranks
    loop: Any = None  # invariants.LoopFacts: the invariant log, input and target rows (None: not loaded)
    # per prediction node: the lowest and the highest gradient mean ÷ rms of one forward pass of each step
    # (aligned with steps; NaN where a step ran one pass), which tells passes pulling opposite ways apart
    pass_push: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None
    step_types: np.ndarray | None = None  # each step's type name, aligned with steps (None: not loaded)

    def node_info(self, name: str) -> NodeInfo:
        """What the recording says about node ``name`` besides its series (empty when nothing)."""
        return (self.info or {}).get(name, NodeInfo())

    def kpi_recorded(self, name: str) -> np.ndarray:
        """Where KPI ``name`` was recorded (a recorded NaN is a non-finite value, an absent one is not)."""
        if self.kpi_present is not None and name in self.kpi_present:
            return self.kpi_present[name]
        return np.isfinite(self.kpi(name))

    def node(self, name: str) -> NodeSeries:
        for node in self.nodes:
            if node.name == name:
                return node
        raise UnknownSeriesError(f"no node {name!r} in the run; nodes are {[n.name for n in self.nodes]}")

    def get(self, node: str, kind: str, stat: str) -> np.ndarray:
        """Values of one statistic of one node and kind, aligned with :attr:`steps`."""
        found = self.node(node)
        if kind not in found.stats:
            raise UnknownSeriesError(f"node {node!r} has no kind {kind!r}; it has {sorted(found.stats)}")
        if stat not in found.stats[kind]:
            raise UnknownSeriesError(f"unknown statistic {stat!r}; choose one of {sorted(found.stats[kind])}")
        return found.stats[kind][stat]

    def kpi(self, name: str) -> np.ndarray:
        if name not in self.kpis:
            raise UnknownSeriesError(f"no KPI {name!r}; KPIs are {sorted(self.kpis)}")
        return self.kpis[name]

    @property
    def loss(self) -> np.ndarray:
        """The loss per step: the KPI ``loss`` if recorded, else the mean value of the loss-role node, else
        all NaN."""
        if "loss" in self.kpis:
            return self.kpis["loss"]
        for node in self.nodes:
            if node.role == "loss" and node.has("value"):
                return node.stats["value"]["mean"]
        return np.full(len(self.steps), np.nan)

    @property
    def parameters(self) -> tuple[NodeSeries, ...]:
        return tuple(n for n in self.nodes if n.is_parameter)

    @property
    def activations(self) -> tuple[NodeSeries, ...]:
        """Nodes computed in the forward pass (not parameters, not targets, not the loss)."""
        return tuple(n for n in self.nodes if n.role in ("input", "intermediate", "output"))

    def index(self, step: int) -> int:
        """Position of ``step`` in :attr:`steps`."""
        i = int(np.searchsorted(self.steps, step))
        if i >= len(self.steps) or self.steps[i] != step:
            raise UnknownSeriesError(f"step {step} is not among the analysed steps "
                                     f"({self.steps[0] if len(self.steps) else '-'}…"
                                     f"{self.steps[-1] if len(self.steps) else '-'})")
        return i


def forward_order(names: list[str], roles: Mapping[str, str], graph: DependencyGraph | None) -> list[str]:
    """Nodes in forward order: inputs first, then a topological order of the computed nodes (ties keep
    ``names`` order), each parameter node just before the first node that consumes it.

    >>> from comgra_ndbg.graph.model import DependencyGraph, GraphEdge, GraphNode
    >>> node = lambda n, r: GraphNode(n, r, "", (n,), r == "parameter")
    >>> g = DependencyGraph((node("b", "intermediate"), node("a", "intermediate"), node("w", "parameter")),
    ...                     (GraphEdge("a", "b", "forward"), GraphEdge("w", "b", "forward")))
    >>> forward_order(["w", "b", "a", "x"], {"w": "parameter", "a": "intermediate", "b": "intermediate",
    ...                                      "x": "input"}, g)
    ['x', 'a', 'w', 'b']
    """
    position = {n: i for i, n in enumerate(names)}
    computed = [n for n in names if roles.get(n) != PARAMETER_ROLE]
    edges = [] if graph is None else [(e.source, e.target) for e in graph.edges
                                      if e.kind in LAYERING_KINDS and e.source != e.target]
    computed_set = set(computed)
    indegree = {n: 0 for n in computed}
    for s, t in edges:
        if s in computed_set and t in computed_set:
            indegree[t] += 1
    ready = sorted((n for n in computed if indegree[n] == 0),
                   key=lambda n: (roles.get(n) != "input", position[n]))
    ordered: list[str] = []
    while ready:
        current = ready.pop(0)
        ordered.append(current)
        for s, t in edges:
            if s == current and t in computed_set:
                indegree[t] -= 1
                if indegree[t] == 0:
                    ready.append(t)
                    ready.sort(key=lambda n: (roles.get(n) != "input", position[n]))
    ordered += [n for n in computed if n not in ordered]  # cycles (none in a forward graph)
    rank = {n: float(i) for i, n in enumerate(ordered)}
    for n in names:
        if roles.get(n) == PARAMETER_ROLE:
            consumers = [rank[t] for s, t in edges if s == n and t in rank]
            rank[n] = (min(consumers) if consumers else len(ordered)) - 0.5 + position[n] * 1e-6
    return sorted(names, key=lambda n: rank[n])


def build_series(rows: Mapping[tuple[str, str], Rows], *, roles: Mapping[str, str],
                 kpis: Mapping[str, tuple[np.ndarray, np.ndarray]], graph: DependencyGraph | None = None,
                 trial: str = "", node_order: list[str] | None = None,
                 info: Mapping[str, NodeInfo] | None = None, loop: Any = None,
                 held: np.ndarray | None = None, moved: np.ndarray | None = None) -> RunSeries:
    """Align node-level summary rows on the union of their steps and derive every statistic.

    ``rows`` maps ``(node, kind)`` to ``(steps, rows)``; several entries for one node (its tensors) may be
    passed as a list of such pairs under one key. ``roles`` maps node -> role. ``kpis`` maps name ->
    ``(steps, values)``. ``info`` maps node -> :class:`~comgra_ndbg.analysis.structure.NodeInfo`. ``loop``
    is what the loop-invariant analysis reads besides (:class:`~comgra_ndbg.analysis.invariants.LoopFacts`).
    ``held`` are sentinel steps (``recorder/sentinel_steps.py``), where only parameters, inputs and KPIs
    were recorded, ``moved`` those of them whose rows moved the tiers: at sentinel steps an absent value
    series (a module output) and every gradient series — the parameters' too, so that gradients relative
    to the output's compare rows of one kind — are read from the steps recorded in full around them
    (:func:`hold_rows`); parameter values and inputs are read as recorded, updates as measured (their rules
    read sparse series).
    """
    all_steps = [np.asarray(s, dtype=np.int64) for entry in rows.values() for s, _ in _pairs(entry)]
    all_steps += [np.asarray(s, dtype=np.int64) for s, _ in kpis.values()]
    steps = np.unique(np.concatenate(all_steps)) if all_steps else np.zeros(0, np.int64)
    per_node: dict[str, dict[str, Mapping[str, np.ndarray]]] = {}
    for (node, kind), entry in rows.items():
        aligned = []
        for s, r in _pairs(entry):
            full = np.tile(identity_row(), (len(steps), 1))
            if len(s):
                full[np.searchsorted(steps, np.asarray(s, dtype=np.int64))] = np.asarray(r, dtype=np.float64)
            aligned.append(full)
        merged = aligned[0] if len(aligned) == 1 else merge_rows(np.stack(aligned), axis=0)
        if held is not None and len(held) and kind != "update":
            merged = hold_rows(merged, np.isin(steps, held), every=kind == "grad", steps=steps,
                               moved=None if moved is None else np.isin(steps, moved))
        per_node.setdefault(node, {})[kind] = derive(merged)
    names = node_order or list(dict.fromkeys([n for n, _ in rows] + list(roles)))
    names = [n for n in names if n in per_node]
    order = forward_order(names, roles, graph)
    nodes = tuple(NodeSeries(n, roles.get(n, "intermediate"), i, per_node[n]) for i, n in enumerate(order))
    aligned_kpis, present = {}, {}
    for name, (s, v) in kpis.items():
        values, mask = np.full(len(steps), np.nan), np.zeros(len(steps), bool)
        where = np.searchsorted(steps, np.asarray(s, dtype=np.int64))
        values[where], mask[where] = np.asarray(v, dtype=np.float64), True
        aligned_kpis[name], present[name] = values, mask
    return RunSeries(steps, nodes, aligned_kpis, graph, trial, present, dict(info or {}), loop)


def hold_rows(rows: np.ndarray, held: np.ndarray, *, every: bool = False, steps: np.ndarray | None = None,
              moved: np.ndarray | None = None) -> np.ndarray:
    """``rows`` with each absent row at a ``held`` position filled in from the rows measured around it, at
    positions not held: ``every`` fills the rows present at held positions too, except one that counts
    non-finite elements (a gradient that turned NaN or Inf at a sentinel step is a fact of that step, which
    the measurements around it would move to the next one). Between two measurements
    with no ``moved`` position after the first up to the second (a sentinel step whose rows moved, or a step
    the tiers measured because something moved), the statistic changed slowly enough for the sentinels to
    stay quiet: it is interpolated linearly in ``steps`` (non-finite counts held); after the last
    measurement, or up to a moved position, the last measured row is held, so a change begins where it was
    first measured. Rows before the first measurement stay as they are.

    >>> rows = np.zeros((5, NUM_FIELDS)); rows[[0, 3, 4], FIELD["count"]] = 4; rows[[3, 4], FIELD["sum"]] = 6, 9
    >>> held, steps = np.array([False, True, True, False, True]), np.arange(5)
    >>> hold_rows(rows, held)[:, FIELD["count"]].tolist(), hold_rows(rows, held)[:, FIELD["sum"]].tolist()
    ([4.0, 4.0, 4.0, 4.0, 4.0], [0.0, 0.0, 0.0, 6.0, 9.0])
    >>> hold_rows(rows, held, steps=steps)[:, FIELD["sum"]].tolist()
    [0.0, 2.0, 4.0, 6.0, 9.0]
    >>> hold_rows(rows, held, every=True, steps=steps, moved=np.array([False, False, False, True, False]))[
    ...     :, FIELD["sum"]].tolist()
    [0.0, 0.0, 0.0, 6.0, 6.0]
    >>> rows[2, [FIELD["count"], FIELD["nan"]]] = 4, 1  # recorded non-finite at a held step: kept as recorded
    >>> hold_rows(rows, held, every=True)[:, FIELD["nan"]].tolist()
    [0.0, 0.0, 1.0, 0.0, 0.0]
    """
    present = rows[:, _COUNT] > 0
    finite = rows[:, _NAN] + rows[:, _INF] == 0
    fill = held & ~(present & ~finite) if every else held & ~present
    if not fill.any():
        return rows
    n = len(rows)
    measured = present & ~held
    positions = np.arange(n)
    last = np.maximum.accumulate(np.where(measured, positions, -1))
    fill = fill & (last >= 0)
    out = rows.copy()
    out[fill] = rows[last[fill]]
    if steps is None:
        return out
    following = np.minimum.accumulate(np.where(measured, positions, n)[::-1])[::-1]
    between = fill & (following < n)
    if moved is not None and moved.any():
        count = np.cumsum(moved)
        between &= count[np.minimum(following, n - 1)] == count[np.maximum(last, 0)]
    between &= finite[np.maximum(last, 0)] & finite[np.minimum(following, n - 1)]
    if between.any():
        before, after = last[between], following[between]
        weight = ((steps[between] - steps[before]) / (steps[after] - steps[before]))[:, None]
        blended = (1 - weight) * rows[before] + weight * rows[after]
        blended[:, [_NAN, _INF]] = rows[before][:, [_NAN, _INF]]
        out[between] = blended
    return out


def jumps(steps: np.ndarray, rows: np.ndarray, decades: float = 1.0) -> np.ndarray:
    """The steps at which the rms of ``rows`` (one tensor's summary rows at ``steps``) moved by at least
    ``decades`` from its previous row, either way (to or from 0 included). Inputs are recorded at sentinel
    steps and the tiers do not watch them: a batch scaled or zeroed there is a move the interpolation of
    ``hold_rows`` must not smooth over, or a change measured at the next full step is dated before it.

    >>> rows = np.zeros((5, NUM_FIELDS)); rows[:, _COUNT] = 4; rows[:, FIELD["sum_sq"]] = [4, 4, 400, 400, 0]
    >>> jumps(np.arange(10, 15), rows).tolist()
    [12, 14]
    """
    level = log_level(derive_one(rows, "rms"))
    with np.errstate(invalid="ignore"):
        moved = np.abs(np.diff(level)) >= decades
    return np.asarray(steps, dtype=np.int64)[1:][moved]


def _pairs(entry: Rows | list[Rows]) -> list[Rows]:
    if isinstance(entry, list):
        return entry
    steps, r = entry
    r = np.asarray(r, dtype=np.float64).reshape(-1, NUM_FIELDS)
    return [(steps, r)]

"""Mode collapse: the spread of a node's values across samples falls by decades to a low level."""
from __future__ import annotations

import numpy as np

from comgra_ndbg.analysis.api import diagnose
from comgra_ndbg.analysis.collapse import collapse_events
from comgra_ndbg.analysis.series import NodeSeries, RunSeries
from comgra_ndbg.analysis.synthetic import summary_rows
from comgra_ndbg.graph.model import DependencyGraph, GraphEdge, GraphNode
from comgra_ndbg.stats.statistics import derive

STEPS, T0 = 200, 120


def series(spreads: dict[str, np.ndarray], roles: dict[str, str] | None = None, loss=None) -> RunSeries:
    roles = roles or {}
    names = list(spreads)
    flat = derive(summary_rows(rms=np.ones(STEPS))[1])
    nodes = tuple(NodeSeries(n, roles.get(n, "intermediate"), i, {"value": {**flat, "sample_spread": spreads[n]}})
                  for i, n in enumerate(names))
    graph = DependencyGraph(tuple(GraphNode(n, roles.get(n, "intermediate"), "", (n,), False) for n in names),
                            tuple(GraphEdge(a, b, "forward") for a, b in zip(names[:-1], names[1:])))
    kpis = {} if loss is None else {"loss": loss}
    return RunSeries(np.arange(STEPS), nodes, kpis, graph)


def collapsed_from(step: int, level: float = 1e-4) -> np.ndarray:
    return np.r_[np.full(step, 0.7), np.full(STEPS - step, level)]


def test_a_spread_falling_by_decades_to_almost_nothing_is_a_collapse() -> None:
    [event] = collapse_events(series({"h": collapsed_from(T0)}))
    assert (event.node, event.family, event.to_state, event.onset, event.sudden) == (
        "h", "representation", "collapsed", T0, True)
    assert event.magnitude == np.log10(0.7 / 1e-4)


def test_a_narrowing_that_stays_above_the_collapse_level_or_a_steady_low_spread_is_not() -> None:
    assert collapse_events(series({"h": collapsed_from(T0, level=0.05)})) == []  # 1.1 decades, to 0.05
    assert collapse_events(series({"h": np.full(STEPS, 1e-3)})) == []  # a bottleneck that was always narrow


def test_an_unknown_spread_never_collapses() -> None:
    assert collapse_events(series({"h": np.full(STEPS, np.nan)})) == []


def test_the_first_collapsing_node_is_the_origin_and_the_rest_follow_from_it() -> None:
    run = series({"x": np.full(STEPS, 0.9), "enc": np.full(STEPS, 0.8), "code": collapsed_from(T0),
                  "out": collapsed_from(T0)}, roles={"x": "input", "out": "output"},
                 loss=np.r_[np.linspace(2, 1, T0), np.full(STEPS - T0, 2.3)])
    top = diagnose(run).top
    assert (top.type, top.origin, top.node, top.onset) == ("mode_collapse", "node", "code", T0)
    assert [link.effect.node for link in top.chain.links] == ["out"]
    assert "became alike" in top.sentence and "'code'" in top.remedy


def test_inputs_that_collapse_are_the_data() -> None:
    run = series({"x": collapsed_from(T0), "h": collapsed_from(T0)}, roles={"x": "input"})
    top = diagnose(run).top
    assert (top.type, top.origin, top.node) == ("mode_collapse", "data", "x")

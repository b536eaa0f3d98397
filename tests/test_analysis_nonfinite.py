"""Non-finite values: first occurrence per series and the order the step computed them in."""
from __future__ import annotations

import numpy as np

from comgra_ndbg.analysis.nonfinite import first_nonfinite_index, nonfinite_events
from comgra_ndbg.analysis.series import build_series
from comgra_ndbg.analysis.synthetic import summary_rows
from comgra_ndbg.graph.model import DependencyGraph, GraphEdge, GraphNode


def node(name: str, role: str) -> GraphNode:
    return GraphNode(name, role, "", (name,), role == "parameter")


def test_forward_order_then_backward_order_at_the_same_step() -> None:
    bad = np.zeros(50)
    bad[30:] = 5
    graph = DependencyGraph((node("a", "intermediate"), node("b", "intermediate"), node("w", "parameter")),
                            (GraphEdge("a", "b", "forward"), GraphEdge("w", "a", "forward")))
    rows = {("b", "value"): summary_rows(rms=np.ones(50), nonfinite=bad),
            ("a", "value"): summary_rows(rms=np.ones(50), nonfinite=bad),
            ("a", "grad"): summary_rows(rms=np.ones(50), nonfinite=bad),
            ("b", "grad"): summary_rows(rms=np.ones(50), nonfinite=bad),
            ("w", "value"): summary_rows(rms=np.ones(50), nonfinite=np.r_[np.zeros(31), np.full(19, 5)])}
    s = build_series(rows, roles={"a": "intermediate", "b": "intermediate", "w": "parameter"}, kpis={},
                     graph=graph)
    events = nonfinite_events(s)
    assert [(e.node, e.kind, e.onset) for e in events] == [
        ("a", "value", 30), ("b", "value", 30), ("b", "grad", 30), ("a", "grad", 30), ("w", "value", 31)]
    assert first_nonfinite_index(s) == 30
    assert events[0].magnitude == 5 / 64 and events[0].end == 49


def test_nan_loss_kpi_counts_but_an_unrecorded_step_does_not() -> None:
    loss = np.r_[np.ones(20), np.nan, np.ones(5)]
    s = build_series({("h", "value"): summary_rows(rms=np.ones(30))}, roles={"h": "intermediate"},
                     kpis={"loss": (np.arange(26), loss)})
    [event] = nonfinite_events(s)
    assert (event.node, event.kind, event.onset, event.end) == ("loss", "kpi", 20, 20)
    clean = build_series({("h", "value"): summary_rows(rms=np.ones(30))}, roles={"h": "intermediate"},
                         kpis={"loss": (np.arange(10), np.ones(10))})
    assert nonfinite_events(clean) == [] and first_nonfinite_index(clean) is None


def test_non_finite_from_step_0_is_at_start() -> None:
    s = build_series({("x", "value"): summary_rows(rms=np.ones(10), nonfinite=np.ones(10))},
                     roles={"x": "input"}, kpis={})
    [event] = nonfinite_events(s)
    assert event.at_start and event.onset == 0

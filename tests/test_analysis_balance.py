"""Imbalanced learning: parallel paths with parameters of their own, and a lasting shift of their ratio."""
from __future__ import annotations

import numpy as np

from comgra_ndbg.analysis.api import diagnose
from comgra_ndbg.analysis.balance import balance_events, parallel_paths
from comgra_ndbg.analysis.series import build_series
from comgra_ndbg.analysis.synthetic import summary_rows
from comgra_ndbg.graph.model import DependencyGraph, GraphEdge, GraphNode

STEPS, T0 = 240, 140
ROLES = {"x": "input", "a": "intermediate", "b": "intermediate", "a.p": "parameter", "b.p": "parameter",
         "sum": "intermediate", "head.p": "parameter", "out": "output"}
EDGES = [("x", "a"), ("x", "b"), ("a.p", "a"), ("b.p", "b"), ("a", "sum"), ("b", "sum"), ("sum", "out"),
         ("head.p", "out")]


def graph(edges=EDGES, roles=ROLES) -> DependencyGraph:
    return DependencyGraph(tuple(GraphNode(n, r, "", (n,), r == "parameter") for n, r in roles.items()),
                           tuple(GraphEdge(s, t, "forward") for s, t in edges))


def run(grad_a: np.ndarray, grad_b: np.ndarray, loss=None, update_b=None):
    ones = np.ones(STEPS)
    rows = {(n, "value"): summary_rows(rms=ones) for n in ROLES}
    for n, g in (("a.p", grad_a), ("b.p", grad_b), ("head.p", ones)):
        rows[(n, "grad")] = summary_rows(rms=g)
        rows[(n, "update")] = summary_rows(rms=update_b if n == "b.p" and update_b is not None else 1e-3 * ones)
    kpis = {"loss": (np.arange(STEPS), np.ones(STEPS) if loss is None else loss)}
    return build_series(rows, roles=ROLES, kpis=kpis, graph=graph())


def test_towers_with_their_own_parameters_are_parallel_a_residual_skip_is_not() -> None:
    assert [(p.merge, p.paths) for p in parallel_paths(graph())] == [("sum", (("a", ("a.p",)), ("b", ("b.p",))))]
    roles = {"h": "intermediate", "f": "intermediate", "f.p": "parameter", "add": "intermediate"}
    residual = graph([("h", "f"), ("f.p", "f"), ("h", "add"), ("f", "add")], roles)
    assert parallel_paths(residual) == []


def test_one_path_coming_to_dwarf_the_other_is_imbalanced_learning_caused_by_the_loss() -> None:
    grad_a = np.ones(STEPS)
    grad_a[T0:] = 300.0
    [event] = balance_events(run(grad_a, np.ones(STEPS)))
    assert (event.family, event.node, event.kind, event.to_state, event.onset) == (
        "path_balance", "a", "grad", "imbalanced", T0)
    top = diagnose(run(grad_a, np.ones(STEPS))).top  # gradients apart, parameters alike: the loss weighs them
    assert (top.type, top.origin, top.onset) == ("imbalanced_learning", "loss", T0)
    assert "'a'" in top.sentence and "'b'" in top.sentence and "param group" in top.remedy


def test_updates_coming_apart_under_alike_gradients_are_the_learning_rates() -> None:
    update_b = np.full(STEPS, 1e-3)
    update_b[T0:] = 1e-5  # a 0.01 lr multiplier put on the wrong param group
    series = run(np.ones(STEPS), np.ones(STEPS), update_b=update_b)
    [event] = balance_events(series)
    assert (event.node, event.kind, event.onset) == ("b", "update", T0)
    top = diagnose(series).top
    assert (top.type, top.origin, top.node) == ("imbalanced_learning", "optimizer", "")


def test_paths_of_different_but_steady_scale_are_balanced() -> None:
    assert balance_events(run(np.full(STEPS, 1e3), np.ones(STEPS))) == []


def test_a_brief_imbalance_is_not_lasting() -> None:
    grad_b = np.ones(STEPS)
    grad_b[T0:T0 + 8] = 1e-3
    assert balance_events(run(np.ones(STEPS), grad_b)) == []


def test_an_imbalance_that_begins_with_a_gradient_jump_inside_the_path_is_that_jump() -> None:
    from comgra_ndbg.analysis.events import Event
    from comgra_ndbg.analysis.reading import interpret
    roles = {**ROLES, "a0": "intermediate", "a0.p": "parameter"}
    edges = [e for e in EDGES if e != ("x", "a")] + [("x", "a0"), ("a0.p", "a0"), ("a0", "a")]
    ones = np.ones(STEPS)
    series = build_series({(n, "value"): summary_rows(rms=ones) for n in roles}, roles=roles,
                          kpis={"loss": (np.arange(STEPS), ones)}, graph=graph(edges, roles))
    imbalance = Event("path_balance", "a", "grad", "balanced", "imbalanced", T0, STEPS - 1, 3.0, 1.0)
    inside = Event("gradient_health", "a0", "grad", "healthy", "exploding", T0, STEPS - 1, 4.0, 1.0, sudden=True)
    reading = interpret(imbalance, [imbalance, inside], series)
    assert (reading.type, reading.origin, reading.node) == ("exploding", "node", "a0")
    reading = interpret(imbalance, [imbalance], series)
    assert (reading.type, reading.origin) == ("imbalanced_learning", "loss")

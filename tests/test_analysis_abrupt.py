"""Abrupt failures: the single-step jumps just before the first non-finite step, ordered by the step's
phases, name what happened first."""
from __future__ import annotations

import numpy as np

from comgra_ndbg.analysis.api import diagnose
from comgra_ndbg.analysis.series import build_series
from comgra_ndbg.analysis.synthetic import summary_rows

STEPS, T0 = 160, 120
LAYERS = ("l0", "l1", "l2", "l3")


def run(update_jump: dict[str, float], grad_jump: dict[str, float], dies_at: int = T0 + 1):
    """Four layers (parameters ``<l>.p`` feeding activations ``<l>``) trained to step ``dies_at``, where
    every value turns NaN; at T0 updates and gradients of the named layers jump by the given factors."""
    n = dies_at + 1
    rows, roles, edges = {}, {"x": "input"}, []
    nan = np.zeros(n)
    nan[dies_at:] = 64
    previous = "x"
    rows[("x", "value")] = summary_rows(rms=np.ones(n))
    for name in LAYERS:
        update, grad = np.full(n, 1e-3), np.ones(n)
        update[T0:] *= update_jump.get(name, 1.0)
        grad[T0:] *= grad_jump.get(name, 1.0)
        rows[(f"{name}.p", "value")] = summary_rows(rms=np.ones(n))
        rows[(f"{name}.p", "update")] = summary_rows(rms=update)
        rows[(f"{name}.p", "grad")] = summary_rows(rms=grad)
        rows[(name, "value")] = summary_rows(rms=np.ones(n), nonfinite=nan)
        rows[(name, "grad")] = summary_rows(rms=grad)
        roles[name], roles[f"{name}.p"] = ("output" if name == LAYERS[-1] else "intermediate"), "parameter"
        edges += [(previous, name), (f"{name}.p", name)]
        previous = name
    from comgra_ndbg.graph.model import DependencyGraph, GraphEdge, GraphNode
    graph = DependencyGraph(tuple(GraphNode(k, r, "", (k,), r == "parameter") for k, r in roles.items()),
                            tuple(GraphEdge(a, b, "forward") for a, b in edges))
    loss = np.r_[np.linspace(2, 1, dies_at), np.full(n - dies_at, np.nan)]
    return build_series(rows, roles=roles, kpis={"loss": (np.arange(n), loss)}, graph=graph)


def top(series):
    h = diagnose(series).top
    return (h.type, h.origin, h.node, h.onset)


def test_a_learning_rate_times_1000_kills_the_run_in_one_step_and_is_the_optimizer() -> None:
    assert top(run({name: 1000.0 for name in LAYERS}, {})) == ("optimizer_divergence", "optimizer", "", T0)


def test_a_gradient_multiplied_in_one_backward_pass_is_that_node() -> None:
    series = run({"l0": 1e4, "l1": 1e4}, {"l1": 1e4, "l0": 1e4})
    assert top(series) == ("exploding", "node", "l1", T0)


def test_without_a_jump_before_it_the_first_non_finite_value_is_the_root() -> None:
    assert top(run({}, {})) == ("exploding", "node", "l0", T0 + 1)

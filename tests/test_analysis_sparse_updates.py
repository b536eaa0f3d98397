"""The analysis of updates measured at some steps only (``detail="tiered"``): every 10th step, and the steps
the tiers chose after something changed. Values and gradients are complete at every step."""
from __future__ import annotations

import numpy as np

from comgra_ndbg.analysis.balance import balance_events
from comgra_ndbg.analysis.optimizer_stability import update_events
from comgra_ndbg.analysis.parameter_edits import edit_events
from comgra_ndbg.analysis.series import build_series
from comgra_ndbg.analysis.shift import measured_shifts, sparse_positions
from comgra_ndbg.analysis.stagnation import change_bound, stagnation_events
from comgra_ndbg.analysis.synthetic import summary_rows
from comgra_ndbg.graph.model import DependencyGraph, GraphEdge, GraphNode

STEPS = 150
T0 = 75


def _measured(extra=()):
    """The steps a tiered recording measures updates at: every 10th, plus ``extra`` (a trigger and its hold)."""
    return np.array(sorted(set(range(0, STEPS, 10)) | set(extra)))


def _sparse(rows, steps):
    """``rows`` (steps, rows) of every step, kept at ``steps`` only."""
    return rows[0][steps], rows[1][steps]


def _values(rms, mean):
    return summary_rows(rms=rms, mean=mean, abs_mean=np.abs(mean) + rms)


def test_sparse_positions_tell_measured_series_from_dense_ones():
    dense = np.arange(20.0)
    dense[[3, 7]] = np.nan
    sparse = np.full(40, np.nan)
    sparse[::10] = 1.0
    assert sparse_positions(dense) is None
    assert sparse_positions(sparse).tolist() == [0, 10, 20, 30]
    assert sparse_positions(np.full(5, np.nan)) is None


def test_a_learning_rate_jump_is_found_in_measured_updates():
    rng = np.random.default_rng(0)
    weight = np.full(STEPS, 1.0)
    update = 1e-3 * np.exp(rng.normal(0, 0.1, STEPS))
    update[T0:] *= 30  # the learning rate went up 30x at T0 (under the absolute band): the tiers measured T0 and
    # the 2 steps after
    measured = _measured((T0, T0 + 1, T0 + 2))
    rows = {("p", "value"): _values(weight, np.zeros(STEPS) + 1e-3 * np.arange(STEPS)),
            ("p", "update"): _sparse(summary_rows(rms=update), measured)}
    events = update_events(build_series(rows, roles={"p": "parameter"}, kpis={}))
    assert [(e.node, e.to_state, e.onset) for e in events] == [("p", "unstable", T0)]


def test_healthy_measured_updates_raise_nothing():
    rng = np.random.default_rng(1)
    update = 1e-3 * np.exp(rng.normal(0, 0.3, STEPS)) * np.linspace(1, 0.3, STEPS)  # noisy, decaying
    rows = {("p", "value"): _values(np.ones(STEPS), 1e-3 * np.arange(STEPS)),
            ("p", "update"): _sparse(summary_rows(rms=update), _measured())}
    series = build_series(rows, roles={"p": "parameter"}, kpis={})
    assert update_events(series) == [] and edit_events(series) == []


def test_measured_shifts_need_persisting_measured_values():
    x = np.full(STEPS, np.nan)
    x[::10] = 0.0
    x[T0] = 3.0  # one measured value out of line, the next measured ones back: no shift
    assert measured_shifts(x, window=20, min_history=10, enter=1, exit=0.5, persist=3) == []
    x[[T0 + 5, 80, 90]] = 3.0
    assert [s.start for s in measured_shifts(x, window=20, min_history=10, enter=1, exit=0.5, persist=3)] == [T0]


def test_an_edit_before_an_unmeasured_update_is_seen_against_the_updates_around_it():
    weight = np.full(STEPS, 1.0)
    weight[T0:] = 20.0  # set 20x between steps T0-1 and T0; the update of T0-1 was not measured
    rows = {("p", "value"): _values(weight, 1e-3 * np.arange(STEPS)),
            ("p", "update"): _sparse(summary_rows(rms=np.full(STEPS, 1e-3)), _measured((T0, T0 + 1, T0 + 2)))}
    events = edit_events(build_series(rows, roles={"p": "parameter"}, kpis={}))
    assert [(e.node, e.onset) for e in events] == [("p", T0)]


def test_change_bound_is_a_lower_bound_of_the_largest_change():
    rng = np.random.default_rng(2)
    for _ in range(200):
        w = rng.normal(size=50)
        d = rng.normal(size=50) * 10.0 ** rng.uniform(-4, 0)
        if rng.random() < 0.3:
            d[rng.integers(50)] += rng.normal() * 5  # one large element
        stats = {"min": np.array([w.min(), (w + d).min()]), "max": np.array([w.max(), (w + d).max()]),
                 "mean": np.array([w.mean(), (w + d).mean()]),
                 "l2": np.array([np.linalg.norm(w), np.linalg.norm(w + d)]), "count": np.array([50.0, 50.0])}
        bound = change_bound(stats, np.array([0]), np.array([1]))[0]
        assert 0 < bound <= np.abs(d).max() * (1 + 1e-12)


def test_a_frozen_node_among_measured_updates_is_found_from_the_values():
    rng = np.random.default_rng(3)
    names = ("a", "b", "c")
    rows = {}
    for name in names:
        mean = np.cumsum(rng.normal(0, 1e-3, STEPS))
        if name == "c":
            mean[T0 + 1:] = mean[T0]  # stops moving: its update of T0 is the first zero
        rows[(name, "value")] = _values(np.ones(STEPS) + mean, mean)
        update = np.abs(np.r_[np.diff(mean), 1e-3]) + (0 if name == "c" else 1e-4)
        if name == "c":
            update[T0:] = 0.0
        rows[(name, "update")] = _sparse(summary_rows(rms=update, abs_max=update), _measured())
    events = stagnation_events(build_series(rows, roles={n: "parameter" for n in names}, kpis={}))
    assert [(e.node, e.to_state) for e in events] == [("c", "frozen")]
    assert abs(events[0].onset - T0) <= 1


def test_imbalanced_updates_between_parallel_paths_are_found_in_measured_steps():
    def node(name, param=False):
        return GraphNode(name, "parameter" if param else "intermediate", "", (name,), param)

    graph = DependencyGraph((node("x"), node("a"), node("b"), node("sum"), node("pa", True), node("pb", True)),
                            tuple(GraphEdge(s, t, "forward") for s, t in
                                  (("x", "a"), ("x", "b"), ("pa", "a"), ("pb", "b"), ("a", "sum"), ("b", "sum"))))
    rng = np.random.default_rng(4)
    measured = _measured((T0, T0 + 1, T0 + 2))
    rows = {}
    for name in ("pa", "pb"):
        update = 1e-3 * np.exp(rng.normal(0, 0.1, STEPS))
        if name == "pb":
            update[T0:] *= 1000  # its group's learning rate went up 1000x at T0
        rows[(name, "value")] = _values(np.ones(STEPS), 1e-3 * np.arange(STEPS))
        rows[(name, "update")] = _sparse(summary_rows(rms=update), measured)
        rows[(name, "grad")] = summary_rows(rms=np.full(STEPS, 1e-2))
    for name in ("x", "a", "b", "sum"):
        rows[(name, "value")] = summary_rows(rms=np.ones(STEPS))
    series = build_series(rows, roles={"pa": "parameter", "pb": "parameter", "x": "input", "a": "intermediate",
                                       "b": "intermediate", "sum": "output"}, kpis={}, graph=graph)
    events = balance_events(series)
    assert [(e.kind, e.onset) for e in events] == [("update", T0)]

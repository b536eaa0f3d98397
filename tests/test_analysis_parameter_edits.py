"""Parameter edits: a change between two steps that the recorded update cannot explain, and how it is read."""
from __future__ import annotations

import numpy as np
import pytest

from comgra_ndbg.analysis.api import diagnose
from comgra_ndbg.analysis.parameter_edits import edit_events, unexplained_change
from comgra_ndbg.analysis.series import build_series
from comgra_ndbg.analysis.synthetic import summary_rows
from comgra_ndbg.graph.model import DependencyGraph, GraphEdge, GraphNode
from comgra_ndbg.store.schema import FIELD

STEPS = 200


def rows_of(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Summary rows of a parameter whose elements are ``values[step]`` (steps x elements), exactly."""
    steps = np.arange(len(values))
    rows = np.zeros((len(values), len(FIELD)))
    rows[:, FIELD["count"]] = values.shape[1]
    rows[:, FIELD["sum"]] = values.sum(axis=1)
    rows[:, FIELD["sum_sq"]] = np.square(values).sum(axis=1)
    rows[:, FIELD["sum_abs"]] = np.abs(values).sum(axis=1)
    rows[:, FIELD["min"]], rows[:, FIELD["max"]] = values.min(axis=1), values.max(axis=1)
    rows[:, FIELD["zeros"]] = (values == 0).sum(axis=1)
    return steps, rows


def trained(edit=None, at: int = 120, seed: int = 0, every_step=None):
    """Values and updates of a parameter trained by small random updates; ``edit(w)`` rewrites it between
    step ``at - 1`` and ``at``; ``every_step(w)`` is a constraint applied after each update."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=64) * 0.3
    values, updates = [], []
    for step in range(STEPS):
        if edit is not None and step == at:
            w = edit(w.copy())
        values.append(w.copy())
        update = rng.normal(size=64) * 1e-3
        updates.append(update)
        w = w + update
        if every_step is not None:
            w = every_step(w)
    return np.array(values), np.array(updates)


def series_of(values, updates):
    return build_series({("p", "value"): rows_of(values), ("p", "update"): rows_of(updates)},
                        roles={"p": "parameter"}, kpis={})


def test_updates_explain_ordinary_training_exactly() -> None:
    change = unexplained_change(series_of(*trained()), series_of(*trained()).node("p"))
    assert np.isnan(change[0]) and np.nanmax(change) < 1e-9


@pytest.mark.parametrize("edit, decades", [
    (lambda w: w * 50.0, 1.7),  # weights scaled up by a buggy re-initialisation
    (lambda w: w * 1e-3, 3.0),  # scaled down
    (lambda w: np.where(np.arange(64) >= 48, -20.0, w), 1.5),  # a bias block filled with -20
])
def test_an_edit_between_steps_is_one_event_at_its_step(edit, decades) -> None:
    series = series_of(*trained(edit))
    [event] = edit_events(series)
    assert (event.node, event.to_state, event.onset, event.end) == ("p", "edited", 120, 120)
    assert event.magnitude == pytest.approx(decades, abs=0.1)
    assert event.evidence[0].steps == (119, 120)


def test_a_sign_flip_keeps_the_norm_but_not_the_sum() -> None:
    values, updates = trained(lambda w: -w)
    assert [e.onset for e in edit_events(series_of(values, updates))] == [120]


def test_a_constraint_applied_every_step_is_training_not_an_edit() -> None:
    def clip(w):
        return np.clip(w, -0.25, 0.25)
    assert edit_events(series_of(*trained(every_step=clip))) == []


def test_steps_that_are_not_consecutive_are_not_compared() -> None:
    values, updates = trained(lambda w: w * 50.0)
    keep = np.r_[0:119, 121:STEPS]  # the steps around the edit were not recorded
    series = build_series({("p", "value"): (keep, rows_of(values)[1][keep]),
                           ("p", "update"): (keep, rows_of(updates)[1][keep])}, roles={"p": "parameter"}, kpis={})
    assert edit_events(series) == []


def test_an_edited_bias_that_kills_the_units_it_feeds_reads_as_dead_units_at_the_parameter() -> None:
    roles = {"x": "input", "fc.parameters": "parameter", "fc": "intermediate", "drop": "intermediate",
             "act": "intermediate", "out": "output"}
    edges = [("x", "fc"), ("fc.parameters", "fc"), ("fc", "drop"), ("drop", "act"), ("act", "out")]
    graph = DependencyGraph(tuple(GraphNode(n, r, "", (n,), r == "parameter") for n, r in roles.items()),
                            tuple(GraphEdge(a, b, "forward") for a, b in edges))
    values, updates = trained(lambda w: np.where(np.arange(64) >= 48, -20.0, w))
    ones = np.ones(STEPS)
    shifted = np.r_[np.ones(120), np.full(80, 30.0)]
    dead = np.r_[np.zeros(120), np.ones(80)]
    rows = {("fc.parameters", "value"): rows_of(values), ("fc.parameters", "update"): rows_of(updates),
            ("x", "value"): summary_rows(rms=ones), ("fc", "value"): summary_rows(rms=shifted),
            ("drop", "value"): summary_rows(rms=shifted),
            ("act", "value"): summary_rows(rms=np.r_[np.ones(120), np.zeros(80)], dead=dead),
            ("out", "value"): summary_rows(rms=ones)}
    loss = np.r_[np.linspace(2, 1, 120), np.full(80, 2.3)]
    series = build_series(rows, roles=roles, kpis={"loss": (np.arange(STEPS), loss)}, graph=graph)
    top = diagnose(series).top
    assert (top.type, top.origin, top.node, top.onset) == ("dead_units", "node", "fc.parameters", 120)
    assert "'act' went dead" in top.sentence and "outside the optimizer" in top.sentence


def test_an_edit_that_harms_nothing_is_no_failure() -> None:
    values, updates = trained(lambda w: w * 1.5)
    series = build_series({("p", "value"): rows_of(values), ("p", "update"): rows_of(updates)},
                          roles={"p": "parameter"}, kpis={"loss": (np.arange(STEPS), np.linspace(2, 1, STEPS))})
    diagnosis = diagnose(series)
    assert [e.family for e in diagnosis.events] == ["parameter_edit"]
    assert diagnosis.healthy


def test_a_layer_reinitialised_larger_mid_run_is_the_layers_fault_though_its_values_move_under_a_decade(
        tmp_path) -> None:
    """``nn.init.normal_(fc2.weight, std=1.0)`` under ``no_grad`` mid-run (a real run under ``NeuralDbg``'s
    defaults): the edit was found, but fc2's outputs rose 0.8 decades, under the value rules' decade, so the
    edit read as harming nothing and the gradient jump it caused downstream, at fc3's parameters, stood as the
    root (confidence 0.88). The gradients downstream that jump with an edit are its harm."""
    import torch
    from torch import nn

    from comgra_ndbg import NeuralDbg
    from comgra_ndbg.analysis.api import analyze

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    w1, w2 = torch.randn(16, 32, generator=g), torch.randn(32, 4, generator=g)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    criterion = nn.CrossEntropyLoss()
    with NeuralDbg(model, tmp_path, trial="t", loss=criterion, optimizer=optimizer, snapshots=None):
        for step in range(230):
            if step == 150:
                with torch.no_grad():
                    nn.init.normal_(model[2].weight, std=1.0)
            x = torch.randn(64, 16, generator=g)
            y = (torch.tanh(x @ w1) @ w2).argmax(1)
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()
    top = analyze(tmp_path / "t", store=False).hypotheses[0]
    assert (top.type, top.origin, top.node, top.onset) == ("exploding", "node", "model.2.parameters", 150)

"""Update stagnation read from the parameter values: frozen by lr 0 (gradient present) or by
requires_grad_(False) (no gradient), frozen on purpose from the start, and the whole model frozen at once."""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from comgra_ndbg.analysis.hypotheses import rank_hypotheses
from comgra_ndbg.analysis.causal import link_events
from comgra_ndbg.analysis.optimizer_stability import OPTIMIZER
from comgra_ndbg.analysis.series import build_series
from comgra_ndbg.analysis.stagnation import stagnation_events
from comgra_ndbg.analysis.synthetic import summary_rows

STEPS = 300


def params(updates: dict[str, np.ndarray], grads: dict[str, np.ndarray | None]):
    rows, roles = {}, {}
    for name, update in updates.items():
        rows[(name, "value")] = summary_rows(rms=np.ones(STEPS))
        rows[(name, "update")] = summary_rows(rms=update)
        if grads.get(name) is not None:
            rows[(name, "grad")] = summary_rows(rms=grads[name])
        roles[name] = "parameter"
    return build_series(rows, roles=roles, kpis={"loss": (np.arange(STEPS), np.ones(STEPS))})


def states(events):
    return [(e.node, e.from_state, e.to_state, e.onset, e.end, e.at_start) for e in events]


def moving() -> np.ndarray:
    return np.full(STEPS, 1e-3)


def stopped_at(step: int) -> np.ndarray:
    update = moving()
    update[step:] = 0.0
    return update


def test_lr_zero_freezes_a_layer_under_its_gradient() -> None:
    series = params({"a": stopped_at(150), "b": moving(), "c": moving()},
                    {"a": np.ones(STEPS), "b": np.ones(STEPS), "c": np.ones(STEPS)})
    assert states(stagnation_events(series)) == [("a", "stable", "frozen", 150, STEPS - 1, False)]


def test_requires_grad_false_freezes_a_layer_without_any_gradient() -> None:
    grad = np.ones(STEPS)
    grad[150:] = np.nan  # no gradient recorded once requires_grad is off
    series = params({"a": stopped_at(150), "b": moving()}, {"a": grad, "b": np.ones(STEPS)})
    [event] = stagnation_events(series)
    assert (event.node, event.to_state, event.onset) == ("a", "frozen", 150)
    [h] = rank_hypotheses([event], link_events([event], series), series)
    assert (h.type, h.origin, h.node, h.onset) == ("update_stagnation", "node", "a", 150)
    assert "requires_grad" in h.remedy and "param group" in h.remedy


def test_a_layer_frozen_on_purpose_from_the_start_is_no_failure() -> None:
    series = params({"backbone": np.zeros(STEPS), "head": moving()}, {"backbone": None, "head": np.ones(STEPS)})
    events = stagnation_events(series)
    assert states(events) == [("backbone", "initial", "fixed", 0, STEPS - 1, True)]
    assert rank_hypotheses(events, link_events(events, series), series) == []


def test_a_layer_that_gets_gradients_but_never_moves_is_missing_from_the_optimizer() -> None:
    series = params({"new_head": np.zeros(STEPS), "body": moving()},  # (a gradient that changes from step to step)
                    {"new_head": np.linspace(1.0, 2.0, STEPS), "body": np.ones(STEPS)})
    events = stagnation_events(series)
    assert states(events) == [("new_head", "initial", "frozen", 0, STEPS - 1, True)]
    [h] = rank_hypotheses(events, link_events(events, series), series)
    assert (h.type, h.origin, h.node) == ("update_stagnation", "node", "new_head")


def test_every_parameter_stopping_at_once_is_the_loop_not_a_layer() -> None:
    series = params({"a": stopped_at(120), "b": stopped_at(120), "c": stopped_at(120)},
                    {"a": np.ones(STEPS), "b": np.ones(STEPS), "c": np.ones(STEPS)})
    events = stagnation_events(series)
    assert states(events) == [(OPTIMIZER, "stable", "frozen", 120, STEPS - 1, False)]
    [h] = rank_hypotheses(events, link_events(events, series), series)
    assert (h.type, h.origin, h.node) == ("update_stagnation", "optimizer", "")
    assert "optimizer.step()" in h.remedy


def test_a_short_pause_is_not_stagnation() -> None:
    update = moving()
    update[150:155] = 0.0
    series = params({"a": update, "b": moving()}, {"a": np.ones(STEPS), "b": np.ones(STEPS)})
    assert stagnation_events(series) == []


def test_a_parameter_without_update_rows_whose_value_stands_still_is_frozen() -> None:
    values = np.r_[np.linspace(1.0, 1.2, 150), np.full(STEPS - 150, 1.2)]  # requires_grad_(False) at 150
    update = np.full(STEPS, 1e-3)
    update[150:] = np.nan  # no update row once it needs no gradient (NaN rows read as not recorded)
    rows = {("a", "value"): summary_rows(rms=values), ("a", "update"): summary_rows(rms=update),
            ("b", "value"): summary_rows(rms=np.linspace(1.0, 1.5, STEPS)), ("b", "update"): summary_rows(rms=moving())}
    series = build_series(rows, roles={"a": "parameter", "b": "parameter"},
                          kpis={"loss": (np.arange(STEPS), np.ones(STEPS))})
    assert states(stagnation_events(series)) == [("a", "stable", "frozen", 150, STEPS - 1, False)]


def test_a_backbone_frozen_with_requires_grad_off_then_unfrozen_is_no_whole_model_stall() -> None:
    """Nodes without a gradient at a step were frozen on purpose there (``requires_grad_(False)``): they do
    not count among the stopped when most of the model is frozen until it is unfrozen at step 100 (it had read
    as the optimizer stalling 99 steps, 0.95)."""
    frozen_until = {f"b{k}": stopped_at(0) for k in range(4)}
    grads: dict[str, np.ndarray | None] = {}
    for name, update in frozen_until.items():
        update[100:] = 1e-3
        grad = np.linspace(1.0, 2.0, STEPS)
        grad[:100] = np.nan  # no gradient recorded while requires_grad is off
        grads[name] = grad
    series = params(frozen_until | {"head": moving()}, grads | {"head": np.linspace(1.0, 2.0, STEPS)})
    assert [e for e in stagnation_events(series) if e.node == OPTIMIZER] == []


def test_most_nodes_with_exactly_zero_gradients_are_a_cut_path_not_the_optimizer() -> None:
    """A scale of 0 that is no Parameter multiplies the blocks' path by 0: their gradients are exactly 0, the
    ends of the model train. Read as unused parameters of the architecture, at the first such node."""
    zero = {f"block{k}": np.zeros(STEPS) for k in range(4)}
    series = params(zero | {"inp": moving(), "out": moving()},
                    {name: np.zeros(STEPS) for name in zero} | {"inp": np.linspace(1.0, 2.0, STEPS),
                                                               "out": np.linspace(1.0, 2.0, STEPS)})
    events = stagnation_events(series)
    hypotheses = rank_hypotheses(events, link_events(events, series), series)
    assert [(h.type, h.origin, h.node) for h in hypotheses][:1] == [("unused_parameters", "architecture", "block0")]
    assert "exactly 0" in hypotheses[0].remedy


def test_a_run_non_finite_from_its_first_step_reads_no_gradient_from_an_empty_range() -> None:
    """``stop=0`` (the loss non-finite at step 0): no step to read a gradient from, and no numpy warning."""
    series = params({"a": moving(), "b": moving()}, {"a": np.ones(STEPS), "b": np.ones(STEPS)})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert stagnation_events(series, stop=0) == []


@pytest.mark.parametrize("with_criterion", [False, True])
def test_a_loss_multiplied_by_zero_from_a_step_on_is_named_at_the_loss(tmp_path: Path, with_criterion: bool) -> None:
    """``loss * max(0, 1 - step // 40)`` (an integer division meant as a slow decay): from step 40 nothing
    trains; the loss, not the optimizer, is where it happens. Without ``loss=`` the loss recorded is the
    product, 0; with ``loss=criterion`` it is the criterion's output, whose gradient is 0."""
    from comgra_ndbg import NeuralDbg
    from comgra_ndbg.analysis import analyze

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(4)
    teacher = torch.randn(10, 3, generator=g)
    model = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    criterion = torch.nn.CrossEntropyLoss()
    with NeuralDbg(model, tmp_path, trial="zeroed", optimizer=optimizer, snapshots=None,
                   loss=criterion if with_criterion else None):
        for step in range(160):
            x = torch.randn(32, 10, generator=g)
            optimizer.zero_grad()
            loss = criterion(model(x), (x @ teacher).argmax(1))
            (loss * max(0, 1 - step // 40)).backward()
            optimizer.step()
    top = analyze(tmp_path / "zeroed", store=False).hypotheses[0]
    assert (top.type, top.origin) == ("update_stagnation", "loss") and abs(top.onset - 40) <= 1
    assert "exactly 0" in top.sentence


@pytest.mark.parametrize("loss, found", [
    ([1.0] * 20 + [0.0] * 12, True),  # multiplied by 0 at step 20
    ([1.0 / 2 ** i for i in range(20)] + [0.0] * 12, False),  # converged to 0: a margin loss satisfied
    ([1.0] * 20 + [0.0] * 5, False),  # too short a tail to tell
    ([1.0] * 19 + [float("nan")] + [0.0] * 12, False),  # non-finite first: another failure
])
def test_only_a_loss_that_drops_to_zero_at_once_counts(loss: list[float], found: bool) -> None:
    from types import SimpleNamespace

    from comgra_ndbg.analysis.invariants import _zeroed_loss_findings

    series = SimpleNamespace(loss=np.array(loss), steps=np.arange(len(loss)), nodes=())
    findings = _zeroed_loss_findings(series)
    assert bool(findings) == found
    if found:
        assert findings[0].invariant == "loss_zeroed" and findings[0].onset == 20

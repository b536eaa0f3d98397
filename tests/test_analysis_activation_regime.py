"""Activation regime on synthetic series: scale shifts, dead units and saturation, with hysteresis."""
from __future__ import annotations

import numpy as np

from comgra_ndbg.analysis.activation_regime import activation_events
from comgra_ndbg.analysis.series import build_series
from comgra_ndbg.analysis.synthetic import summary_rows


def run(**kwargs):
    roles = {name: "intermediate" for name in kwargs}
    rows = {(name, "value"): summary_rows(**spec) for name, spec in kwargs.items()}
    return build_series(rows, roles=roles, kpis={})


def states(events):
    return [(e.node, e.to_state, e.onset, e.end, e.at_start) for e in events]


def test_value_scale_collapse_at_step_200() -> None:
    rms = np.ones(400)
    rms[200:] = 1e-3
    events = activation_events(run(h=dict(rms=rms)), settle=50)
    assert states(events) == [("h", "vanishing", 200, 399, False)]
    assert events[0].evidence[0].baseline == 1.0


def test_units_dying_mid_run_with_hysteresis() -> None:
    dead = np.full(400, 0.1)
    dead[200:300] = 1.0
    dead[300:302] = 0.6  # a dip below exit for 2 steps does not end the state
    dead[302:350] = 0.95
    dead[350:] = 0.2
    assert states(activation_events(run(h=dict(rms=np.ones(400), dead=dead)), settle=50)) == [
        ("h", "dead", 200, 349, False)]


def test_dead_units_from_step_0_are_an_at_start_event() -> None:
    events = activation_events(run(h=dict(rms=np.ones(100), dead=np.ones(100))), settle=50)
    assert states(events) == [("h", "dead", 0, 99, True)]
    assert events[0].magnitude == 1.0


def test_a_high_but_stable_dead_share_that_was_always_there_mid_run_is_not_new() -> None:
    dead = np.full(400, 0.5)
    dead[200:] = 0.92  # only 0.42 above its median: below dead_rise
    assert activation_events(run(h=dict(rms=np.ones(400), dead=dead)), settle=50) == []


def test_saturation_after_weights_grow() -> None:
    saturated = np.full(300, 0.02)
    saturated[150:] = 0.9
    assert states(activation_events(run(h=dict(rms=np.full(300, 0.5), saturated=saturated)), settle=50)) == [
        ("h", "saturated", 150, 299, False)]


def test_stop_cuts_the_series_at_the_first_non_finite_step() -> None:
    rms = np.ones(400)
    rms[300:] = 1e-3
    assert activation_events(run(h=dict(rms=rms)), stop=250, settle=50) == []


def test_healthy_noisy_activations_produce_nothing() -> None:
    rng = np.random.default_rng(1)
    rms = np.exp(rng.normal(0, 0.3, 400)) * np.linspace(1, 3, 400)
    dead = np.clip(rng.normal(0.2, 0.05, 400), 0, 1)
    assert activation_events(run(h=dict(rms=rms, dead=dead)), settle=50) == []


def test_units_healthy_at_step_0_and_dead_after_the_first_updates_are_not_an_at_start_event() -> None:
    """A learning rate wrong from the first step: step 0 (before any update) is healthy and the first updates
    kill the units. The state is then an event at the step it was entered, measured against step 0, so the
    optimizer's first updates can explain it instead of the architecture."""
    dead = np.r_[0.125, 0.75, 0.75, 0.875, np.ones(96)]
    events = activation_events(run(h=dict(rms=np.ones(100), dead=dead)), settle=50)
    assert states(events) == [("h", "dead", 4, 99, False)]
    assert events[0].evidence[0].baseline == 0.125


def test_units_dead_at_step_0_stay_an_at_start_event_whatever_follows() -> None:
    dead = np.r_[0.95, 0.75, np.ones(98)]
    assert states(activation_events(run(h=dict(rms=np.ones(100), dead=dead)), settle=50)) == [
        ("h", "dead", 0, 99, True)]

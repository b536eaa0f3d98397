"""Gradient health on synthetic series: cross-layer ratio shifts, step-0 vanishing, legitimate decay."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from comgra_ndbg.analysis.config import Thresholds
from comgra_ndbg.analysis.gradient_health import gradient_events
from comgra_ndbg.analysis.series import build_series
from comgra_ndbg.analysis.synthetic import summary_rows

ROLES = {"early": "intermediate", "late": "intermediate", "out": "output"}


def series(early: np.ndarray, late: np.ndarray, out: np.ndarray):
    return build_series({("early", "grad"): summary_rows(rms=early), ("late", "grad"): summary_rows(rms=late),
                         ("out", "grad"): summary_rows(rms=out)}, roles=ROLES, kpis={})


def test_loss_going_to_zero_shrinks_every_gradient_1000x_without_an_event() -> None:
    decay = np.logspace(0, -3, 400)
    noise = np.exp(np.random.default_rng(0).normal(0, 0.2, 400))
    assert gradient_events(series(0.01 * decay * noise, 0.1 * decay, decay), settle=50) == []


def test_block_attenuating_from_step_200_makes_earlier_gradients_vanish() -> None:
    out = np.logspace(0, -1, 400)
    early, late = 0.01 * out, 0.1 * out
    early[200:] *= 1e-3
    events = gradient_events(series(early, late, out), settle=50)
    assert [(e.node, e.to_state, e.onset, e.end, e.at_start) for e in events] == [
        ("early", "vanishing", 200, 399, False)]
    assert round(events[0].magnitude, 6) == 3.0
    assert events[0].evidence[0].steps == (200, 201, 202)


def test_amplified_gradient_recovers_and_the_event_ends() -> None:
    out = np.ones(300)
    late = np.full(300, 0.1)
    late[150:170] *= 1e4
    [event] = gradient_events(series(np.full(300, 0.01), late, out), settle=50)
    assert (event.node, event.to_state, event.onset, event.end) == ("late", "exploding", 150, 169)


def test_brief_spike_of_two_steps_is_no_event() -> None:
    out = np.ones(300)
    late = np.full(300, 0.1)
    late[150:152] *= 1e4
    assert gradient_events(series(np.full(300, 0.01), late, out), settle=50) == []


def test_vanishing_from_step_0_is_an_at_start_event() -> None:
    out = np.ones(100)
    events = gradient_events(series(np.full(100, 1e-6), np.full(100, 1e-2), out), Thresholds(), settle=50)
    assert [(e.node, e.to_state, e.onset, e.end, e.at_start) for e in events] == [
        ("early", "vanishing", 0, 99, True)]


def test_settle_steps_hide_early_training_transients() -> None:
    out = np.ones(300)
    early = np.full(300, 1e-3)
    early[30:] = 0.1  # early training moves the ratio by 2 decades
    assert gradient_events(series(early, np.full(300, 0.1), out), settle=50) == []
    assert [e.onset for e in gradient_events(series(early, np.full(300, 0.1), out), settle=0)] == [30]


def test_a_node_whose_gradient_steps_down_is_a_sudden_shift() -> None:
    out = np.ones(300)
    late = np.full(300, 0.1)
    late[200:] *= 1e-2
    [event] = gradient_events(series(np.full(300, 0.01), late, out), settle=50)
    assert (event.node, event.to_state, event.onset, event.sudden) == ("late", "vanishing", 200, True)


def test_a_ratio_that_jumps_because_only_its_reference_jumped_is_no_sudden_shift() -> None:
    # gradient clipping caps every parameter's gradient; the output's gradient of a few noisy batches rises
    # 30x while the node's own gradient stays where it was: the ratio falls 1.5 decades in one step
    out = np.ones(300)
    out[200:204] = 30.0
    late = np.full(300, 0.1)
    [event] = gradient_events(series(np.full(300, 0.01) * out, late, out), settle=50)
    assert (event.node, event.to_state, event.onset, event.sudden) == ("late", "vanishing", 200, False)


def test_a_ratio_healthy_at_step_0_and_off_after_the_first_updates_is_no_at_start_event() -> None:
    """Step 0's gradients come from the untouched initialisation: when they are in band and only the first
    updates drive them 6 decades apart, the architecture is not at fault."""
    out = np.ones(100)
    early = np.r_[1e-2, np.full(99, 1e-8)]
    assert [e for e in gradient_events(series(early, np.full(100, 1e-2), out), Thresholds(), settle=50)
            if e.at_start] == []


def typed(early: np.ndarray, out: np.ndarray, types: np.ndarray):
    """A run whose steps come in ``types`` (aligned with the steps), as ``load_series`` reads them."""
    return replace(series(early, np.full(len(out), 1e-2), out), step_types=types)


def test_in_a_run_of_several_step_types_a_jump_is_measured_against_the_last_step_of_the_same_type() -> None:
    """Comgra's tutorial: steps cycle through sequences of 1 to 12 iterations, and the gradient reaching an
    early node is decades smaller after 12 than after 1, so it jumps whenever the type changes. A stretch of
    long sequences that drifts 1.5 decades as the network learns is then no *sudden* shift of the node —
    its own level matches the last step of its own type — while a real step change still is."""
    n, types = 360, np.array([f"{k:02d}_iterations" for k in range(1, 13)] * 30)
    length = np.array([int(t[:2]) for t in types])
    out = np.ones(n)
    early = 10.0 ** (-0.15 * length)  # 0.15 decades per iteration: 1.65 decades from the 1st type to the 12th
    drift = early.copy()
    drift[150:] *= 10.0 ** np.clip((np.arange(150, n) - 150) / 40, 0, 1.5)  # learning: long ones reach further
    events = gradient_events(typed(drift, out, types), settle=50)
    assert events and not any(e.sudden for e in events if e.node == "early")
    broken = early.copy()
    broken[200:] *= 1e-3  # something in the node cuts its gradient 1000x at step 200, whatever the type
    found = [e for e in gradient_events(typed(broken, out, types), settle=50) if e.node == "early"]
    assert [(e.to_state, e.onset, e.sudden) for e in found][:1] == [("vanishing", 200, True)]

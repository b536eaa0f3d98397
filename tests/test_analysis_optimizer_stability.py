"""Optimizer stability on synthetic series: update jumps, the optimizer cluster, LR schedules, loss spikes
and divergence (frozen layers: test_analysis_stagnation.py)."""
from __future__ import annotations

import numpy as np

from comgra_ndbg.analysis.optimizer_stability import OPTIMIZER, loss_events, optimizer_events
from comgra_ndbg.analysis.series import build_series
from comgra_ndbg.analysis.synthetic import summary_rows


def params(updates: dict[str, np.ndarray], grads: dict[str, np.ndarray] | None = None, loss=None):
    rows, roles = {}, {}
    for name, update in updates.items():
        n = len(update)
        rows[(name, "value")] = summary_rows(rms=np.ones(n))
        rows[(name, "update")] = summary_rows(rms=update)
        rows[(name, "grad")] = summary_rows(rms=(grads or {}).get(name, np.ones(n)))
        roles[name] = "parameter"
    kpis = {} if loss is None else {"loss": (np.arange(len(loss)), loss)}
    return build_series(rows, roles=roles, kpis=kpis)


def states(events):
    return [(e.node, e.to_state, e.onset, e.at_start) for e in events]


def test_learning_rate_jump_in_every_layer_is_one_optimizer_event() -> None:
    update = np.full(400, 1e-3)
    update[200:] = 1e-1
    events = optimizer_events(params({"a": update, "b": update.copy(), "c": update.copy()}), settle=50)
    assert states(events) == [("a", "unstable", 200, False), ("b", "unstable", 200, False),
                              ("c", "unstable", 200, False), (OPTIMIZER, "unstable", 200, False)]


def test_one_layer_jumping_is_not_the_optimizer() -> None:
    quiet = np.full(400, 1e-3)
    jump = quiet.copy()
    jump[200:] = 1e-1
    events = optimizer_events(params({"a": jump, "b": quiet, "c": quiet.copy()}), settle=50)
    assert states(events) == [("a", "unstable", 200, False)]


def test_warm_up_and_step_decay_are_legitimate() -> None:
    lr = np.minimum(1.0, (np.arange(400) + 1) / 50) * np.where(np.arange(400) >= 250, 0.1, 1.0)
    update = 1e-3 * lr
    assert optimizer_events(params({"a": update, "b": update.copy()}), settle=50) == []


def test_update_out_of_band_from_step_0() -> None:
    events = optimizer_events(params({"a": np.full(100, 0.5)}), settle=50)
    assert states(events) == [("a", "unstable", 0, True), (OPTIMIZER, "unstable", 0, True)]


def test_transient_spike_and_divergence_of_the_loss() -> None:
    loss = np.full(400, 1.0)
    loss[250] = 30.0
    s = build_series({}, roles={}, kpis={"loss": (np.arange(400), loss)})
    [spike] = loss_events(s, settle=50)
    assert (spike.to_state, spike.onset, spike.end, spike.magnitude) == ("spike", 250, 250, 30.0)
    loss[300:] = 1e4
    [spike, diverging] = loss_events(build_series({}, roles={}, kpis={"loss": (np.arange(400), loss)}), settle=50)
    assert (diverging.to_state, diverging.onset) == ("diverging", 300)


def test_a_spike_below_the_untrained_models_loss_is_a_noisy_batch_not_a_fault() -> None:
    loss = np.r_[np.linspace(2.3, 0.02, 100), np.full(100, 0.02)]
    noisy = loss.copy()
    noisy[150] = 0.3  # 15x a trained model's loss, far below the 2.3 it started at
    outlier = loss.copy()
    outlier[150] = 9.0  # worse than the untrained model: a corrupt batch
    assert loss_events(build_series({}, roles={}, kpis={"loss": (np.arange(200), noisy)})) == []
    [spike] = loss_events(build_series({}, roles={}, kpis={"loss": (np.arange(200), outlier)}))
    assert (spike.to_state, spike.onset) == ("spike", 150)


def test_a_loss_that_jumps_from_normal_to_diverging_in_one_step_is_sudden() -> None:
    loss = np.r_[np.linspace(2.0, 1.0, 120), np.full(80, 500.0)]
    [event] = loss_events(build_series({}, roles={}, kpis={"loss": (np.arange(200), loss)}))
    assert (event.to_state, event.onset, event.sudden) == ("diverging", 120, True)
    creeping = np.r_[np.linspace(2.0, 1.0, 120), np.logspace(0, 3, 30), np.full(50, 1000.0)]
    [event] = loss_events(build_series({}, roles={}, kpis={"loss": (np.arange(200), creeping)}))
    assert event.to_state == "diverging" and not event.sudden


def test_a_loss_that_goes_below_zero_has_no_ratio_events() -> None:
    """A WGAN critic's loss, D(fake) - D(real), hovers around 0 and changes sign: 50× its median is noise."""
    g = np.random.default_rng(0)
    critic = 0.01 * g.standard_normal(300)
    critic[200] = 0.5
    assert loss_events(build_series({}, roles={}, kpis={"loss": (np.arange(300), critic)})) == []
    assert len(loss_events(build_series({}, roles={}, kpis={"loss": (np.arange(300), np.abs(critic))}))) == 1


def test_a_spike_whose_update_left_damage_to_heal_is_still_one_batch() -> None:
    loss = np.r_[np.linspace(2.3, 0.02, 100), np.full(100, 0.02)]
    loss[150], loss[151:170] = 9.0, np.linspace(0.5, 0.05, 19)  # the bad batch, then a slow recovery
    [spike] = loss_events(build_series({}, roles={}, kpis={"loss": (np.arange(200), loss)}))
    assert (spike.to_state, spike.onset, spike.end) == ("spike", 150, 150)


def test_one_batch_ten_times_off_is_the_noise_of_a_loss_that_swings_twofold_at_every_step() -> None:
    """Batches of 2: the loss is 2× off its recent median at a typical step and one step in hundreds reaches
    15×; that step is no corrupt batch. In a loss that moves by a few percent the same step is."""
    g = np.random.default_rng(1)
    level = np.linspace(1.4, 0.7, 600)
    noisy = level * 10 ** (0.5 * g.standard_normal(600))
    noisy[400] = 15 * np.median(noisy[380:400])
    smooth = level * (1 + 0.03 * g.standard_normal(600))
    smooth[400] = 15 * np.median(smooth[380:400])
    assert [e.to_state for e in loss_events(build_series({}, roles={}, kpis={"loss": (np.arange(600), noisy)}))] == []
    [spike] = loss_events(build_series({}, roles={}, kpis={"loss": (np.arange(600), smooth)}))
    assert (spike.to_state, spike.onset) == ("spike", 400)

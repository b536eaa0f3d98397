"""Harm: the loss getting worse after an event, with its absolute floor, also where the loss sits at 0."""
from __future__ import annotations

import numpy as np

from comgra_ndbg.analysis.events import Event, Evidence
from comgra_ndbg.analysis.harm import harmful, loss_blew_up_from_start, loss_is_worse
from comgra_ndbg.analysis.series import build_series

STEPS = 300
ONSET = 160


def series(loss: np.ndarray | None):
    kpis = {} if loss is None else {"loss": (np.arange(STEPS), loss)}
    return build_series({}, roles={}, kpis=kpis)


def learned_exactly(after: np.ndarray | None = None) -> np.ndarray:
    """A loss that starts near 2, reaches exactly 0 by step 100 and stays there; ``after`` replaces the losses
    from ``ONSET`` on."""
    loss = np.r_[np.linspace(2.0, 0.0, 100), np.zeros(STEPS - 100)]
    if after is not None:
        loss[ONSET:ONSET + len(after)] = after
    return loss


def update_jump(onset: int = ONSET) -> Event:
    """A soft event: the optimizer's update/weight ratio rose 1.6 decades (no hard state by itself)."""
    return Event("optimizer_stability", "optimizer", "update", "stable", "unstable", onset, STEPS - 1, 1.6, 0.6,
                 (Evidence("w/update/l2÷value/l2", (onset,), (1e-2,)),))


def test_a_loss_at_0_picking_up_rounding_noise_is_not_worse() -> None:
    noise = np.zeros(40)
    noise[[2, 9, 17, 30]] = [6e-8, 4e-7, 4e-9, 3e-8]
    s = series(learned_exactly(noise))
    assert loss_is_worse(s, ONSET) is False
    assert harmful(update_jump(), [], s) is False


def test_a_loss_staying_at_0_is_not_worse() -> None:
    s = series(learned_exactly())
    assert loss_is_worse(s, ONSET) is False
    assert harmful(update_jump(), [], s) is False


def test_a_loss_leaving_0_for_a_real_loss_is_worse() -> None:
    s = series(learned_exactly(np.full(140, 0.8)))
    assert loss_is_worse(s, ONSET) is True
    assert harmful(update_jump(), [], s) is True


def test_a_loss_turning_non_finite_after_0_is_worse() -> None:
    after = np.zeros(40)
    after[5:] = np.inf
    assert loss_is_worse(series(learned_exactly(after)), ONSET) is True


def test_the_floor_still_holds_for_a_small_loss_that_doubles() -> None:
    loss = np.r_[np.linspace(2.0, 1e-7, 100), np.full(STEPS - 100, 1e-7)]
    loss[ONSET:] = 2e-7
    assert loss_is_worse(series(loss), ONSET) is False
    loss[ONSET:] = 1.5
    assert loss_is_worse(series(loss), ONSET) is True


def test_without_a_loss_harm_cannot_be_told_and_every_root_counts() -> None:
    s = series(None)
    assert loss_is_worse(s, ONSET) is None
    assert harmful(update_jump(), [], s) is True


def test_a_loss_at_0_from_the_first_step_that_stays_there_is_not_worse() -> None:
    assert loss_is_worse(series(np.zeros(STEPS)), ONSET) is False


def start_update_jump(end: int = 8) -> Event:
    """The optimizer's updates out of band from the first step (a learning rate wrong from the start)."""
    return Event("optimizer_stability", "optimizer", "update", "stable", "unstable", 0, end, 2.3, 0.9,
                 (Evidence("w/update/l2÷value/l2", (0,), (3.0,)),), at_start=True)


def test_updates_out_of_band_from_the_start_that_blow_the_loss_up_are_harm_though_it_falls_later() -> None:
    """The first window's median is the blown-up loss itself, so "learned since the start" would clear the
    root; the untrained model's loss at step 0 is the reference instead."""
    loss = np.r_[2.3, 4e6, 2e5, 2e5, 1.6e6, 1e5, np.linspace(1e4, 2.4, STEPS - 6)]
    assert loss_blew_up_from_start(series(loss), 8)
    assert harmful(start_update_jump(), [], series(loss))


def test_large_first_updates_under_which_the_loss_falls_are_no_harm() -> None:
    loss = np.r_[2.3, 2.5, 2.9, np.linspace(2.0, 0.1, STEPS - 3)]
    assert not loss_blew_up_from_start(series(loss), 8)
    assert not harmful(start_update_jump(), [], series(loss))


def test_without_step_0_recorded_there_is_no_untrained_loss_to_compare_with() -> None:
    loss = np.r_[2.3, 4e6, np.linspace(1e4, 2.4, STEPS - 2)]
    late = build_series({}, roles={}, kpis={"loss": (np.arange(STEPS) + 5, loss)})
    assert not loss_blew_up_from_start(late, 20)


def gradient_jump(onset: int = ONSET) -> Event:
    """A sudden gradient fall of 1.1 decades in one parameter node: hard by itself, as a changed backward is."""
    return Event("gradient_health", "emb.parameters", "grad", "stable", "vanishing", onset, onset + 10, 1.1, 0.5,
                 (Evidence("emb.parameters/grad/rms", (onset,), (1e-5,)),), sudden=True)


def test_a_gradient_jump_of_a_learned_task_is_batch_noise_unless_the_loss_follows() -> None:
    """At a loss of 3e-4 from 0.7 the few samples still wrong set the gradient's scale: a tenfold jump from one
    batch to the next is no broken backward pass — unless the loss gets worse after it. Before the task is
    learned the same jump stays harm by itself."""
    g = np.random.default_rng(0)
    learned = np.r_[np.linspace(0.7, 3e-4, 100), 3e-4 * (1 + 0.3 * g.random(STEPS - 100))]
    assert not harmful(gradient_jump(), [], series(learned))
    relapsed = learned.copy()
    relapsed[ONSET:] = 0.3
    assert harmful(gradient_jump(), [], series(relapsed))
    learning = np.r_[np.linspace(0.7, 0.2, STEPS)]
    assert harmful(gradient_jump(), [], series(learning))

"""The shared level-shift detector: onsets, hysteresis, censoring, slow drifts."""
from __future__ import annotations

import numpy as np

from comgra_ndbg.analysis.shift import level_shifts, log_level, rolling_median, runs

KW = dict(window=20, min_history=10, enter=1.0, exit=0.5, persist=3)


def test_a_step_down_is_one_censored_shift_with_its_onset() -> None:
    x = np.r_[np.zeros(40), np.full(30, -3.0)]
    [s] = level_shifts(x, **KW)
    assert (s.start, s.end, s.direction, s.censored) == (40, 69, -1, True)
    assert s.baseline == 0.0 and s.peak == 3.0


def test_a_brief_dip_is_not_a_shift() -> None:
    x = np.zeros(80)
    x[40:42] = -3.0  # two steps: shorter than persist
    assert level_shifts(x, **KW) == []


def test_recovery_ends_the_shift_after_persist_steps_back_within_exit() -> None:
    x = np.zeros(100)
    x[40:60] = 2.0
    [s] = level_shifts(x, **KW)  # and the recovery is not a shift downwards
    assert (s.start, s.end, s.direction, s.censored) == (40, 59, 1, False)
    x[62] = 2.0  # back inside before `persist` steps outside: the shift goes on
    [s] = level_shifts(x, **KW)
    assert (s.start, s.end) == (40, 62)


def test_hysteresis_keeps_the_state_between_exit_and_enter() -> None:
    x = np.zeros(100)
    x[40:45] = 1.5
    x[45:70] = 0.7  # below enter (1.0) but above exit (0.5): still shifted
    [s] = level_shifts(x, **KW)
    assert (s.start, s.end) == (40, 69)


def test_a_slow_drift_of_three_decades_is_no_shift() -> None:
    x = np.linspace(0, -3, 400)
    assert level_shifts(x, **KW) == []


def test_no_shift_before_min_history_and_nan_is_skipped() -> None:
    x = np.r_[np.zeros(5), np.full(4, 3.0)]  # fewer than min_history values before any index
    assert level_shifts(x, **KW) == []
    y = np.r_[np.zeros(30), np.nan, np.nan, np.full(10, 2.0)]
    [s] = level_shifts(y, **KW)
    assert s.start == 32


def test_helpers() -> None:
    assert log_level(np.array([100.0, 0.0, np.nan, -1.0]))[[0, 1]].tolist() == [2.0, -30.0]
    assert np.isnan(log_level(np.array([np.nan, -1.0]))).all()
    assert rolling_median(np.array([1.0, 2.0, 3.0, 4.0]), 2, 2).tolist()[2:] == [1.5, 2.5]
    assert runs(np.array([1, 1, 0, 1, 1, 1, 0], bool), 2) == [(0, 1), (3, 5)]


def test_a_step_change_jumps_the_whole_way_a_drift_creeps_across() -> None:
    step = np.r_[np.zeros(30), np.full(20, 2.0)]
    drift = np.r_[np.zeros(30), np.linspace(0.1, 4.0, 20)]
    [s] = level_shifts(step, window=20, min_history=10, enter=1, exit=0.5, persist=3)
    [d] = level_shifts(drift, window=20, min_history=10, enter=1, exit=0.5, persist=3)
    assert (s.start, s.jump) == (30, 2.0)
    assert d.jump < 0.3

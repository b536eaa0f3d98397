"""``benchmarks/bookkeeping_phases.py``: every step of the three loops is split into the same phases, the
phases add up to the step, the marked loops train as the unmarked ones do, and the medians are taken per
phase and, for the step, over the steps' totals."""
from __future__ import annotations

import time

import pytest
import torch

from benchmarks import bookkeeping_phases, overhead
from comgra_ndbg import open_recording


def test_the_clock_times_each_phase_from_the_end_of_the_one_before() -> None:
    clock = bookkeeping_phases.PhaseClock()
    started = time.perf_counter()
    clock.begin()
    for phase in overhead.PHASES:
        time.sleep(0.002)
        clock(phase)
    elapsed = time.perf_counter() - started
    assert list(clock.times) == list(overhead.PHASES)
    assert all(t >= 0.002 for t in clock.times.values())
    assert sum(clock.times.values()) == pytest.approx(elapsed, abs=1e-3)
    clock.begin()
    assert clock.times == {}


def test_every_step_of_every_loop_has_every_phase_and_the_loops_train_alike(tmp_path, overhead_models) -> None:
    data = overhead.make_data(12)
    steps = bookkeeping_phases.phase_lockstep(data, str(tmp_path), "t")
    assert set(steps) == set(bookkeeping_phases.VARIANTS)
    for times in steps.values():
        assert len(times) == 12
        assert all(list(t) == list(overhead.PHASES) and min(t.values()) >= 0 for t in times)
    assert len(overhead_models) == 3
    overhead.finish(overhead.training_steps(data, None))  # the same loop, no marks: a fourth model
    for model in overhead_models[:3]:  # marks, recording and the floor's passes change no update
        for p, q in zip(model.parameters(), overhead_models[3].parameters()):
            assert torch.equal(p, q)
    with open_recording(tmp_path / "t") as recording:
        assert recording.steps.tolist() == list(range(12))


def test_medians_per_phase_and_of_the_steps_totals() -> None:
    phases = overhead.PHASES
    one = dict.fromkeys(phases, 1.0)
    slow_start = dict(one, start=10.0)
    slow_end = dict(one, end=10.0)
    steps = {"bare": [one] * 3 + [slow_start, slow_start, slow_end]}
    medians = bookkeeping_phases.phase_medians(steps, skip=1)  # steps kept: one, one, start, start, end
    assert medians["bare"]["start"] == 1.0
    assert medians["bare"]["end"] == 1.0
    assert medians["bare"]["step"] == len(phases) + 9.0  # the median total, not the sum of the medians

"""Drift of parameter summaries between steps (``stats/drift.py``): the compiled pass against the numpy one
on random rows, and what each finding means."""
from __future__ import annotations

import numpy as np
import pytest

from comgra_ndbg.stats import drift
from comgra_ndbg.stats.drift import BEYOND, NONFINITE, STOPPED, DriftState
from comgra_ndbg.stats.fields import FIELD, NUM_FIELDS


def _rows(rng, n):
    rows = np.zeros((n, NUM_FIELDS))
    w = rng.normal(size=(n, 32))
    rows[:, FIELD["count"]] = 32
    rows[:, FIELD["sum"]], rows[:, FIELD["sum_sq"]] = w.sum(1), (w * w).sum(1)
    rows[:, FIELD["sum_abs"]], rows[:, FIELD["min"]], rows[:, FIELD["max"]] = np.abs(w).sum(1), w.min(1), w.max(1)
    return rows, w


def _observe(rows, state, compare, allowed, compiled):
    limits = allowed if allowed is not None else np.zeros((state.n, 2))
    run = drift._observe if compiled else drift._observe_numpy
    found = run(np.ascontiguousarray(rows), state.facts, state.moving, limits, 0.01, compare,
                compare and state.moving_known, allowed is not None)
    state.moving_known = compare
    return int(found)


@pytest.mark.skipif(not drift.AVAILABLE, reason="numba unavailable: only the numpy pass exists")
def test_the_compiled_pass_finds_what_the_numpy_pass_finds():
    rng = np.random.default_rng(0)
    for trial in range(300):
        n = int(rng.integers(1, 6))
        states = [DriftState(n), DriftState(n)]
        rows, w = _rows(rng, n)
        allowed = None if rng.random() < 0.2 else np.abs(rng.normal(size=(n, 2))) * 0.1
        for step in range(6):
            if step:
                change = rng.normal(size=w.shape) * 10.0 ** rng.uniform(-4, 1)
                change[rng.random(n) < 0.3] = 0.0  # some parameters do not move
                w = w + change
                rows, _ = _rows(np.random.default_rng(0), n)
                rows[:, FIELD["sum"]], rows[:, FIELD["sum_sq"]] = w.sum(1), (w * w).sum(1)
                rows[:, FIELD["sum_abs"]], rows[:, FIELD["min"]] = np.abs(w).sum(1), w.min(1)
                rows[:, FIELD["max"]] = w.max(1)
                if rng.random() < 0.05:
                    rows[0, FIELD["nan"]] = 1
            compare = step > 0 and rng.random() < 0.9
            found = [_observe(rows, s, compare, allowed, compiled) for s, compiled in zip(states, (True, False))]
            assert found[0] == found[1], (trial, step)
            np.testing.assert_array_equal(states[0].facts, states[1].facts)
            np.testing.assert_array_equal(states[0].moving, states[1].moving)


@pytest.mark.parametrize("compiled", [True, False] if drift.AVAILABLE else [False])
def test_what_the_findings_mean(monkeypatch, compiled):
    monkeypatch.setattr(drift, "AVAILABLE", compiled)
    rng = np.random.default_rng(1)
    rows, w = _rows(rng, 2)
    state = DriftState(2)
    allowed = np.full((2, 2), 0.05)
    assert state.observe(rows, compare=False, allowed=allowed, fraction=0.01) == 0
    moved = rows.copy()
    moved[:, FIELD["sum"]] += 1e-3  # both move a little
    assert state.observe(moved, compare=True, allowed=allowed, fraction=0.01) == 0
    still = moved.copy()
    still[0, FIELD["sum"]] += 1e-3  # the second stays exactly where it was
    assert state.observe(still, compare=True, allowed=allowed, fraction=0.01) == STOPPED
    edited = still.copy()
    edited[:, FIELD["sum"]] += 1e-3
    edited[1, FIELD["sum_sq"]] *= 900.0  # 30x the norm: far beyond what it may move
    edited[1, FIELD["max"]] *= 30.0
    assert state.observe(edited, compare=True, allowed=allowed, fraction=0.01) == BEYOND
    assert state.observe(edited, compare=False, allowed=allowed, fraction=0.01) == 0  # nothing to compare with
    again = edited.copy()
    again[:, FIELD["sum"]] += 1e-3
    again[0, FIELD["max"]] += 10.0
    assert state.observe(again, compare=True, allowed=allowed, fraction=0.01) == BEYOND
    assert state.observe(again, compare=True, allowed=None, fraction=0.01) == STOPPED
    bad = again.copy()
    bad[1, FIELD["inf"]] = 2
    assert state.observe(bad, compare=True, allowed=allowed, fraction=0.01) == NONFINITE

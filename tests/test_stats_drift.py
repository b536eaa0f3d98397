"""Drift of parameter summaries between steps (``stats/drift.py``): the compiled pass against the numpy one
on random rows, and what each finding means."""
from __future__ import annotations

import numpy as np
import pytest

from comgra_ndbg.stats import drift
from comgra_ndbg.stats.backend import entries
from comgra_ndbg.stats.drift import BEYOND, JUMPED, NONFINITE, STOPPED, DriftState, gradients_moved
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
    run = entries().observe if compiled else drift._observe_numpy
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
                if rng.random() < 0.1:  # facts that moved by a few ulps: within STILL of their magnitude or not
                    k = FIELD[str(rng.choice(["sum", "sum_sq", "sum_abs", "min", "max"]))]
                    rows[:, k] = state_facts_moved(rng, states[0], k, rows[:, k])
                if rng.random() < 0.03:
                    rows[int(rng.integers(n)), FIELD[str(rng.choice(["sum", "sum_abs", "max"]))]] = \
                        rng.choice([np.nan, np.inf, -np.inf])
            compare = step > 0 and rng.random() < 0.9
            found = [_observe(rows, s, compare, allowed, compiled) for s, compiled in zip(states, (True, False))]
            assert found[0] == found[1], (trial, step)
            np.testing.assert_array_equal(states[0].facts, states[1].facts)
            np.testing.assert_array_equal(states[0].moving, states[1].moving)


def state_facts_moved(rng, state, field, now):
    """``now``'s facts ``field`` replaced by the state's previous ones moved by 0 to 12 ulps of float32."""
    k = [FIELD[f] for f in ("sum", "sum_sq", "sum_abs", "min", "max")].index(field)
    before = state.facts[:, k]
    return before + rng.integers(0, 13, size=len(before)) * np.spacing(np.abs(before).astype(np.float32)) \
        * rng.choice([-1.0, 1.0], size=len(before))


def _float32_rows(w):
    """Value rows of float32 parameters ``w`` ``[n, size]``, with float32 sums as the kernels take them."""
    w = w.astype(np.float32)
    rows = np.zeros((len(w), NUM_FIELDS))
    rows[:, FIELD["count"]] = w.shape[1]
    rows[:, FIELD["sum"]], rows[:, FIELD["sum_sq"]] = w.sum(1, dtype=np.float32), (w * w).sum(1, dtype=np.float32)
    rows[:, FIELD["sum_abs"]] = np.abs(w).sum(1, dtype=np.float32)
    rows[:, FIELD["min"]], rows[:, FIELD["max"]] = w.min(1), w.max(1)
    return rows


@pytest.mark.parametrize("compiled", [True, False] if drift.AVAILABLE else [False])
def test_a_parameter_moving_at_the_resolution_of_its_values_is_not_seen_to_stop(monkeypatch, compiled):
    """Updates at the float32 resolution of a parameter's values move an extreme or a sum by an ulp at some
    steps and by none at others: that is neither a parameter that stops nor one that starts again; one that
    moved by a real update and then stays where it is has stopped."""
    monkeypatch.setattr(drift, "AVAILABLE", compiled)
    rng = np.random.default_rng(3)
    w = rng.normal(size=(3, 200)).astype(np.float32)
    w[2] -= w[2].mean()  # a parameter whose sum nearly cancels: its rounding is that of the sum of magnitudes
    state = DriftState(3)
    assert state.observe(_float32_rows(w), compare=False, allowed=None, fraction=0.01) == 0
    found = []
    for step in range(16):
        if step % 2 == 0:  # an ulp up of each parameter's largest element and of two more, at every other step
            for i in range(3):
                for j in (int(w[i].argmax()), 5, 77):
                    w[i, j] = np.nextafter(w[i, j], np.float32(np.inf))
        found.append(state.observe(_float32_rows(w), compare=True, allowed=None, fraction=0.01))
    assert found == [0] * 16
    assert not state.moving.any()
    w = w + np.float32(1e-3)
    assert state.observe(_float32_rows(w), compare=True, allowed=None, fraction=0.01) == 0
    assert state.moving.all()
    w[1] = w[1] + np.float32(1e-3)  # the others stay exactly where they were
    assert state.observe(_float32_rows(w), compare=True, allowed=None, fraction=0.01) == STOPPED
    assert state.moving.tolist() == [False, True, False]


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


def _gradient_rows(rng, n):
    rows = np.zeros((n, NUM_FIELDS))
    rows[:, FIELD["sum_sq"]] = 10.0 ** rng.uniform(-6, 3, size=n)
    rows[rng.random(n) < 0.1, FIELD["sum_sq"]] = 0.0  # a gradient that is exactly zero
    if rng.random() < 0.1:
        rows[int(rng.integers(n)), FIELD["nan" if rng.random() < 0.5 else "inf"]] = 1
    if rng.random() < 0.05:
        rows[int(rng.integers(n)), FIELD["sum_sq"]] = np.inf if rng.random() < 0.5 else np.nan
    if rng.random() < 0.05 and n > 1:
        rows[:, FIELD["sum_sq"]] = 1e308  # every norm finite, their sum is not
    return rows


@pytest.mark.skipif(not drift.AVAILABLE, reason="numba unavailable: only the numpy pass exists")
def test_the_compiled_gradient_pass_finds_what_the_numpy_pass_finds(monkeypatch):
    rng = np.random.default_rng(2)
    found = {0: 0, NONFINITE: 0, JUMPED: 0}
    for trial in range(400):
        n = int(rng.integers(1, 8))
        norms = [np.zeros(n), np.zeros(n)]
        for step in range(5):
            rows = _gradient_rows(rng, n)
            compare = step > 0 and rng.random() < 0.9
            results = []
            for compiled, state in zip((True, False), norms):
                monkeypatch.setattr(drift, "AVAILABLE", compiled)
                results.append(gradients_moved(rows, state, compare, 100.0))
            assert results[0] == results[1], (trial, step, rows[:, FIELD["sum_sq"]])
            np.testing.assert_array_equal(norms[0], norms[1])
            found[results[0]] += 1
    assert min(found.values()) > 50  # every finding was met often


@pytest.mark.parametrize("compiled", [True, False] if drift.AVAILABLE else [False])
def test_what_the_gradient_findings_mean(monkeypatch, compiled):
    monkeypatch.setattr(drift, "AVAILABLE", compiled)
    rows, norms = np.zeros((2, NUM_FIELDS)), np.zeros(2)
    rows[:, FIELD["sum_sq"]] = [1.0, 4.0]
    assert gradients_moved(rows, norms, False, 100.0) == 0 and norms.tolist() == [1.0, 4.0]
    rows[:, FIELD["sum_sq"]] = [90.0, 0.05]  # each within 100x of the step before, either way
    assert gradients_moved(rows, norms, True, 100.0) == 0
    rows[:, FIELD["sum_sq"]] = [90.0, 0.0]  # to exactly 0
    assert gradients_moved(rows, norms, True, 100.0) == JUMPED
    rows[:, FIELD["sum_sq"]] = [90.0, 1e-9]  # from exactly 0, but not compared (not the step before)
    assert gradients_moved(rows, norms, False, 100.0) == 0
    rows[:, FIELD["sum_sq"]] = [7.0, 3.0]
    rows[0, FIELD["nan"]] = 3
    assert gradients_moved(rows, norms, True, 100.0) == NONFINITE
    assert norms.tolist() == [7.0, 3.0]  # the norms now, whatever was found


@pytest.mark.parametrize("compiled", [True, False] if drift.AVAILABLE else [False])
def test_norms_of_another_length_are_refused_not_written_past(monkeypatch, compiled):
    monkeypatch.setattr(drift, "AVAILABLE", compiled)
    rows, big = np.ones((5, NUM_FIELDS)), np.zeros(5)
    with pytest.raises(ValueError, match="5 values"):
        gradients_moved(rows, big[:2], False, 100.0)
    with pytest.raises(ValueError, match="5 values"):
        gradients_moved(rows, big[::2], False, 100.0)
    assert big.tolist() == [0.0] * 5  # nothing was written

"""The Platt calibration: weighted fits, the per-run weights of ranked hypotheses, and how diagbench fits
its leave-one-family-out constants with them (hand-made records, no training)."""
from __future__ import annotations

import numpy as np
import pytest

from benchmarks.diagbench.lofo import fit_calibration
from comgra_ndbg.analysis.calibration import calibrated_confidence, fit_platt, run_weights


def _record(name: str, hypotheses: list[tuple[str, tuple[float, ...]]]) -> dict:
    truth = {"type": "vanishing", "origin": "node", "nodes": ["blocks.2"], "t0": 100}
    found = [{"type": t, "origin": "node", "node": "model.blocks.2.fc1", "onset": 100, "confidence": 0.5,
              "features": list(f), "sentence": t, "chain": []} for t, f in hypotheses]
    return {"name": name, "family": "f", "healthy": False, "valid": True, "truth": truth, "effects": {},
            "analysis": {"default": {"hypotheses": found, "seconds": 0.1}}, "B0": None, "B1": None}


def test_a_sample_weight_of_two_fits_like_the_row_repeated() -> None:
    x = np.array([[0.0, 1.0], [1.0, 0.5], [2.0, 0.0], [0.5, 0.2], [1.5, 1.0]])
    y = np.array([0.0, 1.0, 1.0, 0.0, 0.0])
    weighted = fit_platt(x, y, sample_weight=np.array([1.0, 2.0, 1.0, 1.0, 2.0]))
    repeated = fit_platt(np.r_[x, x[[1, 4]]], np.r_[y, y[[1, 4]]])
    np.testing.assert_allclose(weighted[0], repeated[0], atol=1e-8)
    assert weighted[1] == pytest.approx(repeated[1], abs=1e-8)
    assert fit_platt(x, y, sample_weight=np.ones(5)) == fit_platt(x, y)


def test_run_weights_count_the_top_hypothesis_once_and_the_alternatives_once_together() -> None:
    assert run_weights(0) == [] and run_weights(1) == [1.0]
    for n in range(2, 6):
        weights = run_weights(n)
        assert len(weights) == n and weights[0] == 1.0 and sum(weights[1:]) == pytest.approx(1.0)


def test_repeating_a_runs_alternatives_does_not_change_the_fit() -> None:
    """Four copies of a run's wrong alternative say what one says: the fitted constants stay the same,
    where counting every hypothesis alone would pull the top hypotheses' confidence down."""
    right, wrong = ("vanishing", (1.0, 0.0)), ("exploding", (1.0, 1.0))
    lone_right, weak_wrong = ("vanishing", (0.0, 0.0)), ("dead_units", (0.0, 0.0))
    once = [_record(f"a{i}", [right, wrong]) for i in range(6)] + \
        [_record(f"b{i}", [weak_wrong]) for i in range(3)] + [_record(f"c{i}", [lone_right]) for i in range(3)]
    repeated = [_record(f"a{i}", [right, wrong, wrong, wrong, wrong]) for i in range(6)] + once[6:]
    (w_once, b_once), rows_once = fit_calibration(once)
    (w_rep, b_rep), rows_rep = fit_calibration(repeated)
    assert (rows_once, rows_rep) == (18, 36)
    np.testing.assert_allclose(w_once, w_rep, atol=1e-8)
    assert b_once == pytest.approx(b_rep, abs=1e-8)
    unweighted = fit_platt(np.array([h["features"] for r in repeated for h in r["analysis"]["default"]["hypotheses"]]),
                           np.array([float(h["type"] == "vanishing") for r in repeated
                                     for h in r["analysis"]["default"]["hypotheses"]]))
    top = right[1]
    assert calibrated_confidence(top, weights=w_rep, bias=b_rep) > \
        calibrated_confidence(top, weights=unweighted[0], bias=unweighted[1]) + 0.05


def test_a_single_class_gives_a_constant_instead_of_a_fit() -> None:
    records = [_record("a", [("exploding", (1.0,)), ("dead_units", (0.0,)), ("saturation", (0.0,))]),
               _record("b", [("exploding", (1.0,))])]
    constant, rows = fit_calibration(records)
    assert constant == 0.0 and rows == 4
    assert fit_calibration([]) == (0.5, 0)

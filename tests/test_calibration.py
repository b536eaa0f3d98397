"""The Platt calibration: weighted fits, the weights of ranked hypotheses, and how diagbench fits
its leave-one-family-out constants with them (hand-made records, no training)."""
from __future__ import annotations

import numpy as np
import pytest

from benchmarks.diagbench.lofo import fit_calibration
from comgra_ndbg.analysis.calibration import TOP_WEIGHT, calibrated_confidence, fit_platt, rank_weights
from comgra_ndbg.errors import InvalidArgumentError


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
    for bad in (np.ones(4), np.array([1.0, -1.0, 1.0, 1.0, 1.0]), np.array([1.0, np.nan, 1.0, 1.0, 1.0])):
        with pytest.raises(InvalidArgumentError, match="one finite, non-negative weight per label"):
            fit_platt(x, y, sample_weight=bad)


def test_rank_weights_give_the_top_hypothesis_more_weight_than_each_alternative() -> None:
    assert rank_weights(0) == [] and rank_weights(1) == [TOP_WEIGHT]
    assert rank_weights(4) == [TOP_WEIGHT, 1.0, 1.0, 1.0] and TOP_WEIGHT > 1.0
    assert rank_weights(2, top_weight=3.0) == [3.0, 1.0]


def _rows(records: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    found = [h for r in records for h in r["analysis"]["default"]["hypotheses"]]
    return np.array([h["features"] for h in found]), np.array([float(h["type"] == "vanishing") for h in found])


def test_fit_calibration_weighs_each_top_hypothesis_as_top_weight_alternatives() -> None:
    """The fit equals an unweighted fit in which every top hypothesis appears TOP_WEIGHT times (2), and where
    wrong alternatives share the features of right top hypotheses, those top hypotheses come out more
    confident than in a fit that counts every hypothesis alike."""
    assert TOP_WEIGHT == 2.0
    right, weak_wrong = ("vanishing", (1.0, 0.0)), ("exploding", (1.0, 0.0))
    strong_wrong, lone_right = ("dead_units", (0.0, 1.0)), ("vanishing", (0.0, 0.0))
    runs = [[right, weak_wrong, weak_wrong]] * 6 + [[strong_wrong]] * 4 + [[lone_right]] * 4
    records = [_record(f"r{i}", hypotheses) for i, hypotheses in enumerate(runs)]
    (weights, bias), rows = fit_calibration(records)
    assert rows == 26
    tops = [_record(f"top{i}", hypotheses[:1]) for i, hypotheses in enumerate(runs)]
    x, y = _rows(records + tops)
    repeated = fit_platt(x, y)
    np.testing.assert_allclose(weights, repeated[0], atol=1e-8)
    assert bias == pytest.approx(repeated[1], abs=1e-8)
    alike = fit_platt(*_rows(records))
    assert calibrated_confidence(right[1], weights=weights, bias=bias) > \
        calibrated_confidence(right[1], weights=alike[0], bias=alike[1]) + 0.05


def test_a_single_class_gives_a_constant_instead_of_a_fit() -> None:
    records = [_record("a", [("exploding", (1.0,)), ("dead_units", (0.0,)), ("saturation", (0.0,))]),
               _record("b", [("exploding", (1.0,))])]
    constant, rows = fit_calibration(records)
    assert constant == 0.0 and rows == 4
    assert fit_calibration([]) == (0.5, 0)

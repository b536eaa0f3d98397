"""Updates lost to rounding: half-precision weights that an optimizer updates in place.

A ``bfloat16`` weight holds 8 significant bits: an update below half a unit in the last place of the weight
(2⁻⁹ of its magnitude, 1/512) rounds away and the weight stays where it was. ``model.to(torch.bfloat16)``
with plain SGD at a usual learning rate loses most updates this way — training crawls while every gradient
is there. Mixed-precision training keeps float32 weights (``torch.autocast``), whose updates are kept.

The recording shows it directly: the share of a parameter node's update elements that are exactly 0,
against the share of its gradient's — an element with a gradient that did not move lost its update. A
half-precision parameter node (``NodeInfo.dtype`` ``bfloat16`` or ``float16``) whose lost share has a median
of at least :data:`LOST_SHARE` over the run has lost its updates; the finding names the first such node in
the recording's order and dates it at the first step its share reached that level.

>>> import numpy as np
>>> lost_shares(np.array([0.9, 0.8, np.nan]), np.array([0.05, 0.0, 0.1]))
array([0.85, 0.8 ,  nan])
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from comgra_ndbg.analysis.series import RunSeries

__all__ = ["LostUpdates", "lost_updates", "lost_shares", "LOST_SHARE", "HALF_DTYPES"]

LOST_SHARE = 0.25
"""Median share of a node's elements with a gradient whose update was exactly 0 that makes its updates lost."""
HALF_DTYPES = ("bfloat16", "float16")
MIN_STEPS = 5


@dataclass(frozen=True)
class LostUpdates:
    """Half-precision parameter nodes that lose their updates: the first, when, its median share, all."""

    node: str
    onset: int
    share: float
    dtype: str
    nodes: tuple[str, ...]


def lost_shares(update_zero: np.ndarray, grad_zero: np.ndarray) -> np.ndarray:
    """Per step, the share of elements whose update was exactly 0 beyond those whose gradient was (NaN where
    either is unknown)."""
    return np.asarray(update_zero, dtype=np.float64) - np.asarray(grad_zero, dtype=np.float64)


def lost_updates(series: RunSeries) -> LostUpdates | None:
    """The half-precision parameter nodes of ``series`` whose updates round away (module docstring)."""
    found: list[tuple[str, int, float, str]] = []
    for node in series.parameters:
        dtype = series.node_info(node.name).dtype
        if dtype not in HALF_DTYPES or not (node.has("update") and node.has("grad")):
            continue
        lost = lost_shares(node.stats["update"]["zero_fraction"], node.stats["grad"]["zero_fraction"])
        known = np.isfinite(lost)
        if known.sum() < MIN_STEPS or np.median(lost[known]) < LOST_SHARE:
            continue
        first = int(np.flatnonzero(known & (lost >= LOST_SHARE))[0])
        found.append((node.name, int(series.steps[first]), float(np.median(lost[known])), dtype))
    if not found:
        return None
    name, _, share, dtype = found[0]
    return LostUpdates(name, min(onset for _, onset, _, _ in found), share, dtype, tuple(n for n, *_ in found))

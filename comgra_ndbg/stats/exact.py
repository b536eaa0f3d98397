"""The careful paths behind the fast summaries of ``reducer`` and ``host``: the float64 recompute of rows
that a fast path flags (NaN, ±Inf, float32 overflow, sums that cancel), the tests that decide it, the dtype
every reduction works in, and the numpy summary used where numba is missing.
"""
from __future__ import annotations

import numpy as np
import torch

from comgra_ndbg.stats.fields import FIELD

__all__ = ["cancels", "exact_moments", "exact_spread", "reduce_host", "row_cancels", "underflows", "work_view"]

_SPREAD = [FIELD[f] for f in ("spread_count", "spread_sum_sq", "spread_dev_sq")]


def work_view(x: torch.Tensor) -> torch.Tensor:
    """A flat view in a dtype whose reductions neither overflow early nor lose integer exactness (and with a
    lazy negation or conjugation applied: the memory of such a view holds the other sign)."""
    if x.is_neg() or x.is_conj():
        x = x.resolve_neg().resolve_conj()
    if x.dtype is torch.float32 or x.dtype is torch.float64:
        return x.reshape(-1)
    if x.is_complex():
        x = x.abs()
    if x.dtype in (torch.float32, torch.float64):
        return x.reshape(-1)
    if x.is_floating_point():
        return x.reshape(-1).float()
    return x.reshape(-1).double()


_UINT_VIEW = {np.dtype(np.float32): np.uint32, np.dtype(np.float64): np.uint64}


_ONES: dict[np.dtype, np.ndarray] = {}


def _ones(dtype: np.dtype, size: int) -> np.ndarray:
    """A cached vector of ones: sums as BLAS dot products run about twice as fast as ``ndarray.sum``."""
    ones = _ONES.get(dtype)
    if ones is None or len(ones) < size:
        ones = _ONES[dtype] = np.ones(max(size, 2 * len(ones) if ones is not None else 1 << 16), dtype=dtype)
    return ones[:size]


def reduce_host(a: np.ndarray, row: np.ndarray, batch: int, bounds: tuple[float, float] | None,
                 saturation_margin: float) -> None:
    """The statistics of a flat CPU array (seen as ``[batch, units]`` when ``batch``) with numpy, where numba is
    missing: no per-op dispatch cost and no device to sync.

    Zeros are counted on the bit pattern of |x| (``-0.0`` becomes ``+0.0`` under abs), which is several
    times faster than a floating-point comparison and exact. Sums are BLAS dot products with ones.
    """
    absolute = np.abs(a)
    ones = _ones(a.dtype, a.size)
    row[FIELD["sum"]] = np.dot(a, ones)
    row[FIELD["sum_sq"]] = np.dot(a, a)
    row[FIELD["sum_abs"]] = np.dot(absolute, ones)
    row[FIELD["min"]] = a.min()
    row[FIELD["max"]] = a.max()
    row[FIELD["zeros"]] = a.size - np.count_nonzero(absolute.view(_UINT_VIEW[a.dtype]))
    if batch:
        per_unit = absolute.reshape(batch, -1)
        row[FIELD["units"]] = per_unit.shape[1]
        row[FIELD["dead_units"]] = per_unit.shape[1] - np.count_nonzero(per_unit.max(axis=0))
    if bounds is not None:
        lo, hi = bounds
        margin = saturation_margin * (hi - lo)
        mask = (a <= lo + margin) | (a >= hi - margin)
        row[FIELD["bounded"]] = a.size
        row[FIELD["saturated"]] = np.count_nonzero(mask)
        if batch:
            row[FIELD["saturated_units"]] = np.count_nonzero(mask.reshape(batch, -1).all(axis=0))
    if batch > 1:  # in float64, two passes: NaN and Inf make it non-finite, and the caller recomputes the row
        wide = a.reshape(batch, -1).astype(np.float64)
        row[_SPREAD] = a.size, np.dot(wide.reshape(-1), wide.reshape(-1)), batch * wide.var(axis=0).sum()


def row_cancels(row: np.ndarray) -> bool:
    """``cancels`` for one row, in plain floats (numpy's scalar machinery costs more than the test)."""
    n, s, q = float(row[FIELD["count"]]), float(row[FIELD["sum"]]), float(row[FIELD["sum_sq"]])
    return n > 1 and q > 0 and q - s * s / n < 1e-2 * q


def underflows(row: np.ndarray, dtype: np.dtype) -> bool:
    """Whether squares of the row's elements, taken in ``dtype``, may fall below its smallest normal number
    by more than 1e-7 of the largest square (what ``kernels`` flag too): the float32 squares of a vanishing
    gradient of 1e-24 are 0, and its rms read 0.

    >>> from comgra_ndbg.stats.fields import NUM_FIELDS
    >>> row = np.zeros(NUM_FIELDS); row[FIELD["count"]], row[FIELD["min"]], row[FIELD["max"]] = 100, -1e-20, 2e-20
    >>> underflows(row, np.dtype(np.float32)), underflows(row, np.dtype(np.float64))
    (True, False)
    """
    peak = max(abs(float(row[FIELD["min"]])), abs(float(row[FIELD["max"]])))
    return 0 < peak < np.inf and peak * peak < float(row[FIELD["count"]]) * float(np.finfo(dtype).tiny) * 1e7


def cancels(rows: np.ndarray, tolerance: float = 1e-2) -> np.ndarray:
    """Rows whose float32 sums cannot resolve the variance: when |mean| exceeds about 10 std, Σx²/n - mean²
    cancels catastrophically (a LayerNorm gain of 1 ± 1e-4 came out with std 0), so they get the exact
    float64 recompute. Sums taken in float64 hold out to a ``tolerance`` of about 1e-8."""
    s, q, n = rows[..., FIELD["sum"]], rows[..., FIELD["sum_sq"]], rows[..., FIELD["count"]]
    with np.errstate(all="ignore"):
        return (n > 1) & (q > 0) & (q - s * s / np.maximum(n, 1) < tolerance * q)


def exact_moments(tensor: torch.Tensor, row: np.ndarray, batch: int = 0) -> None:
    """Recompute counts of NaN/Inf/zeros and the moments of the finite elements, in float64, and with a
    ``batch`` size (0: batch-less) the sample spread."""
    flat = work_view(tensor).double()
    finite = torch.isfinite(flat)
    nan = torch.isnan(flat).sum()
    values = flat[finite]
    stats = torch.stack([
        (flat == 0).sum().double(),
        nan.double(),
        (~finite).sum().double() - nan.double(),
        values.sum(),
        torch.dot(values, values),
        values.abs().sum(),
    ]).cpu().numpy()
    row[FIELD["zeros"]], row[FIELD["nan"]], row[FIELD["inf"]] = stats[0], stats[1], stats[2]
    row[FIELD["sum"]], row[FIELD["sum_sq"]], row[FIELD["sum_abs"]] = stats[3:6]
    if values.numel():
        low, high = torch.aminmax(values)
        row[FIELD["min"]], row[FIELD["max"]] = float(low), float(high)
    else:
        row[FIELD["min"]], row[FIELD["max"]] = np.inf, -np.inf
    if batch:
        exact_spread(flat, batch, row)


def exact_spread(flat: torch.Tensor, batch: int, row: np.ndarray) -> None:
    """The sample-spread fields of a batched tensor from its float64 elements ``flat``, in two passes: over
    the units with no NaN or ±Inf in any sample, the elements, their Σx², and their squared deviations from
    their unit's mean over the batch. Fewer than 2 samples leave the fields at 0: the spread is unknown."""
    if batch < 2 or flat.numel() == 0:
        row[_SPREAD] = 0.0
        return
    units = flat.view(batch, -1)
    kept = units[:, torch.isfinite(units).all(0)]
    centred = kept - kept.mean(0)
    sums = torch.stack([(kept * kept).sum(), (centred * centred).sum()]).cpu().numpy()
    row[_SPREAD] = kept.numel(), sums[0], sums[1]

"""Moments of many small device tensors in a handful of kernel launches.

On a GPU every reduction is a kernel launch, and a launch costs more than the arithmetic of a small
tensor: summarising a model's parameters, gradients and updates one tensor at a time takes about eight
launches per tensor. Here the tensors of one device and dtype are concatenated into one float64 vector and
reduced per segment with ``torch.segment_reduce`` (CUB's segmented reduction on CUDA; atomics into one
output per tensor serialise and ran a hundred times slower): about a dozen launches for all of them. Sums in
float64 also keep Σx² from cancelling for tensors whose mean dwarfs their spread (LayerNorm gains).
Tensors above ``SEGMENT_MAX`` elements, whose arithmetic outweighs a launch, keep their own reductions, and
``CHUNK`` bounds the float64 copies (the sums reduce five of them at once).

>>> a = torch.tensor([1.0, -2.0, 0.0], dtype=torch.float64)
>>> b = torch.tensor([[0.0, 0.995], [0.0, -0.2]], dtype=torch.float64)
>>> rows = segment_moments([a, b], batches=[0, 2], thresholds=[None, (-0.99, 0.99)])
>>> rows[:, :6].round(decimals=6).tolist()
[[-1.0, 5.0, 3.0, -2.0, 1.0, 2.0], [0.795, 1.030025, 1.195, -0.2, 0.995, 2.0]]
>>> rows[1, DEAD].item(), rows[1, SATURATED].item(), rows[1, SATURATED_UNITS].item()
(1.0, 1.0, 0.0)
>>> round(rows[1, SPREAD].item(), 9)  # unit 1: 0.995 and -0.2 lie 0.5975 from their mean
0.7140125
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

__all__ = ["CHUNK", "SEGMENT_MAX", "SUM", "SUM_SQ", "SUM_ABS", "MIN", "MAX", "NONZERO", "DEAD", "SATURATED",
           "SATURATED_UNITS", "SPREAD", "chunks", "segmentable", "segment_moments"]

SEGMENT_MAX = 1 << 18
"""Tensors with more elements are reduced on their own (a segment is one thread block's work)."""
CHUNK = 1 << 21
"""Elements concatenated per ``segment_moments`` call (a float64 copy per statistic, six at most: 96 MiB)."""
SUM, SUM_SQ, SUM_ABS, MIN, MAX, NONZERO, DEAD, SATURATED, SATURATED_UNITS, SPREAD = range(10)  # the columns

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def segmentable(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` goes through ``segment_moments``: a small, non-empty floating-point tensor off the
    host (host tensors have their compiled kernels), strided (not sparse), not a lazily negated view."""
    return (tensor.device.type != "cpu" and tensor.dtype in _FLOATS and 0 < tensor.numel() <= SEGMENT_MAX
            and tensor.layout is torch.strided and not tensor.is_neg())


def chunks(sizes: Sequence[int], limit: int | None = None) -> list[range]:
    """Consecutive index ranges of ``sizes`` whose totals stay within ``limit`` (default ``CHUNK``; a larger
    single size gets a range of its own).

    >>> chunks([3, 3, 3, 5, 1], limit=6)
    [range(0, 2), range(2, 3), range(3, 5)]
    """
    limit = CHUNK if limit is None else limit
    out, begin, total = [], 0, 0
    for i, size in enumerate(sizes):
        if i > begin and total + size > limit:
            out.append(range(begin, i))
            begin, total = i, 0
        total += size
    if begin < len(sizes):
        out.append(range(begin, len(sizes)))
    return out


def segment_moments(tensors: Sequence[torch.Tensor], batches: Sequence[int] | None = None,
                    thresholds: Sequence[tuple[float, float] | None] | None = None) -> torch.Tensor:
    """``[n, 10]`` float64 rows on the tensors' device (one device and dtype, at least one element each):
    Σx, Σx², Σ|x|, min, max, the count of non-zero elements, and, for tensors with a batch size in
    ``batches`` (0: none), their dead units (positions of the ``[batch, units]`` view that are zero in every
    sample) and their sample spread (each element's squared deviation from its unit's mean over the batch,
    summed: two passes in float64; 0 for fewer than 2 samples); for tensors with ``thresholds`` (the
    saturation bounds, margin applied), the elements at or beyond them and the units saturated in every
    sample. NaN and ±Inf make the sums non-finite; the caller recomputes such rows exactly."""
    flat = torch.cat([t.detach().reshape(-1) for t in tensors]).to(torch.float64)
    sizes = tuple(t.numel() for t in tensors)
    batches = tuple(batches or (0,) * len(sizes))
    thresholds = tuple(thresholds or (None,) * len(sizes))
    layout = _layout(flat.device, sizes, batches, thresholds)
    count = len(sizes)
    nonzero = (flat != 0).to(torch.float64)  # NaN counts as non-zero, as alive
    summed = [flat, flat * flat, flat.abs(), nonzero]
    saturated = None
    if layout.low is not None:
        saturated = ((flat <= layout.low) | (flat >= layout.high)).to(torch.float64)
        summed.append(saturated)
    if layout.units is not None:  # units of batch-less tensors are single elements: they deviate by 0
        means = flat.new_zeros(layout.unit_count).index_add_(0, layout.units, flat) / layout.unit_samples
        centred = flat - means[layout.units]
        summed.append(centred * centred)
    # Each statistic is one copy of the data, all copies back to back, so one call reduces them all (a
    # segment_reduce call costs far more on the host than its arithmetic on these sizes).
    sums = _per_segment(summed, "sum", layout.offsets(len(summed))).view(len(summed), count)
    extremes = _per_segment([flat, -flat], "min", layout.offsets(2)).view(2, count)
    zeros = flat.new_zeros(count)
    dead = saturated_units = zeros
    if layout.units is not None:  # a unit is alive when any sample is non-zero, saturated when every one is
        per_unit = [1 - flat.new_zeros(layout.unit_count).scatter_reduce_(0, layout.units, nonzero, "amax")]
        if saturated is not None:
            per_unit.append(flat.new_ones(layout.unit_count).scatter_reduce_(0, layout.units, saturated, "amin")
                            * layout.unit_bounded)
        unit_sums = _per_segment(per_unit, "sum", layout.unit_offsets(len(per_unit))).view(len(per_unit), count)
        dead = unit_sums[0]
        saturated_units = unit_sums[1] if saturated is not None else zeros
    return torch.stack([sums[0], sums[1], sums[2], extremes[0], -extremes[1], sums[3], dead,
                        sums[4] if saturated is not None else zeros, saturated_units,
                        sums[-1] if layout.units is not None else zeros], 1)


def _per_segment(parts: list[torch.Tensor], reduce: str, offsets: torch.Tensor) -> torch.Tensor:
    """``reduce`` over every segment of the concatenated ``parts`` (1-D data: CUB's segmented reduction on
    CUDA; unsafe: the offsets are known to be right)."""
    return torch.segment_reduce(torch.cat(parts), reduce, offsets=offsets, unsafe=True)


@dataclass(frozen=True)
class _Layout:
    """Index tensors for one list of tensor sizes, batch sizes and thresholds, made once per device."""

    device: torch.device
    sizes: tuple[int, ...]
    units: torch.Tensor | None  # each element's unit (a batch-less tensor: each element its own), if any batched
    unit_counts: tuple[int, ...]  # units per tensor
    unit_bounded: torch.Tensor | None  # 1 for the units of tensors with thresholds
    unit_samples: torch.Tensor | None  # samples per unit: the batch size (1 for batch-less tensors)
    low: torch.Tensor | None  # each element's saturation thresholds (NaN: none, never met), if any
    high: torch.Tensor | None

    @property
    def unit_count(self) -> int:
        return sum(self.unit_counts)

    def offsets(self, copies: int) -> torch.Tensor:
        """Segment boundaries of ``copies`` concatenated copies of the elements."""
        return _offsets(self.device, self.sizes, copies)

    def unit_offsets(self, copies: int) -> torch.Tensor:
        """Segment boundaries of ``copies`` concatenated copies of the units."""
        return _offsets(self.device, self.unit_counts, copies)


@lru_cache(maxsize=256)
def _offsets(device: torch.device, sizes: tuple[int, ...], copies: int) -> torch.Tensor:
    starts = np.concatenate([[0], np.cumsum(sizes)])
    total = starts[-1]
    return torch.from_numpy(np.concatenate([starts[:-1] + i * total for i in range(copies)]
                                           + [[copies * total]]).astype(np.int64)).to(device)


@lru_cache(maxsize=64)
def _layout(device: torch.device, sizes: tuple[int, ...], batches: tuple[int, ...],
            thresholds: tuple[tuple[float, float] | None, ...]) -> _Layout:
    """The layout's index tensors, built on the host and moved to the device once (the same parameters and
    activations come back every step)."""
    def device_array(values: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(values).to(device)

    units = unit_bounded = unit_samples = None
    counts = tuple(sizes)
    if any(batches):
        counts = tuple(size // batch if batch else size for size, batch in zip(sizes, batches))
        offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
        units = device_array(np.concatenate([offset + (np.arange(size) % count if batch else np.arange(size))
                                             for offset, size, count, batch in zip(offsets, sizes, counts, batches)]))
        unit_bounded = device_array(np.repeat([1.0 if t is not None and b else 0.0
                                               for t, b in zip(thresholds, batches)], counts))
        unit_samples = device_array(np.repeat(np.maximum(np.array(batches, dtype=np.float64), 1.0), counts))
    low = high = None
    if any(t is not None for t in thresholds):
        low = device_array(np.repeat([np.nan if t is None else t[0] for t in thresholds], sizes))
        high = device_array(np.repeat([np.nan if t is None else t[1] for t in thresholds], sizes))
    return _Layout(device, tuple(sizes), units, counts, unit_bounded, unit_samples, low, high)

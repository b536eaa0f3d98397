"""Moments of many small device tensors in a handful of kernel launches.

On a GPU every reduction is a kernel launch, and a launch costs more than the arithmetic of a small
tensor: summarising a model's parameters, gradients and updates one tensor at a time takes about eight
launches per tensor. Here the tensors of one device and dtype are concatenated into one float64 vector and
reduced per segment with ``torch.segment_reduce`` (CUB's segmented reduction on CUDA; atomics into one
output per tensor serialise and ran a hundred times slower): about a dozen launches for all of them. Sums in
float64 also keep Σx² from cancelling for tensors whose mean dwarfs their spread (LayerNorm gains).
Tensors above ``SEGMENT_MAX`` elements, whose arithmetic outweighs a launch, keep their own reductions, and
``CHUNK`` bounds the float64 copy.

>>> rows = segment_moments([torch.tensor([1.0, -2.0, 0.0]), torch.tensor([0.5])])
>>> rows.tolist()
[[-1.0, 5.0, 3.0, -2.0, 1.0, 2.0], [0.5, 0.25, 0.5, 0.5, 0.5, 1.0]]
"""
from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import torch

__all__ = ["CHUNK", "SEGMENT_MAX", "SUM", "SUM_SQ", "SUM_ABS", "MIN", "MAX", "NONZERO", "chunks", "segmentable",
           "segment_moments"]

SEGMENT_MAX = 1 << 18
"""Tensors with more elements are reduced on their own (a segment is one thread block's work)."""
CHUNK = 1 << 22
"""Elements concatenated per ``segment_moments`` call (a 32 MiB float64 copy at most)."""
SUM, SUM_SQ, SUM_ABS, MIN, MAX, NONZERO = range(6)  # columns of segment_moments' rows

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def segmentable(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` goes through ``segment_moments``: a small, non-empty floating-point tensor off the
    host (host tensors have their compiled kernels), not a lazily negated view."""
    return (tensor.device.type != "cpu" and tensor.dtype in _FLOATS and 0 < tensor.numel() <= SEGMENT_MAX
            and not tensor.is_neg())


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


def segment_moments(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """``[n, 6]`` float64 rows on the tensors' device: Σx, Σx², Σ|x|, min, max and the count of non-zero
    elements of each tensor (one device and dtype, at least one element each). NaN and ±Inf make the sums
    non-finite; the caller recomputes such rows exactly."""
    flat = torch.cat([t.detach().reshape(-1) for t in tensors]).to(torch.float64)
    lengths = _lengths(flat.device, tuple(t.numel() for t in tensors))

    def per_segment(values: torch.Tensor, reduce: str) -> torch.Tensor:
        # 1-D data takes CUB's segmented reduction on CUDA; unsafe: the lengths are known to add up
        return torch.segment_reduce(values, reduce, lengths=lengths, unsafe=True)

    return torch.stack([per_segment(flat, "sum"), per_segment(flat * flat, "sum"), per_segment(flat.abs(), "sum"),
                        per_segment(flat, "min"), per_segment(flat, "max"),
                        per_segment((flat != 0).to(torch.float64), "sum")], 1)


@lru_cache(maxsize=64)
def _lengths(device: torch.device, sizes: tuple[int, ...]) -> torch.Tensor:
    """The segment lengths on the device, made once per layout (the same parameters come back every step)."""
    return torch.tensor(sizes, dtype=torch.int64, device=device)

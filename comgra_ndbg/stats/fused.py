"""Moments of many device tensors in one kernel launch, with Triton.

``segmented`` sums a float64 copy of each statistic with CUB's segmented reduction: about twenty launches
per group, a float64 copy of the data per statistic, and tensors above ``segmented.SEGMENT_MAX`` elements
reduced one at a time (eight launches each). On a GPU the launches, not the arithmetic, are the cost of
recording: a GPT-2-small step under NeuralDbg launched ten times the bare step's kernels. Here the tensors
of one device and dtype, of any size, are read where they lie (their addresses in a table uploaded with
one copy; a single tensor's passed as arguments), once each, by one launch (``fused_kernels``):

- flat programs, one per ``BLOCK`` elements: Σx, Σx², Σ|x|, min, max, non-zero, saturated, NaN and ±Inf
  counts, summed in float64;
- unit programs (for tensors with a batch), one per ``UNITS`` columns of a ``[batch, units]`` view, over
  all samples: dead units (zero in every sample), units saturated in every sample, and the sample spread
  Σ(x − unit mean)², from sums of the samples' differences to the first sample (so a mean that dwarfs the
  spread does not cancel);
- each tensor's last program to finish (a per-tensor counter) sums the partial rows into one row per
  tensor: ``segmented.segment_moments``' ten columns, then the NaN and ±Inf counts and the units finite in
  every sample with their Σx². The moments cover the finite elements, so a row is complete as it comes: no
  exact recompute reads the tensor again, and nothing keeps it alive until the host has the row.

Triton is not a dependency: :func:`usable` says whether it can run here (a CUDA tensor and an importable
Triton, or Triton's interpreter, which the tests use on host tensors); ``COMGRA_NDBG_FUSED=0`` turns the
path off, and so does a first failure of the kernels (with a warning; the callers fall back).
"""
from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from functools import lru_cache

import numpy as np
import torch

__all__ = ["BLOCK", "COLUMNS", "FINITE_SUM_SQ", "FINITE_UNITS", "INF", "NAN", "PARTS", "UNITS", "FusedUnavailable",
           "fused_moments", "usable"]

BLOCK = 2048
"""Elements per program of the flat pass."""
UNITS = 256
"""Columns (units) per program of the per-unit pass."""
PARTS = 256
"""Partial rows a tensor's last program reads at once."""
NAN, INF, FINITE_UNITS, FINITE_SUM_SQ = 10, 11, 12, 13  # the columns after segmented's ten
COLUMNS = 14
_META = 10  # per tensor: address, numel, samples, units, first flat program, programs, first unit program,
#             programs, low and high saturation thresholds (float64 bits; NaN: none)
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "") == "1"


@lru_cache(maxsize=1)
def _kernels() -> object | None:
    """The compiled kernels' module, or None where Triton is missing or turned off."""
    if os.environ.get("COMGRA_NDBG_FUSED", "1").strip() == "0":
        return None
    try:
        from comgra_ndbg.stats import fused_kernels
    except Exception:  # noqa: BLE001 - no Triton, or one that does not import: the segmented path stays
        return None
    return fused_kernels


def usable(tensor: torch.Tensor) -> bool:
    """Whether :func:`fused_moments` can reduce ``tensor``: a non-empty strided floating-point tensor on a
    CUDA device (or on the host under Triton's interpreter), with Triton importable."""
    if tensor.device.type != "cuda" and not (_interpreting() and tensor.device.type == "cpu"):
        return False
    return (tensor.dtype in _FLOATS and tensor.numel() > 0 and tensor.layout is torch.strided
            and not tensor.is_neg() and _FAILED is None and _kernels() is not None)


class FusedUnavailable(RuntimeError):
    """The Triton kernels failed on this machine (a device or compiler they do not support): the path is off
    for the rest of the process, and the caller reduces the tensors another way."""


def fused_moments(tensors: Sequence[torch.Tensor], batches: Sequence[int] | None = None,
                  thresholds: Sequence[tuple[float, float] | None] | None = None) -> torch.Tensor:
    """``[n, COLUMNS]`` float64 rows for ``tensors`` (one device and dtype, each :func:`usable`), computed by
    one Triton launch; ``batches`` and ``thresholds`` as for ``segmented.segment_moments``, whose ten
    columns come first with the same meaning, except that the moments, min and max cover the finite
    elements only and the spread only the units finite in every sample. Four more columns make the row
    complete without reading the tensor again: the NaN and ±Inf counts (``NAN``, ``INF``), the units finite in
    every sample (``FINITE_UNITS``) and their Σx² (``FINITE_SUM_SQ``). A failure of the kernels (their first
    compilation on an unsupported device, say) turns the path off with a warning and raises
    :class:`FusedUnavailable`."""
    try:
        return _launch(tensors, batches, thresholds)
    except Exception as error:  # noqa: BLE001 - whatever Triton or the driver raised: the path is off from now on
        global _FAILED
        _FAILED = f"{type(error).__name__}: {error}"
        warnings.warn(f"comgra_ndbg: the Triton statistics kernels failed on this machine ({_FAILED:.300}); device "
                      f"tensors are summarised with torch's reductions from now on (COMGRA_NDBG_FUSED=0 skips the "
                      f"attempt)", RuntimeWarning, stacklevel=2)
        raise FusedUnavailable(_FAILED) from error


_FAILED: str | None = None
"""Why the kernels failed in this process (None: they did not)."""


def _launch(tensors: Sequence[torch.Tensor], batches: Sequence[int] | None,
            thresholds: Sequence[tuple[float, float] | None] | None) -> torch.Tensor:
    k = _kernels()
    assert k is not None, "fused_moments needs Triton: check usable() first"
    views = [t.detach().reshape(-1) if t.is_contiguous() else t.detach().contiguous().reshape(-1) for t in tensors]
    count = len(views)
    batches = (0,) * count if batches is None else tuple(int(b) for b in batches)
    bounds = (None,) * count if thresholds is None else tuple(thresholds)
    device = views[0].device
    out = torch.empty((count, COLUMNS), dtype=torch.float64, device=device)
    if count == 1:
        flat_count, unit_count, low, high = _one(views[0].numel(), batches[0], bounds[0])
        partial = torch.empty((flat_count + unit_count, 9), dtype=torch.float64, device=device)
        samples = batches[0]
        units = views[0].numel() // samples if samples else 0
        k.moments_one[(flat_count + unit_count,)](views[0], partial, _counters(device, 1), out, views[0].numel(),
                                                  samples, units, low, high, flat_count, unit_count, BLOCK=BLOCK,
                                                  UNITS=UNITS, PARTS=PARTS)
        return out
    meta, flat_programs, unit_programs = _table(tuple(v.numel() for v in views), batches, bounds)
    meta = meta.copy()
    meta[:count * _META:_META] = np.fromiter((v.data_ptr() for v in views), np.int64, count)
    table = torch.from_numpy(meta)
    if device.type == "cuda":
        table = table.pin_memory().to(device, non_blocking=True)
    partial = torch.empty((flat_programs + unit_programs, 9), dtype=torch.float64, device=device)
    k.moments_many[(flat_programs + unit_programs,)](table[:count * _META], table[count * _META:], flat_programs,
                                                     partial, _counters(device, count), out, views[0], BLOCK=BLOCK,
                                                     UNITS=UNITS, PARTS=PARTS)
    return out


@lru_cache(maxsize=1024)
def _one(numel: int, batch: int, bounds: tuple[float, float] | None) -> tuple[int, int, int, int]:
    """One tensor's flat and unit program counts and its thresholds as float64 bits (NaN: none)."""
    low, high = (np.nan, np.nan) if bounds is None else bounds
    units = numel // batch if batch else 0
    bits = np.array([low, high], dtype=np.float64).view(np.int64).tolist()
    return -(-numel // BLOCK), -(-units // UNITS) if batch else 0, bits[0], bits[1]


def _counters(device: torch.device, count: int) -> torch.Tensor:
    """``count`` int32 completion counters for a launch on ``device``'s current stream: zero before every
    launch, since each tensor's last program sets its counter back to 0 (launches on one stream run in order;
    each stream has its own)."""
    key = (device, torch.cuda.current_stream(device).stream_id if device.type == "cuda" else 0)
    found = _COUNTERS.get(key)
    if found is None or len(found) < count:
        found = _COUNTERS[key] = torch.zeros(max(count, 2 * len(found) if found is not None else 64),
                                             dtype=torch.int32, device=device)
    return found


_COUNTERS: dict[tuple[torch.device, int], torch.Tensor] = {}


@lru_cache(maxsize=256)
def _table(sizes: tuple[int, ...], batches: tuple[int, ...], bounds: tuple[tuple[float, float] | None, ...]
           ) -> tuple[np.ndarray, int, int]:
    """The launch table for one list of sizes, batch sizes and thresholds (addresses left 0): per tensor its
    ``_META`` entries, then each flat program's tensor, then each unit program's tensor. The same
    parameters and activations come back every step, so it is built once per shape."""
    count = len(sizes)
    size = np.asarray(sizes, np.int64)
    rows = np.asarray(batches, np.int64)
    cols = np.where(rows > 0, size // np.maximum(rows, 1), 0)
    flat_count = -(-size // BLOCK)
    unit_count = np.where(rows > 0, -(-cols // UNITS), 0)
    meta = np.zeros((count, _META), np.int64)
    meta[:, 1], meta[:, 2], meta[:, 3] = size, rows, cols
    meta[:, 4] = np.concatenate([[0], np.cumsum(flat_count)[:-1]])
    meta[:, 5] = flat_count
    meta[:, 6] = np.concatenate([[0], np.cumsum(unit_count)[:-1]])
    meta[:, 7] = unit_count
    low = np.array([np.nan if b is None else b[0] for b in bounds], np.float64)
    high = np.array([np.nan if b is None else b[1] for b in bounds], np.float64)
    meta[:, 8], meta[:, 9] = low.view(np.int64), high.view(np.int64)
    program_tensor = np.concatenate([np.repeat(np.arange(count, dtype=np.int64), flat_count),
                                     np.repeat(np.arange(count, dtype=np.int64), unit_count)])
    table = np.concatenate([meta.reshape(-1), program_tensor])
    table.flags.writeable = False
    return table, int(flat_count.sum()), int(unit_count.sum())

"""Snapshots: per-sample statistics and (sub-sampled) element values of one tensor, for any rank.

A batched tensor ``[B, ...]`` is seen as ``[B, units]`` whatever its rank, so 4-D feature maps and 5-D
attention tensors are handled like a plain ``[B, F]`` activation. Batch-less tensors (parameters, scalars)
get element values only. Sub-sampling is deterministic (evenly spaced indices), never random: recording
must not touch any random number generator of the training run.
"""
from __future__ import annotations

import math
from contextlib import suppress
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from comgra_ndbg.recorder.device_snapshots import device_index, fused_per_sample_stats, materialize, on_host
from comgra_ndbg.stats import fused, kernels
from comgra_ndbg.stats.host import difference
from comgra_ndbg.store.schema import FIELD, NUM_FIELDS
from comgra_ndbg.store.segment import SnapshotData

__all__ = ["DeferredSnapshot", "SnapshotData", "take_snapshot", "take_update_snapshot", "evenly_spaced",
           "balanced_samples"]


@dataclass
class DeferredSnapshot:
    """A tensor kept until its step's sample choice is known (steps whose type is decided at their end)."""

    key: int  # series id for values, tensor id for gradients
    iteration: int
    tensor: torch.Tensor
    batched: bool
    bounds: tuple[float, float] | None
    kind: str | None = None  # a gradient's kind, once record_gradients() has collected its set


@lru_cache(maxsize=1024)
def evenly_spaced(total: int, count: int) -> np.ndarray:
    """``count`` distinct, evenly spaced indices in ``range(total)`` that include both ends (read-only:
    the same shapes recur every recorded step, so the result is cached).

    >>> evenly_spaced(10, 4).tolist()
    [0, 3, 6, 9]
    >>> evenly_spaced(3, 5).tolist()
    [0, 1, 2]
    """
    indices = _evenly_spaced(total, count)
    indices.setflags(write=False)
    return indices


def _evenly_spaced(total: int, count: int) -> np.ndarray:
    if count >= total:
        return np.arange(total, dtype=np.int64)
    if count <= 1:
        return np.zeros(min(count, total), dtype=np.int64)
    spaced = np.round(np.linspace(0, total - 1, count)).astype(np.int64)
    # already sorted: drop repeats directly (np.unique sorts again and costs ~0.6 ms for 4096 indices)
    return spaced[np.concatenate(([True], spaced[1:] != spaced[:-1]))]


@lru_cache(maxsize=1024)
def _sample_positions(samples: int, units: int, count: int) -> np.ndarray:
    """Flat positions ``row × units + unit`` of the same ``evenly_spaced(units, count)`` units in each of
    ``samples`` rows (read-only and cached: one array per pattern, which the store keeps once however many snapshots
    use it)."""
    keep = evenly_spaced(units, count)
    index = (np.arange(samples, dtype=np.int64)[:, None] * units + keep[None, :]).reshape(-1)
    index.setflags(write=False)
    return index


def balanced_samples(categories: list, count: int) -> np.ndarray:
    """Up to ``count`` batch positions, balanced across categories: round robin over the categories in
    order of first appearance, taking each category's samples in batch order.

    >>> balanced_samples(["a", "a", "a", "b", "a", "c"], 4).tolist()
    [0, 3, 5, 1]
    """
    groups: dict = {}
    for position, category in enumerate(categories):
        groups.setdefault(category, []).append(position)
    chosen: list[int] = []
    queues = [iter(g) for g in groups.values()]
    while len(chosen) < count and queues:
        still = []
        for queue in queues:
            position = next(queue, None)
            if position is not None and len(chosen) < count:
                chosen.append(position)
                still.append(queue)
        queues = still
    return np.array(chosen, dtype=np.int64)


def take_snapshot(
    tensor: torch.Tensor,
    *,
    batched: bool,
    num_samples: int,
    max_elements: int,
    bounds: tuple[float, float] | None = None,
    saturation_margin: float = 0.005,
    sample_positions: np.ndarray | None = None,
    on_device: bool = False,
) -> SnapshotData:
    """Per-sample statistics of the first ``num_samples`` samples and at most ``max_elements`` values.
    ``on_device``: the arrays of a device tensor's snapshot stay on its device (as tensors) for
    :func:`materialize` to copy together with the step's other snapshots.

    Value indices of a batched tensor are flat positions within the recorded samples (row i is the sample
    at batch position ``sample_index[i]``). ``sample_positions`` picks other samples than the first ones
    (e.g. a category-balanced choice).

    >>> s = take_snapshot(torch.arange(12.0).view(3, 4), batched=True, num_samples=2, max_elements=4)
    >>> s.sample_index.tolist(), s.values.tolist(), s.value_index.tolist()
    ([0, 1], [0.0, 3.0, 4.0, 7.0], [0, 3, 4, 7])
    """
    host = _host_view(tensor)
    if host is not None:
        return _take_host(host, batched, num_samples, max_elements, bounds, saturation_margin, sample_positions)
    x = tensor.detach()
    if x.layout is not torch.strided:  # a sparse gradient: snapshot it as the dense tensor it stands for
        x = x.to_dense()
    x = x.resolve_neg()  # a lazily negated view holds the other sign in memory
    if x.is_complex():
        x = x.abs()
    shape = tuple(int(d) for d in x.shape)
    if batched and x.dim() >= 1 and shape[0] > 0:
        if sample_positions is None:
            positions = np.arange(min(shape[0], num_samples), dtype=np.int64)
            chosen = x[: len(positions)]
        else:
            positions = np.asarray(sample_positions, dtype=np.int64)
            chosen = x.index_select(0, device_index(positions, x.device))
        n = len(positions)
        per_sample = chosen.reshape(n, math.prod(shape[1:]))  # not -1: n may be 0
        stats = _per_sample_stats(per_sample, bounds, saturation_margin)
        units = per_sample.shape[1]
        per_sample_count = max(1, max_elements // max(n, 1))
        keep_units = evenly_spaced(units, per_sample_count)
        every = len(keep_units) == units
        index = None if every else _sample_positions(n, units, per_sample_count)
        values = _values(per_sample, None if every else keep_units, 1)
        sample_index = positions
    else:
        stats = _NO_STATS
        sample_index = _NO_SAMPLES
        flat = x.reshape(-1)
        index = _kept(flat.numel(), max_elements)
        values = _values(flat, index, 0)
    data = SnapshotData(shape, sample_index, stats, values, index)
    return data if on_device else materialize([(0, 0, data)])[0][2]


def _host_view(tensor: torch.Tensor) -> np.ndarray | None:
    """``tensor`` as a numpy array sharing its memory, when it is a host tensor numpy can read as it is (real,
    strided, not a lazily negated view); else None."""
    if tensor.is_cpu and tensor.layout is torch.strided and tensor.dtype in _HOST_VIEWABLE and not tensor.is_neg():
        return (tensor.detach() if tensor.requires_grad else tensor).numpy()
    return None


def _take_host(a: np.ndarray, batched: bool, num_samples: int, max_elements: int,
               bounds: tuple[float, float] | None, saturation_margin: float,
               sample_positions: np.ndarray | None) -> SnapshotData:
    """``take_snapshot`` of a host array: numpy and the compiled kernel alone, no torch call per tensor (the
    same values, indices and statistics as the general path)."""
    shape = a.shape
    target = _VALUE_DTYPE.get(a.dtype.type, np.float32)
    if batched and a.ndim >= 1 and shape[0] > 0:
        if sample_positions is None:
            n = min(shape[0], num_samples)
            positions = _first_samples(n)
            chosen = a[:n]
        else:
            positions = np.asarray(sample_positions, dtype=np.int64)
            n = len(positions)
            chosen = a[positions]
        units, index = _batched_layout(shape, n, max_elements)
        rows = chosen.reshape(n, units)
        stats = _host_sample_stats(rows, bounds, saturation_margin)
        flat = rows.reshape(-1)
        values = np.array(flat, dtype=target) if index is None else flat.take(index).astype(target, copy=False)
        return SnapshotData(shape, positions, stats, values, index)
    flat = a.reshape(-1)
    index = _kept(flat.size, max_elements)
    values = np.array(flat, dtype=target) if index is None else flat.take(index).astype(target, copy=False)
    return SnapshotData(shape, _NO_SAMPLES, _NO_STATS, values, index)


@lru_cache(maxsize=1024)
def _batched_layout(shape: tuple[int, ...], samples: int, max_elements: int) -> tuple[int, np.ndarray | None]:
    """Units per sample of a batched tensor of ``shape`` and the flat value positions its snapshot of
    ``samples`` samples keeps (None: every value), cached per shape: the same tensors recur at every snapshot."""
    units = math.prod(shape[1:])
    count = max(1, max_elements // max(samples, 1))
    every = len(evenly_spaced(units, count)) == units
    return units, None if every else _sample_positions(samples, units, count)


@lru_cache(maxsize=1024)
def _kept(total: int, max_elements: int) -> np.ndarray | None:
    """The positions a batch-less snapshot of ``total`` elements keeps, None when it keeps every one."""
    keep = evenly_spaced(total, max_elements)
    return None if len(keep) == total else keep


@lru_cache(maxsize=64)
def _first_samples(count: int) -> np.ndarray:
    """``arange(count)``, read-only and cached: the sample index of a snapshot of the first samples."""
    positions = np.arange(count, dtype=np.int64)
    positions.setflags(write=False)
    return positions


def _host_sample_stats(rows: np.ndarray, bounds: tuple[float, float] | None, margin_fraction: float) -> np.ndarray:
    """``_per_sample_stats`` of the ``[samples, units]`` host array ``rows``: the compiled kernel reads float32
    and float64 rows in place and every other dtype widened to float64, as the exact path reads them."""
    if not (kernels.AVAILABLE and rows.shape[0] and rows.shape[1]):
        return _exact_per_sample_stats(torch.from_numpy(np.ascontiguousarray(rows)), bounds, margin_fraction)
    if rows.dtype.type not in _KERNEL_DTYPES or not rows.flags.c_contiguous:
        rows = np.ascontiguousarray(rows, dtype=np.float64)
    out, exact = kernels.per_sample(rows, None if bounds is None else _float64_thresholds(bounds, margin_fraction))
    flags = exact.tolist()  # (a plain list: a small numpy reduction costs ~7 µs right after the kernels' passes)
    if True in flags:
        redo = np.flatnonzero(exact)
        out[redo] = _exact_per_sample_stats(torch.from_numpy(rows[redo]), bounds, margin_fraction)
    return out


def take_update_snapshot(value: torch.Tensor, start: torch.Tensor, *, max_elements: int,
                         start_snapshot: SnapshotData | None = None, on_device: bool = False) -> SnapshotData:
    """The snapshot of the batch-less difference ``value - start`` (a parameter update), computed only at the
    at most ``max_elements`` evenly spaced elements it keeps; the same as ``take_snapshot(value - start)``.
    ``start_snapshot``, ``take_snapshot(start, batched=False, ...)`` taken while ``start`` held its values (the
    parameter's value snapshot at the step's start), saves reading ``start`` again where it kept the same elements.
    ``on_device`` as for ``take_snapshot``.

    >>> s = take_update_snapshot(torch.arange(6.0), torch.ones(6), max_elements=3)
    >>> s.values.tolist(), s.value_index.tolist()
    ([-1.0, 1.0, 4.0], [0, 2, 5])
    """
    host_value = _host_view(value) if value.dtype is start.dtype and value.dtype in _FLOAT else None
    host_start = None if host_value is None else _host_view(start)
    if host_start is not None:  # the common case, with numpy alone
        a = host_value.reshape(-1)
        index = _kept(a.size, max_elements)
        if index is None:
            values = np.subtract(a, host_start.reshape(-1))
        elif (start_snapshot is not None and start_snapshot.value_index is index
              and start_snapshot.values.dtype == a.dtype):
            values = np.subtract(a.take(index), start_snapshot.values)
        else:
            values = np.subtract(a.take(index), host_start.reshape(-1).take(index))
        return SnapshotData(host_value.shape, _NO_SAMPLES, _NO_STATS, values, index)
    value, start = value.detach().resolve_neg(), start.detach().resolve_neg()
    numel = value.numel()
    index = _kept(numel, max_elements)
    flat_value, flat_start = value.reshape(-1), start.reshape(-1)
    if value.dtype == start.dtype and value.dtype in _FLOAT and value.is_cpu and start.is_cpu:
        a, b = flat_value.numpy(), flat_start.numpy()
        if index is not None:
            a, b = a[index], b[index]
        values = np.subtract(a, b).astype(_value_dtype(value.dtype), copy=False)
    else:
        if index is not None:
            positions = device_index(index, value.device)
            flat_value, flat_start = flat_value.index_select(0, positions), flat_start.index_select(0, positions)
        delta = difference(flat_value, flat_start)
        values = on_host((delta.abs() if delta.is_complex() else delta).to(_torch_value_dtype(value.dtype)))
    data = SnapshotData(tuple(int(d) for d in value.shape), _NO_SAMPLES, _NO_STATS, values, index)
    return data if on_device else materialize([(0, 0, data)])[0][2]


_HOST_VIEWABLE = frozenset((torch.float32, torch.float64, torch.float16, torch.int8, torch.uint8, torch.int16,
                            torch.int32, torch.int64, torch.bool))
_VALUE_DTYPE = {np.float64: np.float64}  # by numpy scalar type: float64 values stay float64, the rest are float32
_FLOAT = (torch.float32, torch.float64)
_KERNEL_DTYPES = (np.float32, np.float64)
_NO_SAMPLES = np.zeros(0, dtype=np.int64)  # shared by every batch-less snapshot: read-only
_NO_SAMPLES.setflags(write=False)
_NO_STATS = np.zeros((0, NUM_FIELDS))
_NO_STATS.setflags(write=False)


_WIDE = (torch.float64, torch.complex128)


def _value_dtype(dtype: torch.dtype) -> type:
    """The element-value dtype of a snapshot of a ``dtype`` tensor: float64 for float64 and complex128 (float32
    would turn 1e300 into inf), else float32 (integers beyond 2**24 are rounded)."""
    return np.float64 if dtype in _WIDE else np.float32


def _torch_value_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype in _WIDE else torch.float32


def _values(x: torch.Tensor, keep: np.ndarray | None, axis: int) -> np.ndarray:
    """The elements of ``x`` at positions ``keep`` along ``axis`` (all when None), flattened, as a new host
    array (``_value_dtype``): with numpy on a host tensor (no per-op dispatch), else with torch on its device."""
    target = _value_dtype(x.dtype)
    if x.is_cpu and x.dtype in _HOST_VIEWABLE:
        a = x.numpy()
        if keep is None:
            return np.array(a.reshape(-1), dtype=target)
        return np.take(a, keep, axis=axis).reshape(-1).astype(target, copy=False)
    if keep is not None:
        x = x.index_select(axis, device_index(keep, x.device))
    return on_host(x.reshape(-1).to(_torch_value_dtype(x.dtype), copy=keep is None))


def _per_sample_stats(x: torch.Tensor, bounds: tuple[float, float] | None, margin_fraction: float) -> np.ndarray:
    """Sufficient statistics of every row of ``x`` (``[samples, units]``, real), in float64: with the compiled
    kernel for host tensors (``_host_sample_stats``), else with float64 torch ops on the tensor's device."""
    if x.is_cpu:
        return _host_sample_stats(x.numpy() if x.dtype in _HOST_VIEWABLE else x.double().numpy(), bounds,
                                  margin_fraction)
    return _device_per_sample_stats(x, bounds, margin_fraction)


@lru_cache(maxsize=256)
def _float64_thresholds(bounds: tuple[float, float], margin_fraction: float) -> np.ndarray:
    """The saturation thresholds of ``bounds`` with the margin applied, as the kernel's float64 argument
    (cached: one activation's bounds recur on every snapshot; left writable, since numba compiles a
    separate kernel for read-only arrays)."""
    margin = margin_fraction * (bounds[1] - bounds[0])
    return np.array([bounds[0] + margin, bounds[1] - margin], dtype=np.float64)


def _exact_per_sample_stats(x: torch.Tensor, bounds: tuple[float, float] | None, margin_fraction: float
                            ) -> np.ndarray:
    return _torch_per_sample_stats(x, bounds, margin_fraction).cpu().numpy()


def _device_per_sample_stats(x: torch.Tensor, bounds: tuple[float, float] | None, margin_fraction: float
                             ) -> torch.Tensor:
    """The per-sample rows of ``x``, left on ``x``'s device: every sample's row at once by ``fused`` where
    Triton runs, else in float64 torch operations."""
    if x.shape[0] and x.shape[1] and fused.usable(x):
        thresholds = None if bounds is None else tuple(_float64_thresholds(bounds, margin_fraction).tolist())
        with suppress(fused.FusedUnavailable):  # the kernels failed here: torch's reductions below, from now on
            return fused_per_sample_stats(x, thresholds)
    return _torch_per_sample_stats(x, bounds, margin_fraction)


def _torch_per_sample_stats(x: torch.Tensor, bounds: tuple[float, float] | None, margin_fraction: float
                            ) -> torch.Tensor:
    """The per-sample rows of ``x`` in float64 torch operations on ``x``'s device (the exact reference)."""
    x = x.double() if not x.dtype == torch.float64 else x
    finite = torch.isfinite(x)
    zeroed = torch.where(finite, x, torch.zeros((), dtype=x.dtype, device=x.device))
    nan = torch.isnan(x).sum(1)
    low = torch.full((), float("inf"), dtype=x.dtype, device=x.device)
    high = torch.full((), float("-inf"), dtype=x.dtype, device=x.device)
    columns = {
        "count": torch.full((x.shape[0],), x.shape[1], dtype=x.dtype, device=x.device),
        "nan": nan,
        "inf": (~finite).sum(1) - nan,
        "zeros": (x == 0).sum(1),
        "sum": zeroed.sum(1),
        "sum_sq": (zeroed * zeroed).sum(1),
        "sum_abs": zeroed.abs().sum(1),
        "min": torch.where(finite, x, low).amin(1) if x.shape[1] else low.expand(x.shape[0]),
        "max": torch.where(finite, x, high).amax(1) if x.shape[1] else high.expand(x.shape[0]),
    }
    if bounds is not None:
        lo, hi = bounds
        margin = margin_fraction * (hi - lo)
        columns["bounded"] = columns["count"]
        columns["saturated"] = ((x <= lo + margin) | (x >= hi - margin)).sum(1)
    out = torch.zeros((x.shape[0], NUM_FIELDS), dtype=torch.float64, device=x.device)
    for name, column in columns.items():
        out[:, FIELD[name]] = column.to(torch.float64)
    return out

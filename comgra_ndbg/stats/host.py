"""Summaries of host (CPU) tensors, written straight into a sufficient-statistic row.

CPU tensors are summarised at once by the single-pass kernels of ``kernels`` (numpy when numba is
missing): on the host a torch op's dispatch costs more than the arithmetic on typical layer sizes. A
summary can also copy the tensor in the same pass (``copy_to``) or summarise its difference to another
tensor without materialising it (``start``): that is how parameter values and updates cost one read each.
Arrays known by address (``summarize_addressed``) go to ``parallel.moments_many`` in one call.

Any row whose moments come out non-finite (NaN, Inf or float32 overflow) is recomputed exactly, in
float64, on its tensor (``exact``).
"""
from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter

import numpy as np
import torch

from comgra_ndbg.stats import kernels, parallel
from comgra_ndbg.stats.bounds import DEFAULT_SATURATION_MARGIN, saturation_thresholds
from comgra_ndbg.stats.exact import exact_moments as _exact_moments
from comgra_ndbg.stats.exact import reduce_host as _reduce_host
from comgra_ndbg.stats.exact import row_cancels as _row_cancels
from comgra_ndbg.stats.exact import underflows as _underflows
from comgra_ndbg.stats.exact import work_view
from comgra_ndbg.stats.fields import FIELD

__all__ = ["MOMENT_COLUMNS", "CHECKED_COLUMNS", "NUMPY_DTYPE", "reduce_cpu", "kernel_summary", "reduce_cpu_fused",
           "summarize_addressed", "lean", "lean_flags", "batchable", "difference"]

_FLOAT_FIELDS = ("sum", "sum_sq", "sum_abs", "min", "max")
MOMENT_COLUMNS = [FIELD[f] for f in _FLOAT_FIELDS]
CHECKED_COLUMNS = MOMENT_COLUMNS + [FIELD["spread_sum_sq"], FIELD["spread_dev_sq"]]  # non-finite: recompute exactly
_COUNT = FIELD["count"]
NUMPY_DTYPE = {torch.float32: np.dtype(np.float32), torch.float64: np.dtype(np.float64)}
_KERNEL_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_DTYPE, _IS_CPU = attrgetter("dtype"), attrgetter("is_cpu")
_IS_CONTIGUOUS, _IS_NEG, _NUMEL = torch.Tensor.is_contiguous, torch.Tensor.is_neg, torch.Tensor.numel


def reduce_cpu(flat: torch.Tensor, row: np.ndarray, batch: int, bounds: tuple[float, float] | None,
               saturation_margin: float) -> None:
    """Summarise a flat CPU tensor into ``row``: with the fused kernels when they apply, else with numpy."""
    a = np.ascontiguousarray(flat.numpy())  # a flat view can still be strided (a column, an expanded scalar)
    if kernels.AVAILABLE and a.dtype in _KERNEL_DTYPES:
        exact = kernel_summary(a, row, batch, bounds, saturation_margin)
    else:
        with np.errstate(all="ignore"):  # float32 overflow is expected here; the exact recompute handles it
            _reduce_host(a, row, batch, bounds, saturation_margin)
        exact = not np.isfinite(row[CHECKED_COLUMNS]).all() or (a.dtype.kind == "f" and _underflows(row, a.dtype))
        if not exact and _row_cancels(row):  # float32 sums cannot resolve the variance: redo them in float64
            wide = a.astype(np.float64)
            row[FIELD["sum"]], row[FIELD["sum_sq"]] = wide.sum(), np.dot(wide, wide)
    if exact:
        row[MOMENT_COLUMNS] = np.nan
        _exact_moments(flat, row, batch=batch)


def kernel_summary(a: np.ndarray, row: np.ndarray, batch: int, bounds: tuple[float, float] | None,
                   saturation_margin: float) -> bool:
    """``kernels.summarize`` of a C-contiguous host array seen as ``[batch, units]``; True: recompute exactly."""
    thresholds = None if bounds is None else saturation_thresholds(bounds, saturation_margin, a.dtype)
    return kernels.summarize(a.reshape(batch or 1, -1), row, thresholds, batch > 0)



def reduce_cpu_fused(x: torch.Tensor, flat: torch.Tensor, row: np.ndarray, start: torch.Tensor | None,
                     copy_to: torch.Tensor | None) -> None:
    """Summarise ``x - start`` (or ``x``) while copying ``x`` into ``copy_to``, in one pass when the
    kernels take these arrays, else in separate numpy/torch steps."""
    a = np.ascontiguousarray(flat.numpy())
    begin = None if start is None else _host_array(start.detach(), a)
    target = None if copy_to is None else _host_array(copy_to, a)
    fused = (kernels.AVAILABLE and a.dtype in _KERNEL_DTYPES and (start is None or begin is not None)
             and (copy_to is None or target is not None))
    if fused:
        if kernels.moments(a, row, start=begin, copy_to=target):
            row[MOMENT_COLUMNS] = np.nan
            _exact_moments(x if start is None else x.double() - start.detach().double(), row)
        return
    if copy_to is not None:
        copy_to.copy_(x)
    summand = x if start is None else difference(x, start.detach())
    reduce_cpu(work_view(summand), row, 0, None, DEFAULT_SATURATION_MARGIN)


def summarize_addressed(rows: np.ndarray, dtype: np.dtype, addresses: np.ndarray, sizes: np.ndarray,
                        tensors: Sequence[torch.Tensor], starts: Sequence[torch.Tensor] | None,
                         start_addresses: np.ndarray | None, copies: np.ndarray | None,
                         batches: np.ndarray | None) -> None:
    """One kernel call over arrays given by address, into ``rows`` (identity rows, one per array); rows the
    kernel flags are recomputed exactly from ``tensors`` (minus ``starts``; with their ``batches``). The
    arrays are the caller's own, built as ``parallel.moments_many_built`` takes them (unchecked)."""
    rows[:, _COUNT] = sizes
    exact = parallel.moments_many_built(dtype, addresses, sizes, rows, start_addresses, copies, batches)
    flags = exact.tolist()  # (a plain list: numpy's small reductions are slow right after the kernel's pass)
    if True not in flags:
        return
    for position in [i for i, flag in enumerate(flags) if flag]:
        row = rows[position]
        row[MOMENT_COLUMNS] = np.nan
        value = tensors[position].detach()
        _exact_moments(value if starts is None else value.double() - starts[position].detach().double(), row,
                       batch=0 if batches is None else int(batches[position]))


def lean(tensor: torch.Tensor) -> bool:
    """Whether the kernels can read ``tensor`` in place: a non-empty contiguous float32/float64 host tensor
    (a lazily negated view holds the other sign in memory)."""
    return (tensor.dtype in NUMPY_DTYPE and tensor.is_cpu and tensor.is_contiguous() and not tensor.is_neg()
            and tensor.numel() > 0)


def lean_flags(tensors: Sequence[torch.Tensor]) -> list[bool]:
    """``lean`` of every tensor, each property read for all of them in one C-level pass (no Python call per
    tensor): this runs for the gradients and parameters of every recorded step.

    >>> lean_flags([torch.ones(2, 3), torch.ones(2, 3).t(), torch.arange(3), torch.zeros(0)])
    [True, False, False, False]
    """
    try:
        return [dtype in NUMPY_DTYPE and cpu and contiguous and not negative and size > 0
                for dtype, cpu, contiguous, negative, size in zip(map(_DTYPE, tensors), map(_IS_CPU, tensors),
                                                                   map(_IS_CONTIGUOUS, tensors),
                                                                   map(_IS_NEG, tensors), map(_NUMEL, tensors))]
    except RuntimeError:  # a layout without strides (sparse CSR): ``lean``'s own order of checks decides
        return [lean(t) for t in tensors]


def batchable(tensor: torch.Tensor, start: torch.Tensor | None, copy_to: torch.Tensor | None) -> bool:
    """Whether ``add_many`` can hand ``tensor`` (and its start and copy) to the kernels by address."""
    if not lean(tensor):
        return False
    for other in (start, copy_to):
        if other is not None and not (other.dtype == tensor.dtype and other.is_cpu and other.is_contiguous()
                                      and other.numel() == tensor.numel() and not other.is_neg()):
            return False
    return True


def _host_array(tensor: torch.Tensor, like: np.ndarray) -> np.ndarray | None:
    """``tensor`` as a flat numpy view matching ``like`` (size and dtype), or None if it is not one."""
    if (tensor.device.type != "cpu" or not tensor.is_contiguous() or tensor.numel() != like.size
            or NUMPY_DTYPE.get(tensor.dtype) != like.dtype):  # bfloat16 has no numpy view at all
        return None
    return tensor.reshape(-1).numpy()


def difference(value: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
    """``value - start`` (a parameter's update) where it does not lose what it measures: half-precision
    floats subtract in float32 and integers in float64, since in their own dtype the difference would be
    rounded to the values' coarse grid (or wrap around); float32, float64 and complex stay as they are.

    >>> a, b = torch.tensor([256.0], dtype=torch.bfloat16), torch.tensor([-1.0], dtype=torch.bfloat16)
    >>> (a - b).item(), difference(a, b).item()
    (256.0, 257.0)
    """
    if value.dtype in NUMPY_DTYPE or value.is_complex():
        return value - start
    wide = torch.float32 if value.is_floating_point() else torch.float64
    return value.to(wide) - start.to(wide)

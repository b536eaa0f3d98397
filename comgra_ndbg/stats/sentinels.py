"""Sentinel rows: the few statistics of a tensor that say whether it moved, at a fraction of a summary's cost.

A sentinel row holds the element count, Σx² (so the norm and the rms), the minimum and the maximum (so the
largest magnitude) and, when a tensor holds NaN or ±Inf, its exact non-finite counts. The fields it does not
compute — Σx, Σ|x|, the zero count — are NaN, so the statistics derived from them (mean, std, mean absolute
value, zero fraction) read as absent at that step rather than as a wrong number; the unit fields are 0, as
for any batch-less tensor.

They come from torch's vectorised reductions (``torch._foreach_norm`` over all tensors at once and one
``aminmax`` each) with a single host copy for all of them. Inside a training loop on the benchmark MLP that
is about a third of the compiled summary passes they replace (``docs/recording.md``, "Statistic tiers"): a
summary needs more arithmetic per element than torch's norm kernels, and the parameters are read from
memory, not cache, once per pass. A tensor with NaN or ±Inf, or one these reductions do not take (an empty
or non-float tensor), gets a full summary row instead, which holds every sentinel field exactly.

>>> import torch
>>> rows = sentinel_rows([torch.tensor([3.0, -4.0]), torch.tensor([1.0, float("nan")])])
>>> float(rows[0, FIELD["sum_sq"]]), float(rows[0, FIELD["min"]]), bool(np.isnan(rows[0, FIELD["sum"]]))
(25.0, -4.0, True)
>>> int(rows[1, FIELD["nan"]]), float(rows[1, FIELD["sum"]])
(1, 1.0)
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from comgra_ndbg.stats.fields import FIELD, identity_rows
from comgra_ndbg.stats.reducer import Reducer

__all__ = ["SENTINEL_FIELDS", "ABSENT_FIELDS", "sentinel_rows", "update_sentinel_rows", "is_sentinel"]

SENTINEL_FIELDS = ("count", "nan", "inf", "sum_sq", "min", "max")
"""The fields a sentinel row computes."""
ABSENT_FIELDS = ("sum", "sum_abs", "zeros")
"""The fields a sentinel row leaves NaN: the statistics derived from them are absent at its step."""

_COUNT, _SUM_SQ, _MIN, _MAX = FIELD["count"], FIELD["sum_sq"], FIELD["min"], FIELD["max"]
_ABSENT = [FIELD[f] for f in ABSENT_FIELDS]
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def sentinel_rows(tensors: Sequence[torch.Tensor]) -> np.ndarray:
    """Sentinel rows ``[n, NUM_FIELDS]`` of ``tensors``; a tensor with NaN or ±Inf, or one the vectorised
    reductions do not take, gets a full summary row."""
    return _rows([t.detach() for t in tensors], lambda reducer, i: reducer.add(tensors[i].detach()))


def update_sentinel_rows(values: Sequence[torch.Tensor], starts: Sequence[torch.Tensor],
                         out: Sequence[torch.Tensor]) -> np.ndarray:
    """Sentinel rows of every update ``values[i] - starts[i]``, computed into ``out`` (buffers like
    ``values``, kept by the caller so no step allocates); a full row, from the pair, where needed.

    >>> import torch
    >>> rows = update_sentinel_rows([torch.tensor([1.0, 2.0])], [torch.tensor([1.5, 2.0])], [torch.empty(2)])
    >>> float(rows[0, FIELD["min"]]), float(rows[0, FIELD["max"]])
    (-0.5, 0.0)
    """
    for value, start, buffer in zip(values, starts, out):
        torch.sub(value.detach(), start, out=buffer)
    return _rows(list(out), lambda reducer, i: reducer.add(values[i].detach(), start=starts[i]))


def _rows(tensors: list[torch.Tensor], exactly: Callable[[Reducer, int], object]) -> np.ndarray:
    rows = identity_rows(len(tensors))
    rows[:, _ABSENT] = np.nan
    taken = [i for i, t in enumerate(tensors) if t.dtype in _FLOATS and t.numel() > 0]
    finite: list[bool] = []
    if taken:
        chosen = [tensors[i] for i in taken]
        norms = torch._foreach_norm(chosen)
        extremes = [torch.aminmax(t) for t in chosen]
        scalars = [*norms, *(lo for lo, _ in extremes), *(hi for _, hi in extremes)]
        if len({t.dtype for t in scalars}) > 1:
            scalars = [t.double() for t in scalars]
        facts = torch.stack(scalars).double().cpu().numpy().reshape(3, len(taken))
        index = np.array(taken, dtype=np.int64)
        rows[index, _COUNT] = [t.numel() for t in chosen]
        rows[index, _SUM_SQ] = facts[0] * facts[0]
        rows[index, _MIN] = facts[1]
        rows[index, _MAX] = facts[2]
        finite = np.isfinite(facts).all(axis=0).tolist()
    kept = set(taken)
    exact = [i for i, ok in zip(taken, finite) if not ok] + [i for i in range(len(tensors)) if i not in kept]
    if exact:
        reducer = Reducer()
        for i in exact:
            exactly(reducer, i)
        rows[exact] = reducer.collect()
    return rows


def is_sentinel(rows: np.ndarray) -> np.ndarray:
    """Which rows ``[..., NUM_FIELDS]`` are sentinel rows (elements counted, Σx absent).

    >>> row = identity_rows(1)[0]; row[FIELD["count"]], row[FIELD["sum"]] = 4, np.nan
    >>> is_sentinel(row).tolist()
    True
    """
    rows = np.asarray(rows, dtype=np.float64)
    return (rows[..., _COUNT] > 0) & np.isnan(rows[..., FIELD["sum"]])

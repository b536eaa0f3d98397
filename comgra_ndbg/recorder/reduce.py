"""Summaries of tensors as sufficient-statistic rows, computed on the tensor's device.

Each ``add`` issues a handful of fused full reductions (``sum``, ``dot``, ``aminmax``, ``count_nonzero``)
that stay on the device as 0-d tensors; ``collect`` stacks every pending scalar into one buffer and moves
it to the host in a single copy, so a step costs one synchronisation, not one ``.item()`` per tensor.

Small tensors off the host that ``add_many`` receives together (parameters, their gradients and updates)
are reduced together by ``segmented``, in a dozen launches instead of eight per tensor.

CPU tensors are summarised at once by the single-pass kernels of ``kernels`` (numpy when numba is
missing), written straight into the row: on the host a torch op's dispatch costs more than the arithmetic
on typical layer sizes. ``add`` can also copy the tensor in the same pass (``copy_to``) or summarise its
difference to another tensor without materialising it (``start``): that is how parameter values and
updates cost one read each.

NaN and ±Inf are rare, so the fast path does not look for them: any row whose moments come out non-finite
(which NaN, Inf and float32 overflow all cause) is recomputed exactly, in float64, on its tensor.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from comgra_ndbg.recorder import kernels, parallel, segmented
from comgra_ndbg.store.schema import FIELD, identity_row

__all__ = ["difference", "Reducer", "summarize", "saturation_bounds", "DEFAULT_SATURATION_MARGIN"]

DEFAULT_SATURATION_MARGIN = 0.005
"""Fraction of the bounded range within which an element counts as saturated (tanh: |x| > 0.99)."""

# Output ranges of activations whose autograd node identifies them.
_KNOWN_BOUNDS = {
    "TanhBackward0": (-1.0, 1.0),
    "SigmoidBackward0": (0.0, 1.0),
    "SoftmaxBackward0": (0.0, 1.0),
    "HardsigmoidBackward0": (0.0, 1.0),
}
_FLOAT_FIELDS = ("sum", "sum_sq", "sum_abs", "min", "max")
_MOMENT_COLUMNS = [FIELD[f] for f in _FLOAT_FIELDS]
_SEGMENT_COLUMNS = [FIELD[f] for f in ("sum", "sum_sq", "sum_abs", "min", "max")]  # segment_moments' order
_COUNT = FIELD["count"]


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


@dataclass
class _Pending:
    tensor: torch.Tensor
    row: int
    batched: bool
    bounds: tuple[float, float] | None


@dataclass
class _Block:
    """Rows that ``segmented.segment_moments`` computed on the device, waiting for ``collect``'s host copy."""

    rows: np.ndarray
    moments: torch.Tensor
    batched: np.ndarray  # per row: has units
    bounded: np.ndarray  # per row: has saturation bounds

    def write(self, rows: np.ndarray, values: np.ndarray) -> None:
        """Put the block's host ``values`` (``[k, 9]``) into the reducer's ``rows``."""
        rows[self.rows[:, None], _SEGMENT_COLUMNS] = values[:, :segmented.NONZERO]
        rows[self.rows, FIELD["zeros"]] = rows[self.rows, _COUNT] - values[:, segmented.NONZERO]
        rows[self.rows[self.batched], FIELD["dead_units"]] = values[self.batched, segmented.DEAD]
        rows[self.rows[self.bounded], FIELD["saturated"]] = values[self.bounded, segmented.SATURATED]
        both = self.batched & self.bounded
        rows[self.rows[both], FIELD["saturated_units"]] = values[both, segmented.SATURATED_UNITS]


class Reducer:
    """Accumulates reductions of many tensors and returns them as one ``[n, NUM_FIELDS]`` float64 array."""

    def __init__(self, saturation_margin: float = DEFAULT_SATURATION_MARGIN) -> None:
        self.saturation_margin = saturation_margin
        self._buffer = _identity_rows(64)  # rows [0, _size) are queued; the rest hold the merge identity
        self._size = 0
        self._pending: list[_Pending] = []
        self._scalars: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
        self._slots: dict[tuple[torch.device, torch.dtype], list[tuple[int, int]]] = {}
        self._blocks: list[_Block] = []  # segment_moments' rows on the device, not yet copied to the host
        self._deferred: list[tuple[int, torch.Tensor, int, tuple[float, float] | None]] = []  # row, copy, batch, bounds
        self.failed: dict[int, str] = {}  # rows the last collect() could not compute -> why

    def __len__(self) -> int:
        return self._size

    def _claim(self, count: int) -> int:
        """Reserve ``count`` identity rows; returns the index of the first. Rows live in one buffer that
        ``collect`` copies out in one piece (no per-row array to allocate and stack)."""
        first = self._size
        end = first + count
        if end > len(self._buffer):
            grown = _identity_rows(max(end, 2 * len(self._buffer)))
            grown[:first] = self._buffer[:first]
            self._buffer = grown
        self._size = end
        return first

    def add(self, tensor: torch.Tensor, *, batched: bool = False, bounds: tuple[float, float] | None = None,
            start: torch.Tensor | None = None, copy_to: torch.Tensor | None = None) -> int:
        """Queue the summary of ``tensor`` (of ``tensor - start`` when ``start`` is given); returns its row
        index in the next ``collect()``. ``copy_to`` (same shape, dtype and device) receives a copy of
        ``tensor`` in the same pass."""
        row_index = self._claim(1)
        if start is None and copy_to is None and kernels.AVAILABLE and _lean(tensor):  # the common case
            row = self._buffer[row_index]
            row[_COUNT] = tensor.numel()
            host = (tensor.detach() if tensor.requires_grad else tensor).numpy()
            batch = tensor.shape[0] if batched and host.ndim else 0
            if _kernel_summary(host, row, batch, bounds, self.saturation_margin):
                row[_MOMENT_COLUMNS] = np.nan
                _exact_moments(tensor.detach(), row)
            return row_index
        if start is None and copy_to is None and segmented.segmentable(tensor):
            # a copy now (in stream order, before any later in-place change); reduced with the rest in collect()
            batch = tensor.shape[0] if batched and tensor.dim() else 0
            self._deferred.append((row_index, tensor.detach().clone(), batch, bounds))
            return row_index
        self._add_at(row_index, tensor, batched=batched, bounds=bounds, start=start, copy_to=copy_to)
        return row_index

    def _add_at(self, row_index: int, tensor: torch.Tensor, *, batched: bool = False,
                bounds: tuple[float, float] | None = None, start: torch.Tensor | None = None,
                copy_to: torch.Tensor | None = None) -> None:
        row = self._buffer[row_index]
        x = tensor.detach()
        if x.layout is not torch.strided:  # a sparse gradient (nn.Embedding(sparse=True)): the zeros count too
            x = x.to_dense()
        numel = x.numel()
        row[FIELD["count"]] = numel
        if numel == 0:
            return
        flat = _work_view(x)
        is_batched = batched and x.dim() >= 1 and x.shape[0] > 0
        if flat.device.type == "cpu":
            if start is None and copy_to is None:
                _reduce_cpu(flat, row, x.shape[0] if is_batched else 0, bounds, self.saturation_margin)
            else:
                _reduce_cpu_fused(x, flat, row, start, copy_to)
            return
        if copy_to is not None:
            copy_to.copy_(x)
        if start is not None:
            x = difference(x, start.detach())
            flat = _work_view(x)
        self._push(row_index, FIELD["sum"], flat.sum())
        self._push(row_index, FIELD["sum_sq"], torch.dot(flat, flat))
        self._push(row_index, FIELD["sum_abs"], flat.abs().sum())
        low, high = torch.aminmax(flat)
        self._push(row_index, FIELD["min"], low)
        self._push(row_index, FIELD["max"], high)
        self._push(row_index, FIELD["zeros"], torch.count_nonzero(flat))
        if is_batched:
            per_unit = flat.view(x.shape[0], -1)
            row[FIELD["units"]] = per_unit.shape[1]
            self._push(row_index, FIELD["dead_units"], torch.count_nonzero(per_unit.abs().amax(0)))
        if bounds is not None:
            lo, hi = bounds
            margin = self.saturation_margin * (hi - lo)
            mask = (flat <= lo + margin) | (flat >= hi - margin)
            row[FIELD["bounded"]] = numel
            self._push(row_index, FIELD["saturated"], torch.count_nonzero(mask))
            if is_batched:
                units = mask.view(x.shape[0], -1).all(0)
                self._push(row_index, FIELD["saturated_units"], torch.count_nonzero(units))
        self._pending.append(_Pending(x, row_index, is_batched, bounds))

    def add_many(self, tensors: Sequence[torch.Tensor], *, batched: Sequence[bool] | None = None,
                 starts: Sequence[torch.Tensor] | None = None, copies: Sequence[torch.Tensor] | None = None
                 ) -> list[int]:
        """``add`` for many tensors (parameters, their gradients and updates, the gradients of one backward
        pass); returns their row indices. Contiguous float CPU tensors are summarised by one kernel call for
        all of them, which saves the per-tensor dispatch that dominates on small tensors. ``batched``,
        ``starts`` and ``copies`` pair up with ``tensors`` as ``add``'s arguments of those names do."""
        count = len(tensors)
        first = self._claim(count)
        fast = kernels.AVAILABLE
        if fast and starts is None and copies is None:
            lean = [_lean(t) for t in tensors]
        else:
            lean = [fast and _batchable(t, None if starts is None else starts[j], None if copies is None else copies[j])
                    for j, t in enumerate(tensors)]
        groups: dict[torch.dtype, list[int]] = {}
        device_groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
        for j, tensor in enumerate(tensors):
            start, copy_to = None if starts is None else starts[j], None if copies is None else copies[j]
            if lean[j]:
                groups.setdefault(tensor.dtype, []).append(j)
            elif _segmentable(tensor, start, copy_to):
                device_groups.setdefault((tensor.device, tensor.dtype), []).append(j)
            else:
                self._add_at(first + j, tensor, batched=bool(batched and batched[j]), start=start, copy_to=copy_to)
        for members in device_groups.values():
            self._add_segmented([first + j for j in members], [tensors[j] for j in members],
                                None if starts is None else [starts[j] for j in members],
                                None if copies is None else [copies[j] for j in members],
                                [tensors[j].shape[0] if batched and batched[j] and tensors[j].dim() else 0
                                 for j in members])
        for dtype, members in groups.items():
            whole = len(members) == count  # every tensor is in this group: its rows are one slice of the buffer
            group = tensors if whole else [tensors[j] for j in members]
            batches = None
            if batched is not None and any(batched[j] for j in members):
                batches = np.array([t.shape[0] if batched[j] and t.dim() else 0 for j, t in zip(members, group)],
                                   dtype=np.int64)
            group_starts = None if starts is None else [starts[j] for j in members]
            rows = self._buffer[first:first + count] if whole else _identity_rows(len(members))
            _summarize_addressed(
                rows, _NUMPY_DTYPE[dtype], np.array([t.data_ptr() for t in group], dtype=np.int64),
                np.array([t.numel() for t in group], dtype=np.int64), group, group_starts,
                None if starts is None else np.array([t.data_ptr() for t in group_starts], dtype=np.int64),
                None if copies is None else np.array([copies[j].data_ptr() for j in members], dtype=np.int64), batches)
            if not whole:
                self._buffer[[first + j for j in members]] = rows
        return list(range(first, first + count))

    def _add_segmented(self, rows: list[int], tensors: list[torch.Tensor], starts: list[torch.Tensor] | None,
                       copies: list[torch.Tensor] | None, batches: list[int],
                       bounds: list[tuple[float, float] | None] | None = None) -> None:
        """Queue the summaries of small tensors of one device and dtype (of their difference to ``starts``;
        ``copies`` receive a copy) into ``rows``, reduced together by ``segmented.segment_moments``;
        ``batches`` holds each tensor's batch size (0: batch-less), ``bounds`` its saturation bounds."""
        group = [t.detach() for t in tensors]
        if copies is not None:
            torch._foreach_copy_(copies, group)
        if starts is not None:
            begins = [t.detach() for t in starts]
            if group[0].dtype in _NUMPY_DTYPE:
                group = list(torch._foreach_sub(group, begins))
            else:
                group = [difference(t, begin) for t, begin in zip(group, begins)]
        kept = group if copies is None else copies  # what the exact recompute reads: the values as of now
        bounds = bounds or [None] * len(group)
        margin = self.saturation_margin
        thresholds = [None if b is None else (b[0] + margin * (b[1] - b[0]), b[1] - margin * (b[1] - b[0]))
                      for b in bounds]
        for part in segmented.chunks([t.numel() for t in group]):
            targets = np.array([rows[i] for i in part], dtype=np.int64)
            sizes = np.array([group[i].numel() for i in part], dtype=np.int64)
            part_batches = np.array([batches[i] for i in part], dtype=np.int64)
            bounded = np.array([bounds[i] is not None for i in part])
            self._buffer[targets, _COUNT] = sizes
            self._buffer[targets[part_batches > 0], FIELD["units"]] = (sizes // np.maximum(part_batches, 1))[
                part_batches > 0]
            self._buffer[targets[bounded], FIELD["bounded"]] = sizes[bounded]
            moments = segmented.segment_moments([group[i] for i in part], part_batches.tolist(),
                                                [thresholds[i] for i in part])
            self._blocks.append(_Block(targets, moments, part_batches > 0, bounded))
            self._pending.extend(_Pending(kept[i], rows[i], batches[i] > 0, bounds[i]) for i in part)

    def _reduce_deferred(self) -> None:
        """Reduce the copies ``add`` kept of small device tensors, one segmented call per device and dtype."""
        groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
        for i, (_, tensor, _, _) in enumerate(self._deferred):
            groups.setdefault((tensor.device, tensor.dtype), []).append(i)
        deferred, self._deferred = self._deferred, []
        for members in groups.values():
            self._add_segmented([deferred[i][0] for i in members], [deferred[i][1] for i in members], None, None,
                                [deferred[i][2] for i in members], [deferred[i][3] for i in members])

    def add_addressed(self, dtype: np.dtype, addresses: np.ndarray, sizes: np.ndarray, tensors: Sequence[torch.Tensor],
                      *, starts: Sequence[torch.Tensor] | None = None, start_addresses: np.ndarray | None = None,
                      copies: np.ndarray | None = None) -> range:
        """Summarise contiguous host arrays of ``dtype`` given by address and size in one kernel call, for a
        caller that knows the addresses are valid (``ParameterTracker``, for parameters that did not move),
        skipping ``add_many``'s checks. ``tensors`` (and ``starts``, at ``start_addresses``) are the tensors
        behind the addresses, read again only for the exact recompute; ``copies`` are addresses receiving a
        copy. Returns the row indices."""
        first = self._claim(len(sizes))
        _summarize_addressed(self._buffer[first:first + len(sizes)], dtype, addresses, sizes, tensors, starts,
                             start_addresses, copies, None)
        return range(first, first + len(sizes))

    def _push(self, row: int, field: int, scalar: torch.Tensor) -> None:
        key = (scalar.device, scalar.dtype)
        self._scalars.setdefault(key, []).append(scalar)
        self._slots.setdefault(key, []).append((row, field))

    def collect(self) -> np.ndarray:
        """All queued rows, ``[n, NUM_FIELDS]``; the reducer is empty afterwards, whatever happens.

        A row that cannot be computed (a tensor whose device cannot hand its values over) is left as the
        merge identity (absent) and listed in :attr:`failed` (row -> reason), so one bad tensor costs its own
        row and never the others, or the next step's.
        """
        self.failed: dict[int, str] = {}
        try:
            return self._collect()
        finally:
            self._buffer[:self._size] = _IDENTITY
            self._size = 0
            self._deferred = []
            self._pending.clear()
            self._scalars.clear()
            self._slots.clear()
            self._blocks.clear()

    def _collect(self) -> np.ndarray:
        if self._deferred:
            try:
                self._reduce_deferred()
            except Exception as error:  # noqa: BLE001 - the rows are reported as failed
                self._fail([row for row, *_ in self._deferred], error)
                self._deferred = []
        rows = self._buffer[:self._size].copy()
        if self._scalars or self._blocks:
            keys = list(self._scalars)
            parts = [torch.stack(self._scalars[k]).to(torch.float64) for k in keys] + [b.moments for b in self._blocks]
            try:
                host = _to_host(parts)
            except Exception:  # noqa: BLE001 - one part at a time, to find the ones that fail
                host = [self._part_to_host(part, [s[0] for s in self._slots[keys[i]]] if i < len(keys) else
                                           self._blocks[i - len(keys)].rows.tolist()) for i, part in enumerate(parts)]
            good = [i for i, k in enumerate(keys) if host[i] is not None]
            if good:
                packed = np.concatenate([host[i] for i in good])
                slots = np.array([slot for i in good for slot in self._slots[keys[i]]], dtype=np.int64)
                rows[slots[:, 0], slots[:, 1]] = packed
                for f in ("zeros", "dead_units"):
                    # count_nonzero counted the non-zero elements / units; store the zero ones.
                    _complement(rows, slots, packed, FIELD[f], FIELD["count"] if f == "zeros" else FIELD["units"])
            wide = np.zeros(len(rows), dtype=np.bool_)  # rows summed in float64: they cancel much later
            for block, values in zip(self._blocks, host[len(keys):]):
                if values is not None:
                    block.write(rows, values.reshape(len(block.rows), -1))
                    wide[block.rows] = True
            cancels = _cancels(rows)
            cancels[wide] = _cancels(rows[wide], tolerance=1e-8)
            suspicious = ~np.isfinite(rows[:, _MOMENT_COLUMNS]).all(axis=1) | cancels
            if suspicious.any():
                for pending in self._pending:
                    if suspicious[pending.row] and pending.row not in self.failed:
                        rows[pending.row, _MOMENT_COLUMNS] = np.nan
                        try:
                            _exact_moments(pending.tensor, rows[pending.row])
                        except Exception as error:  # noqa: BLE001 - reported as failed
                            self._fail([pending.row], error)
        if self.failed:
            rows[list(self.failed)] = _IDENTITY
        return rows

    def _part_to_host(self, part: torch.Tensor, rows: list[int]) -> np.ndarray | None:
        try:
            return part.reshape(-1).cpu().numpy()
        except Exception as error:  # noqa: BLE001 - reported as failed
            self._fail(rows, error)
            return None

    def _fail(self, rows: list[int], error: BaseException) -> None:
        for row in rows:
            self.failed.setdefault(int(row), f"{type(error).__name__}: {error}")


def _to_host(parts: list[torch.Tensor]) -> list[np.ndarray]:
    """Every tensor of ``parts`` as a flat float64 numpy array, in one copy per device."""
    out: list[np.ndarray | None] = [None] * len(parts)
    by_device: dict[torch.device, list[int]] = {}
    for i, part in enumerate(parts):
        by_device.setdefault(part.device, []).append(i)
    for members in by_device.values():
        host = torch.cat([parts[i].reshape(-1) for i in members]).cpu().numpy()
        for i, values in zip(members, np.split(host, np.cumsum([parts[i].numel() for i in members])[:-1])):
            out[i] = values
    return out


def _segmentable(tensor: torch.Tensor, start: torch.Tensor | None, copy_to: torch.Tensor | None) -> bool:
    """Whether ``add_many`` reduces ``tensor`` (and its start and copy) with ``segmented``."""
    if not segmented.segmentable(tensor):
        return False
    for other in (start, copy_to):
        if other is not None and not (other.dtype == tensor.dtype and other.device == tensor.device
                                      and other.shape == tensor.shape and not other.is_neg()):
            return False
    return True


def _reduce_cpu(flat: torch.Tensor, row: np.ndarray, batch: int, bounds: tuple[float, float] | None,
                saturation_margin: float) -> None:
    """Summarise a flat CPU tensor into ``row``: with the fused kernels when they apply, else with numpy."""
    a = np.ascontiguousarray(flat.numpy())  # a flat view can still be strided (a column, an expanded scalar)
    if kernels.AVAILABLE and a.dtype in _KERNEL_DTYPES:
        exact = _kernel_summary(a, row, batch, bounds, saturation_margin)
    else:
        with np.errstate(all="ignore"):  # float32 overflow is expected here; the exact recompute handles it
            _reduce_host(a, row, batch, bounds, saturation_margin)
        exact = not np.isfinite(row[_MOMENT_COLUMNS]).all()
        if not exact and _row_cancels(row):  # float32 sums cannot resolve the variance: redo them in float64
            wide = a.astype(np.float64)
            row[FIELD["sum"]], row[FIELD["sum_sq"]] = wide.sum(), np.dot(wide, wide)
    if exact:
        row[_MOMENT_COLUMNS] = np.nan
        _exact_moments(flat, row)


def _kernel_summary(a: np.ndarray, row: np.ndarray, batch: int, bounds: tuple[float, float] | None,
                    saturation_margin: float) -> bool:
    """``kernels.summarize`` of a C-contiguous host array seen as ``[batch, units]``; True: recompute exactly."""
    thresholds = None if bounds is None else _thresholds(bounds, saturation_margin, a.dtype)
    return kernels.summarize(a.reshape(batch or 1, -1), row, thresholds, batch > 0)


_THRESHOLDS: dict[tuple[float, float, float, np.dtype], np.ndarray] = {}


def _thresholds(bounds: tuple[float, float], saturation_margin: float, dtype: np.dtype) -> np.ndarray:
    """The saturation thresholds of ``bounds`` (margin applied) as a kernel argument of ``dtype``, cached:
    one activation's bounds recur on every step."""
    key = (bounds[0], bounds[1], saturation_margin, dtype)
    cached = _THRESHOLDS.get(key)
    if cached is None:
        margin = saturation_margin * (bounds[1] - bounds[0])
        cached = _THRESHOLDS[key] = np.array([bounds[0] + margin, bounds[1] - margin], dtype=dtype)
    return cached


def _reduce_cpu_fused(x: torch.Tensor, flat: torch.Tensor, row: np.ndarray, start: torch.Tensor | None,
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
            row[_MOMENT_COLUMNS] = np.nan
            _exact_moments(x if start is None else x.double() - start.detach().double(), row)
        return
    if copy_to is not None:
        copy_to.copy_(x)
    summand = x if start is None else difference(x, start.detach())
    _reduce_cpu(_work_view(summand), row, 0, None, DEFAULT_SATURATION_MARGIN)


_IDENTITY = identity_row()


def _identity_rows(count: int) -> np.ndarray:
    """``count`` rows of the merge identity, ``[count, NUM_FIELDS]``."""
    return np.repeat(_IDENTITY[None], count, axis=0)


_NUMPY_DTYPE = {torch.float32: np.dtype(np.float32), torch.float64: np.dtype(np.float64)}


def _summarize_addressed(rows: np.ndarray, dtype: np.dtype, addresses: np.ndarray, sizes: np.ndarray,
                         tensors: Sequence[torch.Tensor], starts: Sequence[torch.Tensor] | None,
                         start_addresses: np.ndarray | None, copies: np.ndarray | None,
                         batches: np.ndarray | None) -> None:
    """One kernel call over arrays given by address, into ``rows`` (identity rows, one per array); rows the
    kernel flags are recomputed exactly from ``tensors`` (minus ``starts``)."""
    rows[:, _COUNT] = sizes
    exact = parallel.moments_many(dtype, addresses, sizes, rows, starts=start_addresses, copies=copies,
                                  batches=batches)
    for position in np.flatnonzero(exact).tolist():
        row = rows[position]
        row[_MOMENT_COLUMNS] = np.nan
        value = tensors[position].detach()
        _exact_moments(value if starts is None else value.double() - starts[position].detach().double(), row)


def _lean(tensor: torch.Tensor) -> bool:
    """Whether the kernels can read ``tensor`` in place: a non-empty contiguous float32/float64 host tensor
    (a lazily negated view holds the other sign in memory)."""
    return (tensor.dtype in _NUMPY_DTYPE and tensor.is_cpu and tensor.is_contiguous() and not tensor.is_neg()
            and tensor.numel() > 0)


def _batchable(tensor: torch.Tensor, start: torch.Tensor | None, copy_to: torch.Tensor | None) -> bool:
    """Whether ``add_many`` can hand ``tensor`` (and its start and copy) to the kernels by address."""
    if not _lean(tensor):
        return False
    for other in (start, copy_to):
        if other is not None and not (other.dtype == tensor.dtype and other.is_cpu and other.is_contiguous()
                                      and other.numel() == tensor.numel() and not other.is_neg()):
            return False
    return True


def _host_array(tensor: torch.Tensor, like: np.ndarray) -> np.ndarray | None:
    """``tensor`` as a flat numpy view matching ``like`` (size and dtype), or None if it is not one."""
    if (tensor.device.type != "cpu" or not tensor.is_contiguous() or tensor.numel() != like.size
            or _NUMPY_DTYPE.get(tensor.dtype) != like.dtype):  # bfloat16 has no numpy view at all
        return None
    return tensor.reshape(-1).numpy()


_KERNEL_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def summarize(tensor: torch.Tensor, *, batched: bool = False, bounds: tuple[float, float] | None = None,
              saturation_margin: float = DEFAULT_SATURATION_MARGIN) -> np.ndarray:
    """The sufficient-statistic row of one tensor (a convenience over ``Reducer`` for tests and tools).

    >>> from comgra_ndbg.statistics import derive
    >>> s = derive(summarize(torch.tensor([[1.0, 0.0], [-3.0, 0.0]]), batched=True)[None])
    >>> float(s["mean"][0]), float(s["zero_fraction"][0]), float(s["dead_fraction"][0])
    (-0.5, 0.5, 0.5)
    """
    reducer = Reducer(saturation_margin)
    reducer.add(tensor, batched=batched, bounds=bounds)
    return reducer.collect()[0]


def difference(value: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
    """``value - start`` (a parameter's update) where it does not lose what it measures: half-precision
    floats subtract in float32 and integers in float64, since in their own dtype the difference would be
    rounded to the values' coarse grid (or wrap around); float32, float64 and complex stay as they are.

    >>> a, b = torch.tensor([256.0], dtype=torch.bfloat16), torch.tensor([-1.0], dtype=torch.bfloat16)
    >>> (a - b).item(), difference(a, b).item()
    (256.0, 257.0)
    """
    if value.dtype in _NUMPY_DTYPE or value.is_complex():
        return value - start
    wide = torch.float32 if value.is_floating_point() else torch.float64
    return value.to(wide) - start.to(wide)


def _work_view(x: torch.Tensor) -> torch.Tensor:
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


def _reduce_host(a: np.ndarray, row: np.ndarray, batch: int, bounds: tuple[float, float] | None,
                 saturation_margin: float) -> None:
    """The same statistics for a CPU tensor, with numpy: no per-op dispatch cost and no device to sync.

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


def _row_cancels(row: np.ndarray) -> bool:
    """``_cancels`` for one row, in plain floats (numpy's scalar machinery costs more than the test)."""
    n, s, q = float(row[FIELD["count"]]), float(row[FIELD["sum"]]), float(row[FIELD["sum_sq"]])
    return n > 1 and q > 0 and q - s * s / n < 1e-2 * q


def _cancels(rows: np.ndarray, tolerance: float = 1e-2) -> np.ndarray:
    """Rows whose float32 sums cannot resolve the variance: when |mean| exceeds about 10 std, Σx²/n - mean²
    cancels catastrophically (a LayerNorm gain of 1 ± 1e-4 came out with std 0), so they get the exact
    float64 recompute. Sums taken in float64 hold out to a ``tolerance`` of about 1e-8."""
    s, q, n = rows[..., FIELD["sum"]], rows[..., FIELD["sum_sq"]], rows[..., FIELD["count"]]
    with np.errstate(all="ignore"):
        return (n > 1) & (q > 0) & (q - s * s / np.maximum(n, 1) < tolerance * q)


def _complement(rows: np.ndarray, slots: np.ndarray, packed: np.ndarray, field: int, total_field: int) -> None:
    mask = slots[:, 1] == field
    target = slots[mask, 0]
    rows[target, field] = rows[target, total_field] - packed[mask]


def _exact_moments(tensor: torch.Tensor, row: np.ndarray) -> None:
    """Recompute counts of NaN/Inf/zeros and the moments of the finite elements, in float64."""
    flat = _work_view(tensor).double()
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

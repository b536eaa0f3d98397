"""Summaries of tensors as sufficient-statistic rows, computed on the tensor's device.

Device tensors that ``add_many`` receives together (parameters, their gradients and updates) are reduced
together: by ``fused`` in one Triton launch where Triton runs (which also takes a large tensor ``add`` gets),
else the small ones by ``segmented`` in a dozen launches and the rest one by one with a handful of full
reductions that stay on the device as 0-d tensors. ``collect`` moves every result to the host in one copy per
device (``collect_later``: without waiting, ``collected``). CPU tensors are summarised at once, straight into
their row, by ``host`` (the single-pass kernels, or numpy when numba is missing); ``add`` can copy a tensor
(``copy_to``) or summarise its difference to another (``start``) in that same pass.

NaN and ±Inf are rare, so the fast paths do not look for them: a row whose moments come out non-finite (which
NaN, Inf and float32 overflow all cause) is recomputed exactly, in float64, on its tensor (``fused``'s rows
count them on the device and need no recompute).
"""
from __future__ import annotations

from collections.abc import Sequence
from itertools import compress
from operator import attrgetter, not_

import numpy as np
import torch

from comgra_ndbg.stats import fused, kernels, segmented
from comgra_ndbg.stats.bounds import DEFAULT_SATURATION_MARGIN, saturation_thresholds
from comgra_ndbg.stats.collected import Collected, Pending as _Pending
from comgra_ndbg.stats.exact import exact_moments as _exact_moments, work_view as _work_view
from comgra_ndbg.stats.fields import FIELD, identity_row
from comgra_ndbg.stats.fields import identity_rows as _identity_rows
from comgra_ndbg.stats.host import MOMENT_COLUMNS as _MOMENT_COLUMNS, NUMPY_DTYPE as _NUMPY_DTYPE, difference
from comgra_ndbg.stats.host import batchable as _batchable, kernel_summary as _kernel_summary, lean as _lean
from comgra_ndbg.stats.host import lean_flags as _lean_flags, reduce_cpu as _reduce_cpu
from comgra_ndbg.stats.host import reduce_cpu_fused as _reduce_cpu_fused, summarize_addressed as _summarize_addressed
from comgra_ndbg.stats.transfer import Block as _Block, segmentable as _segmentable, single_block as _single_block

__all__ = ["Collected", "Reducer", "summarize"]

_COUNT = FIELD["count"]
_SPREAD_COUNT, _SPREAD_SUM_SQ, _SPREAD_DEV = FIELD["spread_count"], FIELD["spread_sum_sq"], FIELD["spread_dev_sq"]
_HOST_DEVICE = "cpu"  # summarised on the host; tests name another to run the device reductions on CPU tensors
_IDENTITY = identity_row()
_F64 = np.dtype(np.float64)
_DATA_PTR, _NUMEL, _DTYPE = torch.Tensor.data_ptr, torch.Tensor.numel, attrgetter("dtype")


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

    @property
    def ready(self) -> bool:
        """Whether every queued row is computed already (the host path): ``take_ready`` would return them."""
        return not (self._scalars or self._blocks or self._deferred)

    def _claim(self, count: int) -> int:
        """Reserve ``count`` identity rows; returns the index of the first (rows live in one buffer)."""
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
                _exact_moments(tensor.detach(), row, batch=batch)
            return row_index
        batch = tensor.shape[0] if batched and tensor.dim() else 0
        if start is None and copy_to is None and segmented.segmentable(tensor):
            # a copy now (in stream order, before any later in-place change); reduced with the rest in collect()
            self._deferred.append((row_index, tensor.detach().clone(), batch, bounds))
        elif fused.usable(tensor) and start is None and copy_to is None:  # a large device tensor: one launch now
            self._add_fused(row_index, tensor, batch, bounds)
        elif fused.usable(tensor) and _segmentable(tensor, start, copy_to):
            self._add_segmented([row_index], [tensor], None if start is None else [start],
                                None if copy_to is None else [copy_to], [batch], [bounds])
        else:
            self._add_at(row_index, tensor, batched=batched, bounds=bounds, start=start, copy_to=copy_to)
        return row_index

    def add_planned(self, tensor: torch.Tensor, batch: int, thresholds: np.ndarray | None, kernel: object,
                    dtype: np.dtype) -> int:
        """``add`` of a non-empty contiguous host tensor of ``dtype`` (float32/64) as ``[batch, units]`` (0: no
        batch), with its saturation thresholds (None: unbounded) and ``kernels.summary_entry``, which checks
        nothing: only the dtype is checked here (else ``kernels.summarize`` checks all)."""
        a = (tensor.detach() if tensor.requires_grad else tensor).numpy().reshape(batch or 1, -1)
        if a.dtype is dtype:
            return self.add_viewed(a, batch, thresholds, kernel)
        row_index = self._claim(1)
        row = self._buffer[row_index]
        row[_COUNT] = a.size
        if kernels.summarize(a, row, thresholds, batch > 0):
            row[_MOMENT_COLUMNS] = np.nan
            _exact_moments(tensor.detach(), row, batch=batch)
        return row_index

    def add_viewed(self, host: np.ndarray, batch: int, thresholds: np.ndarray | None, kernel: object) -> int:
        """``add_planned`` of the kernel's array ``host`` (``[batch or 1, units]`` of ``kernel``'s dtype, made and
        checked by the caller: a registration plan's C++ view); the exact recompute reads it too."""
        row_index = self._size
        if row_index < len(self._buffer):  # ``_claim(1)``, inline: this runs for every planned registration
            self._size = row_index + 1
        else:
            row_index = self._claim(1)
        row = self._buffer[row_index]
        row[_COUNT] = host.size
        if kernel(host, batch > 0, row) if thresholds is None else kernel(host, thresholds, batch > 0, row):
            row[_MOMENT_COLUMNS] = np.nan
            _exact_moments(torch.from_numpy(host), row, batch=batch)
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
        if flat.device.type == _HOST_DEVICE:
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
        squares = torch.dot(flat, flat)
        self._push(row_index, FIELD["sum"], flat.sum())
        self._push(row_index, FIELD["sum_sq"], squares)
        self._push(row_index, FIELD["sum_abs"], flat.abs().sum())
        low, high = torch.aminmax(flat)
        self._push(row_index, FIELD["min"], low)
        self._push(row_index, FIELD["max"], high)
        self._push(row_index, FIELD["zeros"], torch.count_nonzero(flat))
        if is_batched:
            per_unit = flat.view(x.shape[0], -1)
            row[FIELD["units"]] = per_unit.shape[1]
            self._push(row_index, FIELD["dead_units"], torch.count_nonzero(per_unit.abs().amax(0)))
            if x.shape[0] > 1:  # every element takes part: a NaN or Inf sends the row to the exact recompute
                row[_SPREAD_COUNT] = numel
                self._push(row_index, _SPREAD_SUM_SQ, squares)
                self._push(row_index, _SPREAD_DEV, per_unit.var(0, correction=0).sum() * x.shape[0])
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
        """``add`` for many tensors (parameters, gradients, updates); returns their row indices. Contiguous float
        CPU tensors are summarised by one kernel call for all of them (no per-tensor dispatch). ``batched``,
        ``starts`` and ``copies`` pair up with ``tensors`` as ``add``'s arguments of those names do."""
        if any(other is not None and len(other) != len(tensors) for other in (batched, starts, copies)):
            raise ValueError(f"add_many takes one batched flag, start and copy per tensor ({len(tensors)} tensors)")
        count, first, fast = len(tensors), self._claim(len(tensors)), kernels.AVAILABLE
        lean = _lean_flags(tensors) if fast and starts is None and copies is None else [  # (C-level passes)
            fast and _batchable(t, None if starts is None else starts[j], None if copies is None else copies[j])
            for j, t in enumerate(tensors)]
        dtypes = set(map(_DTYPE, tensors))
        if len(dtypes) == 1 and False not in lean and count:  # the usual case: one kernel call, no sorting
            self._add_group(first, count, tensors, batched, range(count), starts, copies, dtypes.pop())
            return list(range(first, first + count))
        groups: dict[torch.dtype, list[int]] = {}
        device_groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
        for j in compress(range(count), lean):
            groups.setdefault(tensors[j].dtype, []).append(j)
        for j in compress(range(count), map(not_, lean)):
            tensor = tensors[j]
            start, copy_to = None if starts is None else starts[j], None if copies is None else copies[j]
            if _segmentable(tensor, start, copy_to):
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
            self._add_group(first, count, tensors, batched, members, starts, copies, dtype)
        return list(range(first, first + count))

    def _add_group(self, first: int, count: int, tensors: Sequence[torch.Tensor], batched: Sequence[bool] | None,
                   members: Sequence[int], starts: Sequence[torch.Tensor] | None, copies: Sequence[torch.Tensor] | None,
                   dtype: torch.dtype) -> None:
        """One kernel call into rows ``first + j`` for ``tensors[j]``, ``j`` in ``members`` (``add_many``'s)."""
        whole = len(members) == count  # every tensor is in this group: its rows are one slice of the buffer
        group = tensors if whole else [tensors[j] for j in members]
        picked = batched if whole or batched is None else [batched[j] for j in members]
        batches = None
        if picked is not None and any(picked):
            batches = np.array([t.shape[0] if b and t.dim() else 0 for t, b in zip(group, picked)], dtype=np.int64)
        group_starts = None if starts is None else [starts[j] for j in members]
        rows = self._buffer[first:first + count] if whole else _identity_rows(len(group))
        _summarize_addressed(
            rows, _NUMPY_DTYPE[dtype], np.fromiter(map(_DATA_PTR, group), np.int64, len(group)),
            np.fromiter(map(_NUMEL, group), np.int64, len(group)), group, group_starts,
            None if starts is None else np.fromiter(map(_DATA_PTR, group_starts), np.int64, len(group)),
            None if copies is None else np.array([copies[j].data_ptr() for j in members], dtype=np.int64), batches)
        if not whole:
            self._buffer[[first + j for j in members]] = rows

    def _add_segmented(self, rows: list[int], tensors: list[torch.Tensor], starts: list[torch.Tensor] | None,
                       copies: list[torch.Tensor] | None, batches: list[int],
                       bounds: list[tuple[float, float] | None] | None = None) -> None:
        """Queue the summaries of device tensors of one dtype (of their difference to ``starts``; ``copies``
        receive a copy) into ``rows``, reduced together; ``batches``: batch sizes (0: none), ``bounds``: saturation."""
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
        thresholds = [None if b is None else tuple(saturation_thresholds(b, margin, _F64).tolist()) for b in bounds]
        every = range(len(group))
        if fused.usable(group[0]):
            try:
                return self._reduce_parts(rows, group, kept, batches, bounds, thresholds, [every], True)
            except fused.FusedUnavailable:  # the small ones together, the others one by one
                for i in [i for i in every if not segmented.segmentable(group[i])]:
                    self._add_at(rows[i], group[i], batched=batches[i] > 0, bounds=bounds[i])
                every = [i for i in every if segmented.segmentable(group[i])]
        parts = [[every[j] for j in part] for part in segmented.chunks([group[i].numel() for i in every])]
        self._reduce_parts(rows, group, kept, batches, bounds, thresholds, parts, False)

    def _reduce_parts(self, rows: list[int], group: list[torch.Tensor], kept: list[torch.Tensor], batches: list[int],
                      bounds: list, thresholds: list, parts: Sequence[Sequence[int]], complete: bool) -> None:
        """``_add_segmented``'s reduction of ``parts`` of ``group``: by ``fused`` when ``complete`` (its rows need
        no recompute, so no tensor is kept for one), else by ``segmented``."""
        reduce = fused.fused_moments if complete else segmented.segment_moments
        for part in parts:
            targets = np.array([rows[i] for i in part], dtype=np.int64)
            sizes = np.array([group[i].numel() for i in part], dtype=np.int64)
            part_batches = np.array([batches[i] for i in part], dtype=np.int64)
            bounded = np.array([bounds[i] is not None for i in part])
            self._buffer[targets, _COUNT] = sizes
            self._buffer[targets[part_batches > 0], FIELD["units"]] = (sizes // np.maximum(part_batches, 1))[
                part_batches > 0]
            self._buffer[targets[bounded], FIELD["bounded"]] = sizes[bounded]
            moments = reduce([group[i] for i in part], part_batches.tolist(), [thresholds[i] for i in part])
            self._blocks.append(_Block(targets, moments, part_batches > 0, bounded, part_batches > 1, complete))
            if not complete:
                self._pending.extend(_Pending(kept[i], rows[i], batches[i] > 0, bounds[i]) for i in part)

    def _add_fused(self, row: int, tensor: torch.Tensor, batch: int, bounds: tuple[float, float] | None) -> None:
        """``add`` of one large device tensor: its complete row, now, by one ``fused`` launch (no recompute)."""
        numel = tensor.numel()
        thresholds = (None if bounds is None
                      else tuple(saturation_thresholds(bounds, self.saturation_margin, _F64).tolist()))
        try:
            moments = fused.fused_moments([tensor], [batch], [thresholds])
        except fused.FusedUnavailable:
            return self._add_at(row, tensor, batched=batch > 0, bounds=bounds)
        target = self._buffer[row]  # an identity row: units and bounded are 0 until set
        target[_COUNT], target[FIELD["units"]] = numel, (numel // batch if batch else 0)
        target[FIELD["bounded"]] = numel if bounds is not None else 0
        self._blocks.append(_single_block(row, moments, batch, bounds is not None))

    def _reduce_deferred(self) -> None:
        """Reduce the copies ``add`` kept of small device tensors, one segmented call per device and dtype."""
        groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
        deferred, self._deferred = self._deferred, []
        for i, (_, tensor, _, _) in enumerate(deferred):
            groups.setdefault((tensor.device, tensor.dtype), []).append(i)
        for members in groups.values():
            self._add_segmented([deferred[i][0] for i in members], [deferred[i][1] for i in members], None, None,
                                [deferred[i][2] for i in members], [deferred[i][3] for i in members])

    def add_addressed(self, dtype: np.dtype, addresses: np.ndarray, sizes: np.ndarray, tensors: Sequence[torch.Tensor],
                      *, starts: Sequence[torch.Tensor] | None = None, start_addresses: np.ndarray | None = None,
                      copies: np.ndarray | None = None, batches: np.ndarray | None = None) -> range:
        """Summarise contiguous host arrays of ``dtype`` by address and size in one kernel call, for a caller
        that knows the addresses are valid (parameters that did not move; the C++ packing of ``recorder/native``),
        skipping ``add_many``'s checks. ``tensors`` (and ``starts``, at ``start_addresses``) are read again only
        for the exact recompute; ``copies``: addresses receiving a copy; ``batches``: batch sizes (0: none)."""
        first = self._claim(len(sizes))
        _summarize_addressed(self._buffer[first:first + len(sizes)], dtype, addresses, sizes, tensors, starts,
                             start_addresses, copies, batches)
        return range(first, first + len(sizes))

    def _push(self, row: int, field: int, scalar: torch.Tensor) -> None:
        self._scalars.setdefault((scalar.device, scalar.dtype), []).append(scalar)
        self._slots.setdefault((scalar.device, scalar.dtype), []).append((row, field))

    def collect(self) -> np.ndarray:
        """All queued rows, ``[n, NUM_FIELDS]``; the reducer is empty afterwards, whatever happens.

        A row that cannot be computed (a tensor whose device cannot hand its values over) is left as the
        merge identity (absent) and listed in :attr:`failed` (row -> reason), so one bad tensor costs its own
        row and never the others, or the next step's."""
        collected = self.collect_later()
        try:
            return collected.rows()
        finally:
            self.failed = collected.failed

    def collect_later(self) -> Collected:
        """``collect`` without waiting for a device: every result starts on its way to the host (one
        non-blocking copy per device) and the reducer is empty at once; ``rows()`` of the returned
        :class:`Collected` waits for the copies and returns what ``collect`` would have."""
        failed: dict[int, str] = {}
        self.failed = failed
        rows = self.take_ready()
        if rows is not None:
            return Collected.ready(rows, failed)
        try:
            if self._deferred:
                try:
                    self._reduce_deferred()
                except Exception as error:  # noqa: BLE001 - the rows are reported as failed
                    self._fail([row for row, *_ in self._deferred], error)
                    self._deferred = []
            return Collected(self._buffer[:self._size].copy(), dict(self._scalars), dict(self._slots),
                             list(self._blocks), list(self._pending), failed)
        finally:
            self._buffer[:self._size] = _IDENTITY
            self._size = 0
            self._deferred = []
            self._pending.clear()
            self._scalars.clear()
            self._slots.clear()
            self._blocks.clear()

    def take_ready(self) -> np.ndarray | None:
        """The queued rows when every one is computed already (the host path), the reducer emptied; else None,
        the rows left queued for ``collect`` or ``collect_later``."""
        if not self.ready:
            return None
        rows = self._buffer[:self._size].copy()
        self._buffer[:self._size] = _IDENTITY
        self._size = 0
        self._pending.clear()
        return rows

    def _fail(self, rows: list[int], error: BaseException) -> None:
        for row in rows:
            self.failed.setdefault(int(row), f"{type(error).__name__}: {error}")


def summarize(tensor: torch.Tensor, *, batched: bool = False, bounds: tuple[float, float] | None = None,
              saturation_margin: float = DEFAULT_SATURATION_MARGIN) -> np.ndarray:
    """The sufficient-statistic row of one tensor (a convenience over ``Reducer`` for tests and tools).

    >>> from comgra_ndbg.stats.statistics import derive
    >>> s = derive(summarize(torch.tensor([[1.0, 0.0], [-3.0, 0.0]]), batched=True)[None])
    >>> float(s["mean"][0]), float(s["zero_fraction"][0]), float(s["dead_fraction"][0])
    (-0.5, 0.5, 0.5)
    """
    reducer = Reducer(saturation_margin)
    reducer.add(tensor, batched=batched, bounds=bounds)
    return reducer.collect()[0]

"""The rows of the next segment as they arrive, and the segment content they become at a flush.

The recorder hands the writer plain numbers and numpy arrays, one step at a time; they are kept in lists
(appending costs nothing measurable on the training thread) and turned into the parallel arrays of a
``SegmentContent`` only when a flush takes them. Snapshot element values, most of the bytes, are copied
into ``ValueBlocks`` as they arrive instead (whose full blocks wait in a scratch file in the recording's
folder), which the segment's value pool then is; summary rows are copied into a ``SummaryTable``, which
makes the segment's dense summary table as it is written.
"""
from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from comgra_ndbg.store import schema
from comgra_ndbg.store.catalog import Catalog
from comgra_ndbg.store.checksums import chunk_rows
from comgra_ndbg.store.index_pool import SharedPool
from comgra_ndbg.store.segment import SegmentContent, SnapshotData
from comgra_ndbg.store.summary_table import SummaryTable
from comgra_ndbg.store.value_blocks import ValueBlocks

__all__ = ["RowBuffers", "JoinedRows"]

_Snapshot = tuple[int, int, int, tuple[int, ...], int, np.ndarray, np.ndarray, "np.ndarray | None", "np.ndarray | None"]
"""A buffered snapshot without its values: step, iteration, series, shape, the number of values, and
``SnapshotData``'s sample_index, sample_stats, value_index and sample_category."""


class RowBuffers:
    """Rows of every table since the last flush."""

    def __init__(self, spare_blocks: list[np.ndarray] | None = None, directory: Path | None = None) -> None:
        """``spare_blocks``: blocks of written value pools for ``values`` to fill (``ValueBlocks.recycle``);
        ``directory``: where full blocks of values wait in a scratch file (None: in memory)."""
        self.steps: list[tuple[int, int, int, float, int, str]] = []
        self.summaries = SummaryTable()  # copied as they arrive; the segment's table is made as it is written
        self.snapshots: list[_Snapshot] = []
        self.values = ValueBlocks(spare_blocks, directory)  # every snapshot's values, in the order of ``snapshots``
        self.kpis: list[tuple[int, int, float, int]] = []
        self.notes: list[tuple[int, float, str]] = []
        self.triggers: list[tuple[int, str]] = []
        self.log: list[tuple[int, float, str, str, str, str]] = []
        self.profile: list[tuple[int, str, np.ndarray]] = []  # (step, module, row of PROFILE_FIELDS)
        self.process: list[tuple[int, np.ndarray]] = []  # (step, row of PROCESS_FIELDS)

    def add_snapshot(self, step: int, iteration: int, series: int, data: SnapshotData) -> None:
        """One snapshot: its element values go into ``values``, the rest is kept without them (the
        arrays of ``data`` may be shared with the recorder; none is written to)."""
        self.values.append(data.values)
        self.snapshots.append((step, iteration, series, data.shape, len(data.values), data.sample_index,
                               data.sample_stats, data.value_index, data.sample_category))

    def add_log(self, step: int, category: str, subject: str, message: str, detail: dict | None = None,
                when: float | None = None) -> None:
        """One row of the log table (``schema.LOG_*``)."""
        text = json.dumps(detail, sort_keys=True, default=str) if detail else ""
        self.log.append((int(step), time.time() if when is None else when, category, subject, message, text))

    def build(self, catalog: Catalog) -> SegmentContent:
        """The buffered rows as one segment's content (with ``catalog``)."""
        c = SegmentContent(catalog=catalog)
        if self.steps:
            cols = list(zip(*self.steps))
            c.step = np.array(cols[0], np.int64)
            c.step_type = np.array(cols[1], np.int32)
            c.step_iterations = np.array(cols[2], np.int32)
            c.step_time = np.array(cols[3], np.float64)
            c.step_flags = np.array(cols[4], np.uint8)
            c.step_reason = np.array(cols[5], object)
        if len(self.summaries):
            c.summary_step, c.summary_iteration = self.summaries.finish(len(catalog.series))
            c.summary_data = self.summaries
        if self.snapshots:
            self._build_snapshots(c)
        if self.kpis:
            cols = list(zip(*self.kpis))
            c.kpi_step, c.kpi_id = np.array(cols[0], np.int64), np.array(cols[1], np.int32)
            c.kpi_value, c.kpi_type = np.array(cols[2], np.float64), np.array(cols[3], np.int32)
        if self.triggers:
            c.trigger_step = np.array([t[0] for t in self.triggers], np.int64)
            c.trigger_reason = np.array([t[1] for t in self.triggers], object)
        if self.notes:
            cols = list(zip(*self.notes))
            c.note_step, c.note_time = np.array(cols[0], np.int64), np.array(cols[1], np.float64)
            c.note_text = np.array(cols[2], object)
        if self.log:
            cols = list(zip(*self.log))
            c.log_step, c.log_time = np.array(cols[0], np.int64), np.array(cols[1], np.float64)
            c.log_category, c.log_subject = np.array(cols[2], object), np.array(cols[3], object)
            c.log_message, c.log_detail = np.array(cols[4], object), np.array(cols[5], object)
        if self.profile:
            c.profile_step = np.array([r[0] for r in self.profile], np.int64)
            c.profile_module = np.array([r[1] for r in self.profile], object)
            c.profile_data = np.stack([r[2] for r in self.profile]).astype(np.float64, copy=False)
        if self.process:
            c.process_step = np.array([r[0] for r in self.process], np.int64)
            c.process_data = np.stack([r[1] for r in self.process]).astype(np.float64, copy=False)
        return c

    def _build_snapshots(self, c: SegmentContent) -> None:
        snapshots = self.snapshots
        n = len(snapshots)
        columns = list(zip(*snapshots))
        c.snap_step = np.array(columns[0], np.int64)
        c.snap_iteration = np.array(columns[1], np.int32)
        c.snap_series = np.array(columns[2], np.int32)
        shapes, sample_indices, categories = columns[3], columns[5], columns[8]
        width = max(schema.MAX_RANK, max(len(shape) for shape in shapes))
        c.snap_shape = np.array([_padded_shape(shape, width) for shape in shapes], np.int64).reshape(n, width)
        sample_counts = np.fromiter((len(index) for index in sample_indices), np.int64, n)
        value_counts = np.array(columns[4], np.int64)
        c.snap_samples_count = sample_counts.astype(np.int32)
        c.snap_values_count = value_counts
        c.snap_samples_offset = np.cumsum(sample_counts) - sample_counts
        c.snap_values_offset = np.cumsum(value_counts) - value_counts
        index_pool = SharedPool()
        c.snap_index_offset = np.fromiter((-1 if index is None else index_pool.add(index) for index in columns[7]),
                                          np.int64, n)
        c.snap_subsampled = c.snap_index_offset >= 0
        c.sample_index = np.concatenate(sample_indices).astype(np.int64, copy=False)
        c.sample_category = np.full(int(sample_counts.sum()), "", dtype=object)
        for i in [i for i, category in enumerate(categories) if category is not None]:
            c.sample_category[c.snap_samples_offset[i]:c.snap_samples_offset[i] + sample_counts[i]] = categories[i]
        c.sample_stats = JoinedRows(list(columns[6]), schema.NUM_FIELDS)
        c.values = self.values
        c.value_index = index_pool.array()


class JoinedRows:
    """Arrays of rows ``[n_i, columns]`` one after the other as one table, joined as it is written (``slabs``,
    whole chunks at a time) rather than concatenated at the flush: the per-sample statistics of a segment
    (1.25 MiB for the 300 steps of the MLP of ``benchmarks/recording_size.py``) are then in memory once, not
    twice, until the write.

    >>> rows = JoinedRows([np.ones((2, 3)), np.zeros((1, 3))], 3)
    >>> rows.shape, np.asarray(rows).tolist()
    ((3, 3), [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    """

    def __init__(self, pieces: list[np.ndarray], columns: int) -> None:
        self._pieces: list[np.ndarray | None] = [piece.reshape(-1, columns) for piece in pieces]
        self.shape = (sum(len(piece) for piece in self._pieces), columns)
        self.dtype = np.result_type(*(piece.dtype for piece in self._pieces)) if pieces else np.dtype(np.float64)
        self.ndim = 2

    @property
    def nbytes(self) -> int:
        return self.shape[0] * self.shape[1] * self.dtype.itemsize

    def slabs(self, *, consume: bool = False) -> Iterator[np.ndarray]:
        """The rows a chunk of the stored table (``chunk_rows``) at a time, each slab valid until the next is
        asked for (they share one buffer). With ``consume`` each piece is let go of once copied."""
        if not self.shape[0]:
            return
        buffer = np.empty(chunk_rows(self.shape), self.dtype)
        used = 0
        for index in range(len(self._pieces)):
            piece = self._pieces[index]
            if consume:
                self._pieces[index] = None
            start = 0
            while start < len(piece):
                take = min(len(buffer) - used, len(piece) - start)
                buffer[used:used + take] = piece[start:start + take]
                used, start = used + take, start + take
                if used == len(buffer):
                    yield buffer
                    used = 0
        if used:
            yield buffer[:used]

    def __array__(self, dtype: np.dtype | None = None, copy: bool | None = None) -> np.ndarray:
        """The table as one array (a copy)."""
        slabs = [slab.copy() for slab in self.slabs()]
        out = np.concatenate(slabs) if slabs else np.zeros(self.shape, self.dtype)
        return out if dtype is None else out.astype(dtype, copy=False)


def _padded_shape(shape: tuple[int, ...], width: int) -> tuple[int, ...]:
    """A snapshot's shape as a row of the shape table, ``-1`` padded to ``width`` columns."""
    return tuple(shape) + (-1,) * (width - len(shape))

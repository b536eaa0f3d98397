"""One step's recorded data on the host, before it goes to the writer (or to the flight recorder's ring)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from comgra_ndbg.store import schema
from comgra_ndbg.store.segment import SnapshotData
from comgra_ndbg.store.writer import RecordingWriter

__all__ = ["StepRecord", "SummaryRows", "rows_at", "shared", "single_iteration", "zeros"]


class SummaryRows(NamedTuple):
    """Summary rows of one step as arrays: row ``i`` is the summary of series ``series[i]`` in iteration
    ``iterations[i]``."""

    series: np.ndarray  # int64 [k]
    iterations: np.ndarray  # int64 [k]
    data: np.ndarray  # float64 [k, NUM_FIELDS]

    def __len__(self) -> int:  # type: ignore[override] - the number of rows, not of fields
        return len(self.series)

    @staticmethod
    def empty() -> SummaryRows:
        return SummaryRows(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((0, schema.NUM_FIELDS)))

    @staticmethod
    def join(blocks: Sequence[SummaryRows]) -> SummaryRows:
        """The rows of ``blocks`` one after the other (a step's own rows are laid out by ``step_rows``)."""
        if len(blocks) == 1:
            return blocks[0]
        if not blocks:
            return SummaryRows.empty()
        return SummaryRows(*(np.concatenate(parts) for parts in zip(*blocks)))


def single_iteration(iterations: np.ndarray) -> bool:
    """Whether every row belongs to iteration 0 (the shared zeros of a step's layout are known at once).

    >>> single_iteration(zeros(3)), single_iteration(np.array([0, 1]))
    (True, False)
    """
    return iterations is _SHARED.get((len(iterations), int, 0)) or not np.count_nonzero(iterations)


def rows_at(indices: range | list[int] | np.ndarray) -> slice | range | list[int] | np.ndarray:
    """``indices`` of rows as an index into a block of rows: a slice (a view, no gather) for consecutive
    rows given as a range, else ``indices`` as they are.

    >>> rows_at(range(2, 5)), rows_at([4, 1])
    (slice(2, 5, None), [4, 1])
    """
    if type(indices) is range and indices.step == 1:
        return slice(indices.start, indices.stop)
    return indices


def zeros(count: int) -> np.ndarray:
    """``count`` int64 zeros, read-only and shared: the iterations of rows that all belong to iteration 0."""
    found = _SHARED.get((count, int, 0))  # ``shared(count, 0)``'s lookup, inline: several times every step
    return shared(count, 0) if found is None else found


def shared(count: int, value: int | bool) -> np.ndarray:
    """``count`` copies of ``value`` (an int64 or a bool array), read-only and kept for the next caller: the
    per-step constants of a step's rows and masks.

    >>> shared(3, True).tolist(), shared(2, 0) is shared(2, 0), shared(2, 0).flags.writeable
    ([True, True, True], True, False)
    """
    key = (count, type(value), value)
    found = _SHARED.get(key)
    if found is None:
        found = _SHARED[key] = np.full(count, value, dtype=bool if type(value) is bool else np.int64)
        found.flags.writeable = False
    return found


_SHARED: dict[tuple[int, type, int], np.ndarray] = {}


@dataclass
class StepRecord:
    """Summary rows and snapshots of one step, keyed by series id and iteration."""

    step: int
    step_type: int  # id in the catalog's step types
    iterations: int
    reason: str
    time: float
    rows: SummaryRows = field(default_factory=SummaryRows.empty)
    snapshots: list[tuple[int, int, SnapshotData]] = field(default_factory=list)  # (series, iteration, data)

    @property
    def nbytes(self) -> int:
        """Host memory held by the record's arrays (what the flight recorder's byte bound counts)."""
        total = self.rows.data.nbytes + self.rows.series.nbytes + self.rows.iterations.nbytes
        for _, _, data in self.snapshots:
            total += data.values.nbytes + data.sample_stats.nbytes + data.sample_index.nbytes
            total += 0 if data.value_index is None else data.value_index.nbytes
        return total

    def write(self, writer: RecordingWriter, *, summaries: bool, snapshots: bool, reason: str | None = None,
              step_entry: bool = True) -> None:
        """Hand the parts asked for to the writer; ``step_entry`` adds the row of the steps table."""
        if step_entry:
            flags = (schema.FLAG_SUMMARY if summaries and len(self.rows) else 0) | (
                schema.FLAG_SNAPSHOT if snapshots and self.snapshots else 0)
            writer.add_step(self.step, self.step_type, self.iterations, flags, reason or self.reason, when=self.time)
        rows = self.rows
        if summaries and len(rows):
            if single_iteration(rows.iterations):  # the common case
                writer.add_summaries(self.step, 0, rows.series, rows.data)
            else:
                for iteration in np.unique(rows.iterations).tolist():
                    mask = rows.iterations == iteration
                    writer.add_summaries(self.step, iteration, rows.series[mask], rows.data[mask])
        if snapshots:
            for sid, iteration, data in self.snapshots:
                writer.add_snapshot(self.step, iteration, sid, data)

    def nonfinite_series(self) -> list[int]:
        """Series ids whose rows count NaN or Inf elements."""
        nan, inf = schema.FIELD["nan"], schema.FIELD["inf"]
        data = self.rows.data
        return sorted(set(self.rows.series[data[:, nan] + data[:, inf] > 0].tolist()))

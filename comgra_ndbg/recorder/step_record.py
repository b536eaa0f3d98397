"""One step's recorded data on the host, before it goes to the writer (or to the flight recorder's ring)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from comgra_ndbg.store import schema
from comgra_ndbg.store.segment import SnapshotData
from comgra_ndbg.store.writer import RecordingWriter

__all__ = ["StepRecord"]


@dataclass
class StepRecord:
    """Summary rows and snapshots of one step, keyed by series id and iteration."""

    step: int
    step_type: int  # id in the catalog's step types
    iterations: int
    reason: str
    time: float
    rows: list[tuple[int, int, np.ndarray]] = field(default_factory=list)  # (series, iteration, row)
    snapshots: list[tuple[int, int, SnapshotData]] = field(default_factory=list)  # (series, iteration, data)

    @property
    def nbytes(self) -> int:
        """Host memory held by the record's arrays (what the flight recorder's byte bound counts)."""
        total = sum(row.nbytes for _, _, row in self.rows)
        for _, _, data in self.snapshots:
            total += data.values.nbytes + data.sample_stats.nbytes + data.sample_index.nbytes
            total += 0 if data.value_index is None else data.value_index.nbytes
        return total

    def write(self, writer: RecordingWriter, *, summaries: bool, snapshots: bool, reason: str | None = None,
              step_entry: bool = True) -> None:
        """Hand the parts asked for to the writer; ``step_entry`` adds the row of the steps table."""
        if step_entry:
            flags = (schema.FLAG_SUMMARY if summaries and self.rows else 0) | (
                schema.FLAG_SNAPSHOT if snapshots and self.snapshots else 0)
            writer.add_step(self.step, self.step_type, self.iterations, flags, reason or self.reason, when=self.time)
        if summaries and self.rows:
            by_iteration: dict[int, list[tuple[int, np.ndarray]]] = {}
            for sid, iteration, row in self.rows:
                by_iteration.setdefault(iteration, []).append((sid, row))
            for iteration, items in sorted(by_iteration.items()):
                writer.add_summaries(self.step, iteration, np.array([s for s, _ in items], np.int64),
                                     np.stack([r for _, r in items]))
        if snapshots:
            for sid, iteration, data in self.snapshots:
                writer.add_snapshot(self.step, iteration, sid, data)

    def nonfinite_series(self) -> list[int]:
        """Series ids whose rows count NaN or Inf elements."""
        nan, inf = schema.FIELD["nan"], schema.FIELD["inf"]
        return sorted({sid for sid, _, row in self.rows if row[nan] + row[inf] > 0})

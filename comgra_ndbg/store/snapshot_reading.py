"""Reading snapshots: which steps have one, and the stored arrays of one (a mixin of ``Recording``).

A snapshot's arrays are slices of its file's pools; a slice that fails its checksum raises
``CorruptRecordingError`` naming the step and tensor (and, with ``damaged="skip"``, is listed in
``Recording.damage``), while every other snapshot stays readable.
"""
from __future__ import annotations

import numpy as np

from comgra_ndbg.errors import UnknownSeriesError
from comgra_ndbg.store import schema
from comgra_ndbg.store.catalog import TensorInfo
from comgra_ndbg.store.damage import Damage, DamagedData, corrupt_error
from comgra_ndbg.store.fileview import FileView
from comgra_ndbg.store.records import Snapshot

__all__ = ["SnapshotReading"]


class SnapshotReading:
    """Snapshot access of ``Recording`` (works on its views, catalog and damage list); not used on its own."""

    def snapshot_steps(self, node: str, kind: str = schema.KIND_VALUE, *, tensor: str | None = None) -> np.ndarray:
        _, sid = self._series(node, kind, tensor)
        found = [steps[series == sid] for steps, series, _ in self._snapshot_index()]
        return np.unique(np.concatenate(found)) if found else np.zeros(0, np.int64)

    def _snapshot_index(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """(step, series, iteration) of every file's snapshots; a file whose index fails is left out (and
        reported, or raised without ``damaged="skip"``)."""
        out = []
        for view in self._views.values():
            try:
                out.append((view.array(schema.SNAP_STEP), view.array(schema.SNAP_SERIES),
                            view.array(schema.SNAP_ITERATION)))
            except DamagedData as error:
                self._damaged(error, "its snapshot index was unreadable; its snapshots are left out")
                out.append((np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)))
        return out

    def snapshot(self, step: int, node: str, kind: str = schema.KIND_VALUE, *, tensor: str | None = None,
                 iteration: int | None = None) -> Snapshot:
        """The stored arrays of one tensor at one step and iteration; ``iteration=None`` takes the first
        iteration of the step that has one (a tensor registered only in a later iteration is found too)."""
        from comgra_ndbg.store.reader import require

        require(step, (int, np.integer), "step", "an int")
        if iteration is not None:
            require(iteration, (int, np.integer), "iteration", "an int")
        info, sid = self._series(node, kind, tensor)
        found: tuple[int, FileView, int] | None = None
        for view, (steps, series, iterations) in zip(self._views.values(), self._snapshot_index()):
            match = (steps == step) & (series == sid)
            if iteration is not None:
                match &= iterations == iteration
            for i in np.flatnonzero(match).tolist():
                if found is None or iterations[i] < found[0]:
                    found = (int(iterations[i]), view, i)
        if found is not None:
            return self._read_snapshot(found[1], found[2], info, kind)
        available = self.snapshot_steps(node, kind, tensor=tensor)
        where = f"step {step}" if iteration is None else f"step {step}, iteration {iteration}"
        raise UnknownSeriesError(f"no snapshot of {info.name!r} ({kind}) at {where}; snapshots exist at steps "
                                 f"{available[:20].tolist()}{' …' if len(available) > 20 else ''}")

    def _read_snapshot(self, view: FileView, i: int, info: TensorInfo, kind: str) -> Snapshot:
        step = int(view.array(schema.SNAP_STEP)[i])
        try:
            return self._snapshot_at(view, i, info, kind)
        except DamagedData as error:
            record = Damage("checksum", error.file, f"snapshot ({kind})", error.reason, (step,), (info.name,))
            if self.skip_damage and record not in self.damage:
                self.damage.append(record)
            raise corrupt_error(self.location, [record]) from None

    def _snapshot_at(self, view: FileView, i: int, info: TensorInfo, kind: str) -> Snapshot:
        read = view.read_slice
        shape = tuple(int(d) for d in view.array(schema.SNAP_SHAPE)[i] if d >= 0)
        s0, sn = int(view.array(schema.SNAP_SAMPLES_OFFSET)[i]), int(view.array(schema.SNAP_SAMPLES_COUNT)[i])
        v0, vn = int(view.array(schema.SNAP_VALUES_OFFSET)[i]), int(view.array(schema.SNAP_VALUES_COUNT)[i])
        x0 = int(view.array(schema.SNAP_INDEX_OFFSET)[i])
        return Snapshot(
            step=int(view.array(schema.SNAP_STEP)[i]),
            iteration=int(view.array(schema.SNAP_ITERATION)[i]),
            tensor=info.name,
            kind=kind,
            shape=shape,
            values=read(schema.VALUE_POOL, v0, v0 + vn),
            value_index=read(schema.VALUE_INDEX_POOL, x0, x0 + vn) if x0 >= 0 else None,
            sample_index=read(schema.SAMPLE_INDEX, s0, s0 + sn),
            sample_rows=read(schema.SAMPLE_STATS, s0, s0 + sn),
            # the whole (small) table, so that its checksum is verified; cached with the file's index
            sample_categories=tuple(view.array(schema.SAMPLE_CATEGORY)[s0:s0 + sn].tolist())
            if schema.SAMPLE_CATEGORY in view.file else (),
        )

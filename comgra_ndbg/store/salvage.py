"""Reading one recording file chunk by chunk: everything intact, and exactly what is not.

``read_file`` reads every table of a file one checksummed chunk at a time (``checksums``), so a damaged
chunk costs its own rows and nothing else, and says which steps and tensors those rows belonged to:

- a damaged row of the steps, KPI, note, trigger or log tables drops that row;
- damaged rows of ``summary/step`` or ``summary/iteration`` drop those summary rows; a damaged chunk of
  ``summary/data`` (one series, up to 4096 rows) drops that tensor's summaries at those steps only;
- a snapshot whose index row or whose slice of a pool is damaged is dropped;
- text failing its CRC-32 drops the rows of that table in this file (the damaged string cannot be found),
  except step reasons, which are replaced by ``""`` so the steps stay.

``comgra-ndbg check`` reports the damage; ``--salvage`` writes the intact rows into a new recording.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import h5py
import numpy as np

from comgra_ndbg.store import schema
from comgra_ndbg.store.catalog import Catalog
from comgra_ndbg.store.checksums import decode_text, text_intact
from comgra_ndbg.store.damage import READ_ERRORS, Damage, DamagedData
from comgra_ndbg.store.segment import SnapshotData

__all__ = ["FileContent", "read_file"]

_STEP_COLUMNS = (schema.STEPS_STEP, schema.STEPS_TYPE, schema.STEPS_ITERATIONS, schema.STEPS_TIME,
                 schema.STEPS_FLAGS)
_SNAP_COLUMNS = (schema.SNAP_STEP, schema.SNAP_ITERATION, schema.SNAP_SERIES, schema.SNAP_SHAPE,
                 schema.SNAP_SAMPLES_OFFSET, schema.SNAP_SAMPLES_COUNT, schema.SNAP_VALUES_OFFSET,
                 schema.SNAP_VALUES_COUNT, schema.SNAP_INDEX_OFFSET)
_TABLES = {  # table -> its columns (numeric first, then text)
    "kpi": (schema.KPI_STEP, schema.KPI_ID, schema.KPI_VALUE, schema.KPI_STEP_TYPE),
    "notes": (schema.NOTE_STEP, schema.NOTE_TIME, schema.NOTE_TEXT),
    "triggers": (schema.TRIGGER_STEP, schema.TRIGGER_REASON),
    "log": (schema.LOG_STEP, schema.LOG_TIME, schema.LOG_CATEGORY, schema.LOG_SUBJECT, schema.LOG_MESSAGE,
            schema.LOG_DETAIL),
}
_TEXT = {schema.STEPS_REASON, schema.NOTE_TEXT, schema.TRIGGER_REASON, schema.SAMPLE_CATEGORY, schema.LOG_CATEGORY,
         schema.LOG_SUBJECT, schema.LOG_MESSAGE, schema.LOG_DETAIL}


@dataclass
class FileContent:
    """The intact rows of one file, and the damage found in it."""

    path: Path
    catalog: Catalog | None = None
    steps: list[tuple] = field(default_factory=list)  # (step, type, iterations, time, flags, reason)
    summaries: list[tuple[int, int, np.ndarray, np.ndarray]] = field(default_factory=list)  # step, it, series, rows
    snapshots: list[tuple[int, int, int, SnapshotData]] = field(default_factory=list)
    tables: dict[str, list[tuple]] = field(default_factory=dict)  # kpi, notes, triggers, log rows
    damage: list[Damage] = field(default_factory=list)
    num_series: int = 0


def read_file(path: Path) -> FileContent:
    """Everything intact in the recording file ``path`` (see the module docstring); damage in ``.damage``.
    A file that cannot be opened at all yields one ``unreadable`` record and no rows."""
    out = FileContent(path)
    try:
        f = h5py.File(path, "r")
    except READ_ERRORS as error:
        out.damage.append(Damage("unreadable", path, "the file cannot be opened", _why(error)))
        return out
    with f:
        try:
            out.catalog = Catalog.read(f)
        except DamagedData as error:
            out.damage.append(Damage("checksum", path, "its catalog (tensor, step type and KPI names)", error.reason))
        except READ_ERRORS as error:
            out.damage.append(Damage("unreadable", path, "its catalog (tensor, step type and KPI names)", _why(error)))
        reader = _Reader(f, path, out)
        parts = [("its steps table", reader.steps), ("its summaries", reader.summaries),
                 ("its snapshots", reader.snapshots)]
        parts += [(f"its {name} table", partial(reader.table, name, columns)) for name, columns in _TABLES.items()]
        for what, read in parts:
            try:
                read()
            except (*READ_ERRORS, IndexError) as error:  # a header or layout garbled beyond the chunk checks
                out.damage.append(Damage("unreadable", path, what, _why(error)))
    return out


class _Reader:
    def __init__(self, f: h5py.File, path: Path, out: FileContent) -> None:
        self.f, self.path, self.out = f, path, out
        self.file_steps: np.ndarray = np.zeros(0, np.int64)

    def rows(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """A table read chunk by chunk along its rows: (data, mask of damaged rows); text is decoded and, if it
        fails its checksum, every row is marked damaged."""
        if name not in self.f:
            return np.zeros(0, dtype=object if name in _TEXT else np.int64), np.zeros(0, bool)
        try:
            dataset = self.f[name]
            shape, chunk = dataset.shape, (dataset.chunks[0] if dataset.chunks else max(dataset.shape[0], 1))
        except READ_ERRORS:
            return np.zeros(0), np.zeros(0, bool)
        bad = np.zeros(shape[0], bool)
        data = None
        for start in range(0, shape[0], chunk):
            try:
                part = dataset[start:start + chunk]
            except READ_ERRORS:
                bad[start:start + chunk] = True
                continue
            if data is None:
                data = np.zeros(shape, dtype=object if name in _TEXT else part.dtype)
            data[start:start + chunk] = part
        if data is None:
            data = np.zeros(shape, dtype=object if name in _TEXT else np.float64)
        if name in _TEXT:
            data = decode_text(data) if shape[0] else np.zeros(0, object)
            if not bad.any() and not text_intact(dataset, data):
                bad[:] = True
        return data, bad

    def _damage(self, kind: str, what: str, rows_steps: np.ndarray, reason: str, tensors: tuple[str, ...] = ()) -> None:
        self.out.damage.append(Damage(kind, self.path, what, reason, tuple(np.unique(rows_steps).tolist()), tensors))

    def steps(self) -> None:
        columns = [self.rows(name) for name in _STEP_COLUMNS]
        reasons, reasons_bad = self.rows(schema.STEPS_REASON)
        bad = np.zeros(len(columns[0][0]), bool)
        for data, mask in columns:
            if len(mask) == len(bad):
                bad |= mask
        step = columns[0][0]
        self.file_steps = step[~bad].astype(np.int64) if len(step) else step
        if bad.any():
            self._damage("checksum", "rows of its steps table", step[bad & ~columns[0][1]], "data fails its checksum")
        if reasons_bad.any():
            self._damage("checksum", "the reasons of its steps (kept as '')", self.file_steps,
                         "text fails its checksum")
        for i in np.flatnonzero(~bad).tolist():
            reason = "" if reasons_bad.any() or i >= len(reasons) else str(reasons[i])
            self.out.steps.append((int(step[i]), int(columns[1][0][i]), int(columns[2][0][i]), float(columns[3][0][i]),
                                   int(columns[4][0][i]), reason))

    def summaries(self) -> None:
        (step, step_bad), (iteration, it_bad) = self.rows(schema.SUMMARY_STEP), self.rows(schema.SUMMARY_ITERATION)
        n = len(step)
        if not n or schema.SUMMARY_DATA not in self.f:
            return
        bad_rows = step_bad | it_bad
        if bad_rows.any():
            self._damage("checksum", "rows of its summary index (every tensor's summaries there)",
                         step[bad_rows & ~step_bad], "data fails its checksum")
        dataset = self.f[schema.SUMMARY_DATA]
        num_series = dataset.shape[0]
        self.out.num_series = num_series
        data = np.zeros((num_series, schema.NUM_FIELDS, n))
        data[:, schema.FIELD["min"]], data[:, schema.FIELD["max"]] = np.inf, -np.inf
        chunk = dataset.chunks[2] if dataset.chunks else n
        lost: dict[int, list[int]] = {}
        for series in range(num_series):
            for start in range(0, n, chunk):
                try:
                    data[series, :, start:start + chunk] = schema.pad_fields(dataset[series, :, start:start + chunk],
                                                                             axis=0)
                except READ_ERRORS:
                    lost.setdefault(series, []).extend(range(start, min(start + chunk, n)))
        for series, rows in lost.items():
            self._damage("checksum", "summaries", step[rows], "data fails its checksum",
                         (self._series_label(series),))
        for row in np.flatnonzero(~bad_rows).tolist():
            present = np.flatnonzero(data[:, schema.FIELD["count"], row] > 0)
            if len(present):
                self.out.summaries.append((int(step[row]), int(iteration[row]), present,
                                           data[present, :, row].copy()))

    def _series_label(self, series: int) -> str:
        catalog = self.out.catalog
        if catalog is None or series >= len(catalog.series):
            return f"series {series}"
        tid, kind = catalog.series[series]
        return f"{catalog.tensors[tid].name} ({kind})"

    def snapshots(self) -> None:
        index = {name: self.rows(name) for name in _SNAP_COLUMNS}
        count = len(index[schema.SNAP_STEP][0])
        if not count:
            return
        bad = np.zeros(count, bool)
        for data, mask in index.values():
            if len(mask) == count:
                bad |= mask
        pools = {name: self.rows(name) for name in (schema.VALUE_POOL, schema.VALUE_INDEX_POOL, schema.SAMPLE_INDEX,
                                                    schema.SAMPLE_STATS, schema.SAMPLE_CATEGORY)}
        step, series = index[schema.SNAP_STEP][0], index[schema.SNAP_SERIES][0]
        for i in range(count):
            if bad[i]:
                continue
            snapshot = self._snapshot(i, index, pools)
            if snapshot is None:
                bad[i] = True
                continue
            self.out.snapshots.append((int(step[i]), int(index[schema.SNAP_ITERATION][0][i]), int(series[i]), snapshot))
        if bad.any():
            rows = np.flatnonzero(bad).tolist()
            labels = dict.fromkeys(self._series_label(int(series[i])) if not index[schema.SNAP_SERIES][1][i]
                                   else "unknown tensors" for i in rows)
            self._damage("checksum", f"{len(rows)} snapshot{'s' * (len(rows) != 1)}", step[rows],
                         "data fails its checksum", tuple(labels))

    def _snapshot(self, i: int, index: dict, pools: dict) -> SnapshotData | None:
        def column(name: str) -> int:
            return int(index[name][0][i])

        v0, vn = column(schema.SNAP_VALUES_OFFSET), column(schema.SNAP_VALUES_COUNT)
        s0, sn = column(schema.SNAP_SAMPLES_OFFSET), column(schema.SNAP_SAMPLES_COUNT)
        x0 = column(schema.SNAP_INDEX_OFFSET)
        spans = [(schema.VALUE_POOL, v0, vn), (schema.SAMPLE_INDEX, s0, sn), (schema.SAMPLE_STATS, s0, sn)]
        if x0 >= 0:
            spans.append((schema.VALUE_INDEX_POOL, x0, vn))
        for name, start, length in spans:
            data, mask = pools[name]
            if start < 0 or start + length > len(data) or mask[start:start + length].any():
                return None
        categories, categories_bad = pools[schema.SAMPLE_CATEGORY]
        labels = None
        if len(categories) >= s0 + sn and not categories_bad[s0:s0 + sn].any() and sn:
            labels = np.array(categories[s0:s0 + sn], dtype=object)
        shape = tuple(int(d) for d in index[schema.SNAP_SHAPE][0][i] if d >= 0)
        return SnapshotData(shape, pools[schema.SAMPLE_INDEX][0][s0:s0 + sn].astype(np.int64),
                            schema.pad_fields(pools[schema.SAMPLE_STATS][0][s0:s0 + sn].astype(np.float64)),
                            pools[schema.VALUE_POOL][0][v0:v0 + vn],
                            pools[schema.VALUE_INDEX_POOL][0][x0:x0 + vn].astype(np.int64) if x0 >= 0 else None,
                            labels)

    def table(self, name: str, columns: tuple[str, ...]) -> None:
        read = [self.rows(column) for column in columns]
        count = len(read[0][0])
        bad = np.zeros(count, bool)
        for data, mask in read:
            if len(mask) == count:
                bad |= mask
            elif count:  # a column shorter than the table: its writer did not know it
                bad[:] = True
        if bad.any():
            steps = read[0][0][bad & ~read[0][1]] if count else np.zeros(0)
            self._damage("checksum", f"rows of its {name} table", steps, "data or text fails its checksum")
        self.out.tables[name] = [tuple(data[i] for data, _ in read) for i in np.flatnonzero(~bad).tolist()]


def _why(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error).strip() or type(error).__name__}"

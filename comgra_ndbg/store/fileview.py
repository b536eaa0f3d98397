"""One open recording file, read defensively: every read either returns intact data or raises ``DamagedData``.

HDF5 reports a chunk that fails its Fletcher-32 checksum, a truncated file or a garbled header as an
``OSError`` (sometimes ``KeyError`` or ``ValueError``) from deep inside h5py; text that fails its CRC-32
reads back without complaint. Here both become :class:`~comgra_ndbg.store.damage.DamagedData`, naming
the file, the dataset and, for chunked reads, the rows that failed, so the reader can say which steps and
tensors are affected.
"""
from __future__ import annotations

from functools import cached_property
from pathlib import Path

import h5py
import numpy as np

from comgra_ndbg.errors import RecordingFormatError
from comgra_ndbg.store import schema
from comgra_ndbg.store.catalog import Catalog
from comgra_ndbg.store.checksums import decode_text, text_intact
from comgra_ndbg.store.damage import READ_ERRORS, DamagedData
from comgra_ndbg.store.live import file_identity

__all__ = ["FileView", "open_h5", "TEXT_TABLES", "INDEX_TABLES", "SNAPSHOT_INDEX_TABLES"]

TEXT_TABLES = frozenset({schema.STEPS_REASON, schema.NOTE_TEXT, schema.TRIGGER_REASON, schema.SAMPLE_CATEGORY,
                         schema.LOG_CATEGORY, schema.LOG_SUBJECT, schema.LOG_MESSAGE, schema.LOG_DETAIL,
                         schema.PROFILE_MODULE})
INDEX_TABLES = (schema.STEPS_STEP, schema.STEPS_TYPE, schema.STEPS_FLAGS, schema.STEPS_ITERATIONS,
                schema.SUMMARY_STEP, schema.SUMMARY_ITERATION, schema.SNAP_STEP, schema.SNAP_ITERATION,
                schema.SNAP_SERIES, schema.SNAP_SHAPE, schema.SNAP_SAMPLES_OFFSET, schema.SNAP_SAMPLES_COUNT,
                schema.SNAP_VALUES_OFFSET, schema.SNAP_VALUES_COUNT, schema.SNAP_INDEX_OFFSET,
                schema.KPI_STEP, schema.KPI_ID, schema.KPI_VALUE, schema.KPI_STEP_TYPE)
"""Small tables a reader keeps in memory; a file whose index cannot be read cannot be read at all (a reader
that skips damage reads one whose snapshot tables fail without its snapshots: ``drop_snapshots``)."""
SNAPSHOT_INDEX_TABLES = tuple(name for name in INDEX_TABLES if name.startswith("snapshot/"))


def open_h5(path: Path) -> h5py.File:
    """Open a recording file for reading, refusing what is not one (or one of a newer format)."""
    try:
        f = h5py.File(path, "r")
    except OSError as error:
        raise RecordingFormatError(f"{path} is not a readable HDF5 recording: {error}") from None
    try:
        name = f.attrs.get(schema.ATTR_FORMAT)
        version = int(f.attrs.get(schema.ATTR_FORMAT_VERSION, -1))
    except READ_ERRORS as error:
        f.close()
        raise RecordingFormatError(f"{path} is not a readable HDF5 recording: its attributes cannot be read "
                                   f"({error})") from None
    if name != schema.FORMAT_NAME:
        f.close()
        raise RecordingFormatError(f"{path} is an HDF5 file but not a comgra_ndbg recording")
    if version > schema.FORMAT_VERSION:
        f.close()
        raise RecordingFormatError(f"{path} has format version {version}, newer than this library's "
                                   f"{schema.FORMAT_VERSION}; upgrade comgra_ndbg to read it")
    return f


class FileView:
    """One open segment file with its small index arrays cached."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file = open_h5(path)
        try:
            self.sequence = int(self.file.attrs[schema.ATTR_SEQUENCE])
            self.complete = bool(self.file.attrs.get(schema.ATTR_COMPLETE, False))
            self.parts = tuple(int(v) for v in self.file.attrs.get(schema.ATTR_PARTS, ()))
            self.identity = file_identity(self.file.attrs)
        except READ_ERRORS as error:
            self.file.close()
            raise DamagedData(path, "/", f"its attributes cannot be read ({error})") from None
        self._cache: dict[str, np.ndarray] = {}

    def array(self, name: str) -> np.ndarray:
        """A whole small table (empty when this file's writer did not know it); text decoded and checked."""
        cached = self._cache.get(name)
        if cached is None:
            cached = self._cache[name] = self._read_table(name)
        return cached

    def _read_table(self, name: str) -> np.ndarray:
        try:
            if name not in self.file:
                return np.zeros(0, dtype=object if name in TEXT_TABLES else np.int64)
            dataset = self.file[name]
            data = dataset[()]
        except READ_ERRORS as error:
            raise DamagedData(self.path, name, _why(error)) from None
        if name in TEXT_TABLES:
            data = decode_text(data)
            if not text_intact(dataset, data):
                raise DamagedData(self.path, name, "its text fails its checksum")
        return data

    def preload(self) -> None:
        """Read every index table now (raises ``DamagedData`` for the first that fails)."""
        for name in INDEX_TABLES:
            self.array(name)

    def drop_snapshots(self) -> None:
        """Read this file as if it held no snapshot: for a reader that skips damage, when an index table of
        the snapshots fails (the summaries, KPIs and steps do not depend on it)."""
        for name in SNAPSHOT_INDEX_TABLES:
            try:
                dataset = self.file[name] if name in self.file else None
                shape, dtype = (dataset.shape[1:], dataset.dtype) if dataset is not None else ((), np.int64)
            except READ_ERRORS:
                shape, dtype = (), np.int64
            self._cache[name] = np.zeros((0, *shape), dtype=dtype)

    def catalog(self) -> Catalog:
        try:
            return Catalog.read(self.file)
        except DamagedData:
            raise
        except READ_ERRORS as error:
            raise DamagedData(self.path, "the catalog", _why(error)) from None

    @cached_property
    def num_series(self) -> int:
        return int(self.file[schema.SUMMARY_DATA].shape[0])

    def summary_block(self, series: int, *, skip: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """``[rows, NUM_FIELDS]`` of one series (the merge identity where this file predates it, and in the fields
        an older format version lacks), and the rows that failed their checksum. Without ``skip`` a failed read
        raises ``DamagedData`` (with those rows); with it, they hold the merge identity."""
        rows = len(self.array(schema.SUMMARY_STEP))
        try:
            if series >= self.num_series or rows == 0:
                return _identity(rows), np.zeros(0, np.int64)
            dataset = self.file[schema.SUMMARY_DATA]
        except READ_ERRORS as error:
            raise DamagedData(self.path, schema.SUMMARY_DATA, _why(error), rows=np.arange(rows)) from None
        try:
            return schema.pad_fields(dataset[series], axis=0).T, np.zeros(0, np.int64)
        except READ_ERRORS as error:
            reason = _why(error)
        block, bad = _identity(rows), []
        step = dataset.chunks[2] if dataset.chunks else rows
        for start in range(0, rows, step):
            try:
                block[start:start + step] = schema.pad_fields(dataset[series, :, start:start + step], axis=0).T
            except READ_ERRORS:
                bad.extend(range(start, min(start + step, rows)))
        bad_rows = np.array(bad, np.int64)
        if not skip:
            raise DamagedData(self.path, schema.SUMMARY_DATA, reason, rows=bad_rows)
        return block, bad_rows

    def read_slice(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of a pool; raises ``DamagedData`` when they fail their checksum."""
        try:
            data = self.file[name][start:stop]
        except READ_ERRORS as error:
            raise DamagedData(self.path, name, _why(error)) from None
        return decode_text(data) if name in TEXT_TABLES else data

    def close(self) -> None:
        self.file.close()


def _identity(rows: int) -> np.ndarray:
    block = np.zeros((rows, schema.NUM_FIELDS))
    block[:, schema.FIELD["min"]], block[:, schema.FIELD["max"]] = np.inf, -np.inf
    return block


def _why(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    if "filter returned failure" in text or "checksum" in text.lower():
        return "data fails its checksum"
    return f"{type(error).__name__}: {text}"

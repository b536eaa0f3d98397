"""Segment files: the unit the writer produces and the merge consumes.

A segment holds the rows of a contiguous range of recorded steps plus the catalog as of its writing. It is
written under a temporary name, flushed to disk and atomically renamed; a file with a final name is
therefore complete and immutable, which is what makes a recording crash-safe and readable while written.
"""
from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path

import h5py
import numpy as np

from comgra_ndbg.store import schema
from comgra_ndbg.store.catalog import Catalog
from comgra_ndbg.store.index_pool import merge_index_pools

__all__ = ["SnapshotData", "SegmentContent", "write_segment", "read_segment", "concat", "segment_name", "parse_segment_name"]

_STR = h5py.string_dtype("utf-8")
_SEGMENT_RE = re.compile(r"^seg-(\d{8,})-L(\d+)\.h5$")  # segment_name pads to 8 digits, never cuts


@dataclass(frozen=True)
class SnapshotData:
    """The host arrays of one snapshot of one tensor."""

    shape: tuple[int, ...]
    sample_index: np.ndarray  # int64 [n]: batch positions of the samples with statistics
    sample_stats: np.ndarray  # float64 [n, NUM_FIELDS]: per-sample sufficient statistics
    values: np.ndarray  # float32 [m]: element values
    value_index: np.ndarray | None  # int64 [m]: flat indices into the tensor; None when all are kept
    sample_category: np.ndarray | None = None  # str [n]: category of each sample, when categories were given


@dataclass
class SegmentContent:
    """Every row-wise array of a segment, plus its catalog. Arrays are parallel per table."""

    catalog: Catalog
    step: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    step_type: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    step_iterations: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    step_time: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))
    step_flags: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint8))
    step_reason: np.ndarray = field(default_factory=lambda: np.zeros(0, object))
    summary_step: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    summary_iteration: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    summary_data: np.ndarray = field(default_factory=lambda: np.zeros((0, schema.NUM_FIELDS, 0), np.float64))
    snap_step: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    snap_iteration: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    snap_series: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    snap_shape: np.ndarray = field(default_factory=lambda: np.zeros((0, schema.MAX_RANK), np.int64))
    snap_samples_offset: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    snap_samples_count: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    snap_values_offset: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    snap_values_count: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    snap_subsampled: np.ndarray = field(default_factory=lambda: np.zeros(0, np.bool_))
    snap_index_offset: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    sample_index: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    sample_stats: np.ndarray = field(default_factory=lambda: np.zeros((0, schema.NUM_FIELDS), np.float64))
    sample_category: np.ndarray = field(default_factory=lambda: np.zeros(0, object))
    values: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    value_index: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    kpi_step: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    kpi_id: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    kpi_value: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))
    kpi_type: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    note_step: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    note_time: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))
    note_text: np.ndarray = field(default_factory=lambda: np.zeros(0, object))
    trigger_step: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    trigger_reason: np.ndarray = field(default_factory=lambda: np.zeros(0, object))

    def is_empty(self) -> bool:
        return not (len(self.step) or len(self.kpi_step) or len(self.note_step) or len(self.trigger_step))


# attribute of SegmentContent -> dataset path in the file
_PATHS = {
    "step": schema.STEPS_STEP, "step_type": schema.STEPS_TYPE, "step_iterations": schema.STEPS_ITERATIONS,
    "step_time": schema.STEPS_TIME, "step_flags": schema.STEPS_FLAGS, "step_reason": schema.STEPS_REASON,
    "summary_step": schema.SUMMARY_STEP, "summary_iteration": schema.SUMMARY_ITERATION,
    "summary_data": schema.SUMMARY_DATA,
    "snap_step": schema.SNAP_STEP, "snap_iteration": schema.SNAP_ITERATION, "snap_series": schema.SNAP_SERIES,
    "snap_shape": schema.SNAP_SHAPE, "snap_samples_offset": schema.SNAP_SAMPLES_OFFSET,
    "snap_samples_count": schema.SNAP_SAMPLES_COUNT, "snap_values_offset": schema.SNAP_VALUES_OFFSET,
    "snap_values_count": schema.SNAP_VALUES_COUNT, "snap_subsampled": schema.SNAP_SUBSAMPLED,
    "snap_index_offset": schema.SNAP_INDEX_OFFSET,
    "sample_index": schema.SAMPLE_INDEX, "sample_category": schema.SAMPLE_CATEGORY, "sample_stats": schema.SAMPLE_STATS, "values": schema.VALUE_POOL,
    "value_index": schema.VALUE_INDEX_POOL,
    "kpi_step": schema.KPI_STEP, "kpi_id": schema.KPI_ID, "kpi_value": schema.KPI_VALUE,
    "kpi_type": schema.KPI_STEP_TYPE,
    "note_step": schema.NOTE_STEP, "note_time": schema.NOTE_TIME, "note_text": schema.NOTE_TEXT,
    "trigger_step": schema.TRIGGER_STEP, "trigger_reason": schema.TRIGGER_REASON,
}
_TEXT = {"step_reason", "note_text", "sample_category", "trigger_reason"}
_ARRAYS = [f.name for f in fields(SegmentContent) if f.name != "catalog"]


def segment_name(sequence: int, level: int) -> str:
    """File name of a segment: sequence number (the largest it covers) and merge level."""
    return f"{schema.SEGMENT_PREFIX}{sequence:08d}-L{level}{schema.SEGMENT_SUFFIX}"


def parse_segment_name(name: str) -> tuple[int, int] | None:
    """``(sequence, level)`` of a segment file name, or None for any other file."""
    m = _SEGMENT_RE.match(name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def write_segment(path: Path, content: SegmentContent, attrs: dict) -> None:
    """Write ``content`` to ``path`` atomically: temporary file, fsync, rename, fsync of the directory."""
    path = Path(path)
    tmp = path.with_name(path.name + schema.TEMP_SUFFIX)
    with h5py.File(tmp, "w") as f:
        for key, value in attrs.items():
            f.attrs[key] = value
        content.catalog.write(f)
        for name in _ARRAYS:
            _write_array(f, _PATHS[name], getattr(content, name), text=name in _TEXT)
    commit_file(tmp, path)


def commit_file(tmp: Path, path: Path) -> None:
    """Make the finished temporary file ``tmp`` durable and put it in place as ``path`` (fsync, rename,
    fsync of the directory): a reader sees the old state or the whole new file, never a partial one."""
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_directory(path.parent)


def _write_array(f: h5py.File, path: str, data: np.ndarray, *, text: bool) -> None:
    if text:
        f.create_dataset(path, data=np.asarray(data, dtype=object), dtype=_STR)
        return
    kwargs: dict = {}
    if path == schema.SUMMARY_DATA and data.size:
        kwargs = dict(chunks=(1, data.shape[1], min(data.shape[2], schema.SUMMARY_CHUNK_ROWS)),
                      compression=schema.COMPRESSION, compression_opts=schema.COMPRESSION_LEVEL, shuffle=True)
    elif data.size > 65536 and path != schema.VALUE_POOL:  # element values barely compress: stored raw
        kwargs = dict(chunks=True, compression=schema.COMPRESSION, compression_opts=schema.COMPRESSION_LEVEL,
                      shuffle=True)
    f.create_dataset(path, data=data, **kwargs)


def fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable (best effort: not every file system allows it)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def read_segment(f: h5py.File) -> SegmentContent:
    """Load a whole segment into memory (used by the merge; the reader reads lazily instead)."""
    content = SegmentContent(catalog=Catalog.read(f))
    for name in _ARRAYS:
        if _PATHS[name] not in f:  # a table this file's writer did not know yet: keep the empty default
            continue
        data = f[_PATHS[name]][()]
        if name in _TEXT:
            data = np.array([v.decode("utf-8") if isinstance(v, bytes) else v for v in data], dtype=object)
        elif name in ("summary_data", "sample_stats"):  # fields of an older format version: the merge identity
            data = schema.pad_fields(data, axis=1)
        setattr(content, name, data)
    return content


def concat(parts: list[SegmentContent]) -> SegmentContent:
    """Concatenate segments in order; the last segment's catalog (the largest) is kept.

    Summary data of older segments has fewer series: missing series are filled with the merge identity.
    Offsets into the sample and value pools are shifted so they stay valid in the concatenated pools; the
    value-index pool keeps one copy of each distinct index (``index_pool``).
    """
    if not parts:
        raise ValueError("nothing to concatenate")
    out = SegmentContent(catalog=parts[-1].catalog)
    num_series = max(p.summary_data.shape[0] for p in parts)
    blocks = []
    for p in parts:
        data = p.summary_data
        if data.shape[0] < num_series:
            pad = np.zeros((num_series - data.shape[0], schema.NUM_FIELDS, data.shape[2]), np.float64)
            pad[:, schema.FIELD["min"], :] = np.inf
            pad[:, schema.FIELD["max"], :] = -np.inf
            data = np.concatenate([data, pad], axis=0)
        blocks.append(data)
    out.summary_data = np.concatenate(blocks, axis=2)
    pools = {"snap_samples_offset": "sample_index", "snap_values_offset": "values"}
    out.value_index, index_offsets = merge_index_pools([p.value_index for p in parts],
                                                       [p.snap_index_offset for p in parts],
                                                       [p.snap_values_count for p in parts])
    out.snap_index_offset = np.concatenate(index_offsets)
    for name in _ARRAYS:
        if name in ("summary_data", "value_index", "snap_index_offset"):
            continue
        if name in pools:
            shifted, base = [], 0
            for p in parts:
                offsets = getattr(p, name)
                shifted.append(np.where(offsets >= 0, offsets + base, offsets))
                base += len(getattr(p, pools[name]))
            setattr(out, name, np.concatenate(shifted))
        else:
            setattr(out, name, np.concatenate([getattr(p, name) for p in parts]))
    return out

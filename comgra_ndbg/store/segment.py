"""Segment files: the unit the writer produces and the merge consumes.

A segment holds the rows of a contiguous range of recorded steps plus the catalog as of its writing. It is
written under a temporary name, flushed to disk and atomically renamed; a file with a final name is
therefore complete and immutable, which is what makes a recording crash-safe and readable while written.
"""
from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path

import h5py
import numpy as np

from comgra_ndbg.store import schema
from comgra_ndbg.store.catalog import Catalog
from comgra_ndbg.store.checksums import decode_text, text_intact, write_dataset, write_slabs
from comgra_ndbg.store.damage import DamagedData
from comgra_ndbg.store.disk_image import DiskImage
from comgra_ndbg.store.file_tables import FileSummaries, FileValues, file_table
from comgra_ndbg.store.index_pool import merge_index_pools
from comgra_ndbg.store.summary_table import SummaryTable
from comgra_ndbg.store.value_blocks import ValueBlocks

__all__ = ["SnapshotData", "SegmentContent", "write_segment", "read_segment", "concat", "segment_name",
           "parse_segment_name", "temporary_image", "write_file", "fsync_directory", "pad_shapes", "array_bytes",
           "PATHS", "TEXT_FIELDS"]
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
    summary_data: np.ndarray | SummaryTable | FileSummaries = field(  # made or read as written when not an array
        default_factory=lambda: np.zeros((0, schema.NUM_FIELDS, 0), np.float64))
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
    values: np.ndarray | ValueBlocks | FileValues = field(  # blocks when buffered, read as written in a merge
        default_factory=lambda: np.zeros(0, np.float32))
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
    log_step: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    log_time: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))
    log_category: np.ndarray = field(default_factory=lambda: np.zeros(0, object))
    log_subject: np.ndarray = field(default_factory=lambda: np.zeros(0, object))
    log_message: np.ndarray = field(default_factory=lambda: np.zeros(0, object))
    log_detail: np.ndarray = field(default_factory=lambda: np.zeros(0, object))
    profile_step: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    profile_module: np.ndarray = field(default_factory=lambda: np.zeros(0, object))
    profile_data: np.ndarray = field(default_factory=lambda: np.zeros((0, len(schema.PROFILE_FIELDS)), np.float64))
    process_step: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    process_data: np.ndarray = field(default_factory=lambda: np.zeros((0, len(schema.PROCESS_FIELDS)), np.float64))

    def is_empty(self) -> bool:
        return not (len(self.step) or len(self.kpi_step) or len(self.note_step) or len(self.trigger_step)
                    or len(self.log_step) or len(self.profile_step) or len(self.process_step))

    @property
    def nbytes(self) -> int:
        """Host memory of the arrays (what the writer counts against its bound for unwritten segments)."""
        return sum(getattr(self, name).nbytes for name in _ARRAYS)


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
    "sample_index": schema.SAMPLE_INDEX, "sample_category": schema.SAMPLE_CATEGORY,
    "sample_stats": schema.SAMPLE_STATS, "values": schema.VALUE_POOL,
    "value_index": schema.VALUE_INDEX_POOL,
    "kpi_step": schema.KPI_STEP, "kpi_id": schema.KPI_ID, "kpi_value": schema.KPI_VALUE,
    "kpi_type": schema.KPI_STEP_TYPE,
    "note_step": schema.NOTE_STEP, "note_time": schema.NOTE_TIME, "note_text": schema.NOTE_TEXT,
    "trigger_step": schema.TRIGGER_STEP, "trigger_reason": schema.TRIGGER_REASON,
    "log_step": schema.LOG_STEP, "log_time": schema.LOG_TIME, "log_category": schema.LOG_CATEGORY,
    "log_subject": schema.LOG_SUBJECT, "log_message": schema.LOG_MESSAGE, "log_detail": schema.LOG_DETAIL,
    "profile_step": schema.PROFILE_STEP, "profile_module": schema.PROFILE_MODULE, "profile_data": schema.PROFILE_DATA,
    "process_step": schema.PROCESS_STEP, "process_data": schema.PROCESS_DATA,
}
_TEXT = {"step_reason", "note_text", "sample_category", "trigger_reason", "log_category", "log_subject",
         "log_message", "log_detail", "profile_module"}
_ARRAYS = [f.name for f in fields(SegmentContent) if f.name != "catalog"]
PATHS = _PATHS  # attribute of SegmentContent -> dataset path, for readers that walk a file table by table
TEXT_FIELDS = frozenset(_TEXT)


def segment_name(sequence: int, level: int) -> str:
    """File name of a segment: sequence number (the largest it covers) and merge level."""
    return f"{schema.SEGMENT_PREFIX}{sequence:08d}-L{level}{schema.SEGMENT_SUFFIX}"


def parse_segment_name(name: str) -> tuple[int, int] | None:
    """``(sequence, level)`` of a segment file name, or None for any other file."""
    m = _SEGMENT_RE.match(name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def write_segment(path: Path, content: SegmentContent, attrs: dict, *, consume: bool = False) -> None:
    """Write ``content`` to ``path`` atomically: temporary file, fsync, rename, fsync of the directory. Every
    dataset carries its checksum (``checksums``). h5py builds the file straight into the temporary file
    through a ``DiskImage``, so the process never holds the file's bytes, and a full disk is an ``OSError``
    raised here once HDF5 has closed its file, never a failure inside HDF5 (which can leave a half-written
    file behind, or crash the process); the temporary file is then removed.

    ``consume=True`` empties each of ``content``'s arrays once HDF5 holds its copy, so a merge of a whole
    recording, or the last write at ``close()``, peaks at about the arrays not yet written; the step numbers
    stay, so that a write that fails still says which steps it lost."""
    path = Path(path)
    with temporary_image(path) as image:
        _build(image, content, attrs, consume=consume)
        write_file(path, image)


def _build(image: DiskImage, content: SegmentContent, attrs: dict, *, consume: bool = False) -> None:
    """Build the HDF5 file holding ``content`` in ``image``. Tables that are not arrays (``ValueBlocks``,
    ``SummaryTable``, ``FileValues``, ``FileSummaries``) are written slab by slab; with ``consume``, each
    table of ``content`` is replaced by an empty array as soon as it is written."""
    # No raw-data chunk cache: every chunk is written whole (slabs are whole chunks), and HDF5's default
    # 1 MiB cache per dataset made a 1 MiB slab's write hold about 8 MiB of filtered chunk buffers at once.
    with h5py.File(image, "w", libver=schema.LIBVER, rdcc_nbytes=0) as f:
        for key, value in attrs.items():
            f.attrs[key] = value
        content.catalog.write(f)
        for field_name in _ARRAYS:
            data = getattr(content, field_name)
            if isinstance(data, np.ndarray):
                write_dataset(f, _PATHS[field_name], data, text=field_name in _TEXT)
            else:  # a table made or read as it is written (ValueBlocks, SummaryTable, FileValues, FileSummaries)
                write_slabs(f, _PATHS[field_name], data.shape, data.dtype, data.slabs(consume=consume))
            if consume and field_name != "step":
                setattr(content, field_name, np.zeros((0,) + data.shape[1:], data.dtype))


@contextlib.contextmanager
def temporary_image(path: Path) -> Iterator[DiskImage]:
    """A ``DiskImage`` on ``path``'s temporary file (``path.tmp``), for h5py to build the file in and
    ``write_file`` to put in place. It is closed when the block ends, and the temporary file removed when the
    block raises (a killed process leaves it behind; the trial's next writer removes it)."""
    tmp = path.with_name(path.name + schema.TEMP_SUFFIX)
    try:
        with DiskImage(tmp) as image:
            yield image
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_file(path: Path, image: DiskImage) -> None:
    """Put the file built in ``image`` in place as ``path``: a write that failed while it was built is raised,
    its temporary file fsynced and renamed, the directory fsynced. A reader sees the old state or the whole
    file, never part of it."""
    image.sync()
    os.replace(image.path, path)
    fsync_directory(path.parent)


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


def read_segment(f: h5py.File, *, lazy: bool = False) -> SegmentContent:
    """Load a whole segment into memory (used by the merge; the reader reads lazily instead). A damaged chunk
    raises h5py's ``OSError``, text failing its checksum ``DamagedData``. With ``lazy`` the value pool and
    the summary table, most of the bytes, are not read but referred to (``FileValues``, ``FileSummaries``):
    a merge reads them from the file as it writes them (``file_tables``)."""
    content = SegmentContent(catalog=Catalog.read(f))
    if lazy:
        content.values = FileValues([])
        content.summary_data = FileSummaries([])
    for name in _ARRAYS:
        if _PATHS[name] not in f:  # a table this file's writer did not know yet: keep the empty default
            continue
        if lazy and name in ("values", "summary_data"):
            getattr(content, name).pieces.append(file_table(f, _PATHS[name]))
            continue
        dataset = f[_PATHS[name]]
        data = dataset[()]
        if name in _TEXT:
            data = decode_text(data)
            if not text_intact(dataset, data):
                raise DamagedData(f.filename, _PATHS[name], "its text fails its checksum")
        elif name in ("summary_data", "sample_stats"):  # fields of an older format version: the merge identity
            data = schema.pad_fields(data, axis=1)
        setattr(content, name, data)
    return content


def array_bytes(path: Path) -> int:
    """The host memory ``read_segment`` takes for the file at ``path`` (its datasets' element counts times
    their item sizes, as ``SegmentContent.nbytes`` counts them), from the file's metadata alone: what a merge
    weighs against its size cap before it reads anything."""
    total = 0

    def add(_: str, item: object) -> None:
        nonlocal total
        if isinstance(item, h5py.Dataset):
            total += int(item.size or 0) * item.dtype.itemsize

    with h5py.File(path, "r") as f:
        f.visititems(add)
    return total


def pad_shapes(shapes: np.ndarray, width: int) -> np.ndarray:
    """Rows of ``snapshot/shape`` widened to ``width`` columns with ``-1``."""
    if shapes.shape[1] >= width:
        return shapes
    return np.concatenate([shapes, np.full((len(shapes), width - shapes.shape[1]), -1, np.int64)], axis=1)


def concat(parts: list[SegmentContent]) -> SegmentContent:
    """Concatenate segments in order; the last segment's catalog (the largest) is kept.

    Summary data of older segments has fewer series: missing series are filled with the merge identity.
    Offsets into the sample and value pools are shifted so they stay valid in the concatenated pools; the
    value-index pool keeps one copy of each distinct index (``index_pool``). Value pools and summary tables
    still in their files (``read_segment(..., lazy=True)``) stay there, joined as references (``FileValues``,
    ``FileSummaries``).
    """
    if not parts:
        raise ValueError("nothing to concatenate")
    out = SegmentContent(catalog=parts[-1].catalog)
    if any(isinstance(p.summary_data, FileSummaries) for p in parts):
        out.summary_data = FileSummaries.joined([p.summary_data for p in parts])
    else:
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
    width = max(p.snap_shape.shape[1] for p in parts)
    out.snap_shape = np.concatenate([pad_shapes(p.snap_shape, width) for p in parts])
    in_files = any(isinstance(p.values, FileValues) for p in parts)
    for name in _ARRAYS:
        if name in ("summary_data", "value_index", "snap_index_offset", "snap_shape"):
            continue
        if name == "values" and in_files:
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
    if in_files:
        out.values = FileValues.joined([p.values for p in parts])
    return out

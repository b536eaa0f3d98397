"""Segment files: names, atomic writes, concatenation, which files are live after merges and crashes, the
schema's dataset paths read back with raw h5py, and the catalog's round trip."""
from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable
from pathlib import Path

import h5py
import numpy as np
import pytest

from comgra_ndbg import RecordingNotFoundError, __version__, open_recording
from comgra_ndbg.store import schema, views
from comgra_ndbg.store import consolidate as consolidate_module
from comgra_ndbg.store import writer as writer_module
from comgra_ndbg.store.buffers import JoinedRows
from comgra_ndbg.store.catalog import Catalog, ModuleInfo, TensorInfo
from comgra_ndbg.store.segment import (SegmentContent, SnapshotData, concat, parse_segment_name, read_segment,
                                       segment_name, write_segment)
from comgra_ndbg.store.writer import FINAL_LEVEL, RecordingWriter, list_live_segments

F = schema.FIELD


# ---- helpers -------------------------------------------------------------------------------------------
def _catalog(num_tensors: int = 2) -> Catalog:
    catalog = Catalog()
    for i in range(num_tensors):
        tid = catalog.add_tensor(TensorInfo(name=f"t{i}", node=f"t{i}", role="intermediate", dtype="float32",
                                            shape=(4, 3), batched=True))
        catalog.series_id(tid, schema.KIND_VALUE)
    catalog.step_type_id("train")
    catalog.kpi_id("loss")
    return catalog


def _row(count: float, total: float, low: float, high: float) -> np.ndarray:
    row = schema.identity_row()
    row[[F["count"], F["sum"], F["sum_sq"], F["sum_abs"], F["min"], F["max"]]] = (
        count, total, total * total, abs(total), low, high)
    return row


def _attrs(sequence: int, covers: list[int], level: int, *, complete: bool = False) -> dict:
    return {
        schema.ATTR_FORMAT: schema.FORMAT_NAME,
        schema.ATTR_FORMAT_VERSION: schema.FORMAT_VERSION,
        schema.ATTR_TRIAL: "trial",
        schema.ATTR_SEQUENCE: sequence,
        schema.ATTR_COVERS: np.array(covers, dtype=np.int64),
        schema.ATTR_LEVEL: level,
        schema.ATTR_COMPLETE: complete,
        schema.ATTR_CREATED: 1.0,
        schema.ATTR_LIBRARY_VERSION: __version__,
        schema.ATTR_CONFIG: "{}",
    }


def _steps_content(catalog: Catalog, steps: list[int]) -> SegmentContent:
    """One summary row per step for every series of ``catalog``: series s at step k has sum 100 s + k."""
    c = SegmentContent(catalog=catalog)
    n, num_series = len(steps), len(catalog.series)
    c.step = np.array(steps, np.int64)
    c.step_type = np.zeros(n, np.int32)
    c.step_iterations = np.ones(n, np.int32)
    c.step_time = np.arange(n, dtype=np.float64) + 0.5
    c.step_flags = np.full(n, schema.FLAG_SUMMARY, np.uint8)
    c.step_reason = np.array([f"every step ({s})" for s in steps], object)
    c.summary_step = np.array(steps, np.int64)
    c.summary_iteration = np.zeros(n, np.int32)
    c.summary_data = np.stack([np.stack([_row(12, 100.0 * s + k, -1.0, float(k)) for k in steps], axis=1)
                               for s in range(num_series)]) if num_series else np.zeros((0, schema.NUM_FIELDS, n))
    return c


def _write_steps(directory: Path, catalog: Catalog, steps: list[int], sequence: int) -> Path:
    path = directory / segment_name(sequence, 0)
    write_segment(path, _steps_content(catalog, steps), _attrs(sequence, [sequence], 0))
    return path


def _merge_by_hand(directory: Path, inputs: list[Path], level: int, *, final: bool = False) -> Path:
    """What the writer's merge does up to the rename, leaving the inputs on disk (the crash window)."""
    parts, covers = [], []
    for path in inputs:
        with h5py.File(path, "r") as f:
            parts.append(read_segment(f))
            covers.extend(int(v) for v in f.attrs[schema.ATTR_COVERS])
    sequence = max(covers)
    out = directory / (schema.FINAL_NAME if final else segment_name(sequence, level))
    write_segment(out, concat(parts), _attrs(sequence, sorted(covers), level, complete=final))
    return out


def _buffer_steps(writer: RecordingWriter, steps: range) -> None:
    for step in steps:
        writer.add_step(step, 0, 1, schema.FLAG_SUMMARY, "")
        writer.add_summaries(step, 0, np.array([0]), _row(12, step, -1, step)[None])


def _names(live: list[tuple[int, int, Path]]) -> list[str]:
    return [path.name for _, _, path in live]


# ---- names -------------------------------------------------------------------------------------------------
def test_segment_names_pad_the_sequence_to_eight_digits_and_parse_back():
    assert segment_name(7, 0) == "seg-00000007-L0.h5"
    assert segment_name(12345678, 3) == "seg-12345678-L3.h5"
    for sequence, level in [(1, 0), (7, 2), (12345678, 3), (123456789, 0), (5, FINAL_LEVEL)]:
        assert parse_segment_name(segment_name(sequence, level)) == (sequence, level)


@pytest.mark.parametrize("name", [
    "recording.h5", "seg-00000001-L0.h5.tmp", "seg-1-L0.h5", "seg-00000001-L.h5", "seg-00000001-L0.hdf5",
    "xseg-00000001-L0.h5", "seg-0000000a-L0.h5", "notes.txt",
])
def test_parse_segment_name_rejects_every_other_file(name):
    assert parse_segment_name(name) is None


# ---- write_segment / read_segment -------------------------------------------------------------------------
def _full_content() -> SegmentContent:
    catalog = _catalog(2)
    c = _steps_content(catalog, [3, 4])
    c.summary_data[1, F["max"], 1] = np.inf
    c.snap_step = np.array([3, 4], np.int64)
    c.snap_iteration = np.array([0, 1], np.int32)
    c.snap_series = np.array([0, 1], np.int32)
    c.snap_shape = np.full((2, schema.MAX_RANK), -1, np.int64)
    c.snap_shape[0, :2], c.snap_shape[1, :1] = (4, 3), (5,)
    c.snap_samples_offset = np.array([0, 2], np.int64)
    c.snap_samples_count = np.array([2, 0], np.int32)
    c.snap_values_offset = np.array([0, 6], np.int64)
    c.snap_values_count = np.array([6, 2], np.int64)
    c.snap_subsampled = np.array([False, True])
    c.snap_index_offset = np.array([-1, 0], np.int64)
    c.sample_index = np.array([0, 1], np.int64)
    c.sample_stats = np.arange(2 * schema.NUM_FIELDS, dtype=np.float64).reshape(2, schema.NUM_FIELDS)
    c.values = np.array([1.5, np.nan, np.inf, -np.inf, -0.0, 3.0, 7.0, 8.0], np.float32)
    c.value_index = np.array([0, 4], np.int64)
    c.kpi_step = np.array([3, 4], np.int64)
    c.kpi_id = np.zeros(2, np.int32)
    c.kpi_value = np.array([0.25, np.nan])
    c.kpi_type = np.zeros(2, np.int32)
    c.note_step = np.array([-1, 4], np.int64)
    c.note_time = np.array([10.0, 11.0])
    c.note_text = np.array(["before the first step", "lr → 1e-4"], object)
    c.sample_category = np.array(["cat", ""], object)
    c.trigger_step, c.trigger_reason = np.array([4], np.int64), np.array(["non-finite values in 't1'"], object)
    return c


def _assert_same_content(a: SegmentContent, b: SegmentContent) -> None:
    for name in vars(a):
        if name == "catalog":
            continue
        x, y = getattr(a, name), getattr(b, name)
        if x.dtype == object:
            assert list(x) == list(y), name
        else:
            assert x.dtype == y.dtype, name
            np.testing.assert_array_equal(x, y, err_msg=name)


def test_write_segment_renames_into_place_and_round_trips(tmp_path):
    content = _full_content()
    path = tmp_path / segment_name(1, 0)
    write_segment(path, content, _attrs(1, [1], 0))
    assert sorted(os.listdir(tmp_path)) == [path.name]  # no .tmp left behind
    with h5py.File(path, "r") as f:
        back = read_segment(f)
        assert f.attrs[schema.ATTR_FORMAT] == schema.FORMAT_NAME
        assert f.attrs[schema.ATTR_COVERS].tolist() == [1]
    _assert_same_content(content, back)
    assert back.catalog.tensors == content.catalog.tensors
    assert back.catalog.series == content.catalog.series
    assert np.signbit(back.values[4]) and back.values[4] == 0.0  # -0.0 kept bit for bit


def test_a_failed_write_never_leaves_a_file_under_its_final_name(tmp_path, monkeypatch):
    earlier = _write_steps(tmp_path, _catalog(), [0], 1)

    def broken_write(self, f):
        f.create_group(schema.TENSORS)
        raise OSError("disk full")

    monkeypatch.setattr(Catalog, "write", broken_write)
    target = tmp_path / segment_name(2, 0)
    with pytest.raises(OSError, match="disk full"):
        write_segment(target, _steps_content(_catalog(), [1]), _attrs(2, [2], 0))
    assert not target.exists()
    assert not (tmp_path / (target.name + schema.TEMP_SUFFIX)).exists()  # removed, not left behind
    assert list_live_segments(tmp_path) == [(1, 0, earlier)]
    with open_recording(tmp_path) as rec:
        assert rec.steps.tolist() == [0]


def test_write_segment_overwrites_a_stale_temporary_file(tmp_path):
    target = tmp_path / segment_name(1, 0)
    (tmp_path / (target.name + schema.TEMP_SUFFIX)).write_bytes(b"half a file from a killed process")
    write_segment(target, _steps_content(_catalog(), [0, 1]), _attrs(1, [1], 0))
    assert os.listdir(tmp_path) == [target.name]
    with h5py.File(target, "r") as f:
        assert f[schema.STEPS_STEP][()].tolist() == [0, 1]


def test_summary_data_and_large_pools_are_compressed_losslessly_element_values_stored_raw(tmp_path):
    content = _steps_content(_catalog(3), list(range(5000)))
    content.summary_data[2, F["sum"], 17] = np.nan
    content.summary_data[2, F["sum"], 18] = -np.inf
    content.values = np.linspace(-1, 1, 70000, dtype=np.float32)
    content.values[[5, 6, 7]] = np.nan, np.inf, -np.inf
    content.value_index = np.arange(0, 140000, 2, dtype=np.int64)
    path = tmp_path / segment_name(1, 0)
    write_segment(path, content, _attrs(1, [1], 0))
    with h5py.File(path, "r") as f:
        data, values, index = f[schema.SUMMARY_DATA], f[schema.VALUE_POOL], f[schema.VALUE_INDEX_POOL]
        assert data.chunks == (1, schema.NUM_FIELDS, schema.SUMMARY_CHUNK_ROWS)
        assert (data.compression, data.compression_opts, data.shuffle) == ("gzip", 1, True)
        assert (index.compression, index.shuffle) == ("gzip", True)
        assert values.compression is None
        np.testing.assert_array_equal(data[()].view(np.uint64), content.summary_data.view(np.uint64))
        np.testing.assert_array_equal(values[()].view(np.uint32), content.values.view(np.uint32))
        np.testing.assert_array_equal(index[()], content.value_index)


def test_tables_of_rows_are_chunked_by_whole_rows_of_at_most_chunk_elements(tmp_path):
    """Per-sample statistics (17 fields a row) in chunks of 963 rows, not 16 384: HDF5 filters a chunk in
    buffers as large as the chunk, which writing 2 MiB chunks held in memory at once."""
    content = _steps_content(_catalog(1), [0])
    rows = 50_000
    content.sample_stats = np.random.default_rng(0).standard_normal((rows, schema.NUM_FIELDS))
    content.sample_index = np.arange(rows, dtype=np.int64)
    path = tmp_path / segment_name(1, 0)
    write_segment(path, content, _attrs(1, [1], 0))
    with h5py.File(path, "r") as f:
        stats, index = f[schema.SAMPLE_STATS], f[schema.SAMPLE_INDEX]
        assert stats.chunks == (schema.CHUNK_ELEMENTS // schema.NUM_FIELDS, schema.NUM_FIELDS)
        assert index.chunks == (schema.CHUNK_ELEMENTS,) and stats.fletcher32 and index.fletcher32
        np.testing.assert_array_equal(stats[()], content.sample_stats)
        np.testing.assert_array_equal(index[()], content.sample_index)


def test_per_sample_rows_joined_as_they_are_written_make_the_file_their_concatenation_makes(tmp_path):
    rng = np.random.default_rng(1)
    pieces = [rng.standard_normal((int(n), schema.NUM_FIELDS)) for n in rng.integers(0, 700, 40)]
    joined = JoinedRows(pieces, schema.NUM_FIELDS)
    whole = np.concatenate(pieces)
    assert joined.shape == whole.shape and joined.nbytes == whole.nbytes
    slabs = [slab.copy() for slab in joined.slabs()]  # whole chunks, then the rest
    assert {len(slab) for slab in slabs[:-1]} == {schema.CHUNK_ELEMENTS // schema.NUM_FIELDS}
    np.testing.assert_array_equal(np.concatenate(slabs), whole)
    for name, stats in (("joined.h5", joined), ("whole.h5", whole)):
        content = _steps_content(_catalog(1), [0])
        content.sample_stats = stats
        write_segment(tmp_path / name, content, _attrs(1, [1], 0), consume=True)
    assert joined._pieces == [None] * len(pieces)  # let go of once written
    with h5py.File(tmp_path / "joined.h5", "r") as a, h5py.File(tmp_path / "whole.h5", "r") as b:
        x, y = a[schema.SAMPLE_STATS], b[schema.SAMPLE_STATS]
        assert (x.shape, x.dtype, x.chunks, x.compression, x.fletcher32) == \
               (y.shape, y.dtype, y.chunks, y.compression, y.fletcher32)
        np.testing.assert_array_equal(x[()], y[()])


# ---- concat -----------------------------------------------------------------------------------------------
def test_concat_pads_older_segments_missing_series_with_the_merge_identity():
    old_catalog, new_catalog = _catalog(1), _catalog(3)
    old = _steps_content(old_catalog, [0, 1])
    new = _steps_content(new_catalog, [2])
    out = concat([old, new])
    assert out.catalog is new_catalog
    assert out.summary_data.shape == (3, schema.NUM_FIELDS, 3)
    np.testing.assert_array_equal(out.summary_data[0], np.stack([_row(12, 0, -1, 0), _row(12, 1, -1, 1),
                                                                 _row(12, 2, -1, 2)], axis=1))
    identity = schema.identity_row()
    for series in (1, 2):
        np.testing.assert_array_equal(out.summary_data[series, :, :2], np.stack([identity, identity], axis=1))
        np.testing.assert_array_equal(out.summary_data[series, :, 2], _row(12, 100.0 * series + 2, -1, 2))
    assert out.step.tolist() == [0, 1, 2]
    assert out.summary_step.tolist() == [0, 1, 2]
    assert list(out.step_reason) == ["every step (0)", "every step (1)", "every step (2)"]


def test_concat_handles_segments_without_summaries():
    catalog = _catalog(2)
    notes_only = SegmentContent(catalog=_catalog(1))
    notes_only.note_step, notes_only.note_time = np.array([-1], np.int64), np.array([1.0])
    notes_only.note_text = np.array(["hello"], object)
    out = concat([notes_only, _steps_content(catalog, [0])])
    assert out.summary_data.shape == (2, schema.NUM_FIELDS, 1)
    assert out.note_step.tolist() == [-1] and list(out.note_text) == ["hello"]


def _snapshot_part(values: list[float], sample_rows: int, subsampled_index: list[int] | None) -> SegmentContent:
    """A segment holding one snapshot: ``sample_rows`` per-sample rows and the given values."""
    c = SegmentContent(catalog=_catalog(1))
    c.snap_step, c.snap_iteration, c.snap_series = np.array([0]), np.array([0], np.int32), np.array([0], np.int32)
    c.snap_shape = np.full((1, schema.MAX_RANK), -1, np.int64)
    c.snap_shape[0, 0] = len(values)
    c.snap_samples_offset, c.snap_samples_count = np.array([0]), np.array([sample_rows], np.int32)
    c.snap_values_offset, c.snap_values_count = np.array([0]), np.array([len(values)])
    c.snap_subsampled = np.array([subsampled_index is not None])
    c.snap_index_offset = np.array([-1 if subsampled_index is None else 0])
    c.sample_index = np.arange(sample_rows, dtype=np.int64)
    c.sample_stats = np.full((sample_rows, schema.NUM_FIELDS), float(sample_rows))
    c.values = np.array(values, np.float32)
    c.value_index = np.array(subsampled_index or [], np.int64)
    return c


def test_concat_shifts_pool_offsets_and_keeps_minus_one_for_full_snapshots():
    a = _snapshot_part([1.0, 2.0, 3.0], 2, [0, 5, 9])
    b = _snapshot_part([4.0, 5.0], 1, None)
    c = _snapshot_part([6.0, 7.0, 8.0, 9.0], 3, [1, 2, 3, 4])
    out = concat([a, b, c])
    np.testing.assert_array_equal(out.snap_samples_offset, [0, 2, 3])
    np.testing.assert_array_equal(out.snap_samples_count, [2, 1, 3])
    np.testing.assert_array_equal(out.snap_values_offset, [0, 3, 5])
    np.testing.assert_array_equal(out.snap_values_count, [3, 2, 4])
    np.testing.assert_array_equal(out.snap_index_offset, [0, -1, 3])
    np.testing.assert_array_equal(out.values, np.arange(1, 10, dtype=np.float32))
    np.testing.assert_array_equal(out.value_index, [0, 5, 9, 1, 2, 3, 4])
    np.testing.assert_array_equal(out.sample_index, [0, 1, 0, 0, 1, 2])
    np.testing.assert_array_equal(out.sample_stats[:, 0], [2, 2, 1, 3, 3, 3])
    for i, part in enumerate([a, b, c]):
        v0, vn = out.snap_values_offset[i], out.snap_values_count[i]
        np.testing.assert_array_equal(out.values[v0:v0 + vn], part.values)
        if out.snap_index_offset[i] >= 0:
            x0 = out.snap_index_offset[i]
            np.testing.assert_array_equal(out.value_index[x0:x0 + vn], part.value_index)


def test_concat_stores_an_index_that_several_segments_share_once():
    a = _snapshot_part([1.0, 2.0, 3.0], 0, [0, 5, 9])
    b = _snapshot_part([4.0, 5.0, 6.0], 0, [0, 5, 9])
    c = _snapshot_part([7.0, 8.0], 0, [0, 5])  # a prefix of the others: a slice of its own all the same
    out = concat([a, b, c])
    np.testing.assert_array_equal(out.value_index, [0, 5, 9, 0, 5])
    np.testing.assert_array_equal(out.snap_index_offset, [0, 0, 3])
    for i, part in enumerate([a, b, c]):
        x0, vn = out.snap_index_offset[i], out.snap_values_count[i]
        np.testing.assert_array_equal(out.value_index[x0:x0 + vn], part.value_index)


def test_the_writer_stores_each_distinct_value_index_once_and_reads_every_snapshot_back(tmp_path):
    catalog = _catalog(2)
    writer = RecordingWriter(tmp_path / "trial", "trial")
    index = np.array([0, 4, 8, 11], np.int64)
    for step in range(3):
        writer.add_step(step, 0, 1, schema.FLAG_SNAPSHOT, "")
        for series in (0, 1):
            values = np.full(4, 10.0 * step + series, np.float32)
            own = index if series == 0 else index.copy()  # equal content, another array
            writer.add_snapshot(step, 0, series, SnapshotData((4, 3), np.zeros(0, np.int64),
                                                              np.zeros((0, schema.NUM_FIELDS)), values, own))
        writer.add_snapshot(step, 1, 1, SnapshotData((4, 3), np.zeros(0, np.int64), np.zeros((0, schema.NUM_FIELDS)),
                                                     np.ones(2, np.float32), np.array([1, 2 + step])))
        writer.flush(catalog)
    writer.close(catalog)
    with h5py.File(tmp_path / "trial" / schema.FINAL_NAME, "r") as f:
        assert f[schema.VALUE_INDEX_POOL][()].tolist() == [0, 4, 8, 11, 1, 2, 1, 3, 1, 4]
        assert len(f[schema.SNAP_STEP]) == 9
    with open_recording(tmp_path / "trial") as rec:
        for step in range(3):
            snap = rec.snapshot(step, "t1", "value")
            np.testing.assert_array_equal(snap.value_index, index)
            np.testing.assert_array_equal(snap.values, np.full(4, 10.0 * step + 1, np.float32))


def _write_four_steps(tmp_path: Path, flush_after: Iterable[int]) -> tuple[RecordingWriter, Catalog]:
    """Steps 0-3 of one series into ``tmp_path/trial``, flushed after the steps in ``flush_after``, then closed;
    the closed writer and its catalog."""
    catalog, flushed = _catalog(1), set(flush_after)
    writer = RecordingWriter(tmp_path / "trial", "trial")
    for step in range(4):
        writer.add_step(step, 0, 1, schema.FLAG_SUMMARY, "")
        writer.add_summaries(step, 0, np.array([0]), _row(12, step, -1, step)[None])
        if step in flushed:
            writer.flush(catalog)
    writer.close(catalog)
    return writer, catalog


@pytest.mark.parametrize("flushes", [0, 1])
def test_close_writes_a_run_that_never_flushed_straight_into_the_final_file(tmp_path, monkeypatch, flushes):
    written = []

    def recording_write(path, content, attrs, **options):
        written.append(Path(path).name)
        write_segment(path, content, attrs, **options)

    monkeypatch.setattr(writer_module, "write_segment", recording_write)  # flushes
    monkeypatch.setattr(consolidate_module, "write_segment", recording_write)  # merges
    writer, catalog = _write_four_steps(tmp_path, flush_after=(1,) if flushes else ())
    if flushes:  # the rest is flushed and both segments merged, as before
        assert written == [segment_name(1, 0), segment_name(2, 0), schema.FINAL_NAME]
    else:  # one write, no segment to copy or merge
        assert written == [schema.FINAL_NAME]
    assert os.listdir(tmp_path / "trial") == [schema.FINAL_NAME]
    with h5py.File(tmp_path / "trial" / schema.FINAL_NAME, "r") as f:
        assert f.attrs[schema.ATTR_COMPLETE] and f.attrs[schema.ATTR_LEVEL] == FINAL_LEVEL
        assert f.attrs[schema.ATTR_COVERS].tolist() == ([1, 2] if flushes else [1])
    with open_recording(tmp_path / "trial") as rec:
        assert rec.summary("t0", "value", "max")[1].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert writer.close(catalog) == tmp_path / "trial" / schema.FINAL_NAME  # idempotent


def test_concat_of_nothing_is_an_error():
    with pytest.raises(ValueError, match="nothing"):
        concat([])


# ---- which files are live --------------------------------------------------------------------------------
def test_writer_merges_every_fanout_segments_into_the_next_level(tmp_path):
    catalog = _catalog(1)
    writer = RecordingWriter(tmp_path / "trial", "trial", fanout=3)
    for step in range(10):
        writer.add_step(step, 0, 1, schema.FLAG_SUMMARY, "")
        writer.add_summaries(step, 0, np.array([0]), _row(12, step, -1, step)[None])
        writer.flush(catalog)
    writer.wait_for_merges()
    directory = tmp_path / "trial"
    assert sorted(os.listdir(directory)) == ["seg-00000009-L2.h5", "seg-00000010-L0.h5", schema.LOCK_NAME]
    assert _names(list_live_segments(directory)) == ["seg-00000009-L2.h5", "seg-00000010-L0.h5"]
    with h5py.File(directory / "seg-00000009-L2.h5", "r") as f:
        assert f.attrs[schema.ATTR_COVERS].tolist() == list(range(1, 10))
        assert int(f.attrs[schema.ATTR_LEVEL]) == 2
    with open_recording(directory) as rec:
        assert rec.summary("t0", stat="mean")[1].tolist() == [k / 12 for k in range(10)]
    writer.close(catalog)
    assert os.listdir(directory) == [schema.FINAL_NAME]
    assert list_live_segments(directory) == [(10, FINAL_LEVEL, directory / schema.FINAL_NAME)]


def test_live_segments_ignore_inputs_a_crash_left_beside_their_merged_file(tmp_path):
    catalog = _catalog(2)
    inputs = [_write_steps(tmp_path, catalog, [2 * i, 2 * i + 1], i + 1) for i in range(3)]
    later = _write_steps(tmp_path, catalog, [6], 4)
    merged = _merge_by_hand(tmp_path, inputs, 1)  # renamed into place; the inputs were not deleted yet
    assert _names(list_live_segments(tmp_path)) == ["seg-00000003-L1.h5", "seg-00000004-L0.h5"]
    with open_recording(tmp_path) as rec:
        assert rec.steps.tolist() == [0, 1, 2, 3, 4, 5, 6]
        assert rec.summary("t1", stat="max")[1].tolist() == [0, 1, 2, 3, 4, 5, 6]
    inputs[1].unlink()  # killed in the middle of deleting the inputs
    assert _names(list_live_segments(tmp_path)) == ["seg-00000003-L1.h5", "seg-00000004-L0.h5"]
    final = _merge_by_hand(tmp_path, [merged, later], FINAL_LEVEL, final=True)  # close() killed before cleanup
    assert list_live_segments(tmp_path) == [(4, FINAL_LEVEL, final)]
    with open_recording(tmp_path) as rec:
        assert rec.is_complete
        assert rec.steps.tolist() == [0, 1, 2, 3, 4, 5, 6]


def test_live_segments_skip_temporaries_and_foreign_files(tmp_path):
    first = _write_steps(tmp_path, _catalog(), [0], 1)
    (tmp_path / (segment_name(2, 0) + schema.TEMP_SUFFIX)).write_bytes(b"\x89HDF\r\n\x1a\n truncated")
    (tmp_path / (schema.FINAL_NAME + schema.TEMP_SUFFIX)).write_bytes(b"")
    (tmp_path / "notes.txt").write_text("not a segment")
    (tmp_path / "seg-garbage.h5").write_text("not a segment either")
    assert list_live_segments(tmp_path) == [(1, 0, first)]


def test_live_segments_list_again_when_a_merged_file_vanishes_while_listing(tmp_path, monkeypatch):
    """A reader lists the directory, then the writer merges the listed level-1 files into a level-2 file and
    deletes them before the reader reads their ``covers``: the stale listing must not hide their steps."""
    catalog = _catalog(1)
    level1 = [_merge_by_hand(tmp_path, [_write_steps(tmp_path, catalog, [i], i + 1)], 1) for i in range(2)]
    for path in tmp_path.glob("*-L0.h5"):
        path.unlink()
    stale = sorted(tmp_path.iterdir())
    merged = _merge_by_hand(tmp_path, level1, 2)
    for path in level1:
        path.unlink()
    real_iterdir, calls = Path.iterdir, []

    def iterdir(self):
        calls.append(self)
        return iter(stale) if len(calls) == 1 else real_iterdir(self)

    monkeypatch.setattr(Path, "iterdir", iterdir)
    assert list_live_segments(tmp_path) == [(2, 2, merged)]
    assert len(calls) == 2


def test_a_reader_lists_again_when_a_listed_segment_was_merged_away(tmp_path, monkeypatch):
    """The reader lists level-0 files, the writer merges and deletes them, then the reader opens them."""
    catalog = _catalog(1)
    inputs = [_write_steps(tmp_path, catalog, [i], i + 1) for i in range(2)]
    stale = list_live_segments(tmp_path)
    merged = _merge_by_hand(tmp_path, inputs, 1)
    for path in inputs:
        path.unlink()
    listings = [stale]
    real_scan = views.scan_trial

    def scan(directory):
        found = real_scan(directory)
        if listings:
            found.live = listings.pop()
        return found

    monkeypatch.setattr(views, "scan_trial", scan)
    with open_recording(tmp_path) as rec:
        assert rec.files == [merged]
        assert rec.steps.tolist() == [0, 1]


def test_a_reader_follows_segments_across_merges(tmp_path):
    catalog = _catalog(1)
    writer = RecordingWriter(tmp_path / "t", "t", fanout=2)
    with pytest.raises(RecordingNotFoundError):
        open_recording(tmp_path)
    writer.add_step(0, 0, 1, schema.FLAG_SUMMARY, "")
    writer.add_summaries(0, 0, np.array([0]), _row(12, 0, -1, 0)[None])
    writer.flush(catalog)
    rec = open_recording(tmp_path)
    first_files = rec.files
    for step in range(1, 4):
        writer.add_step(step, 0, 1, schema.FLAG_SUMMARY, "")
        writer.add_summaries(step, 0, np.array([0]), _row(12, step, -1, step)[None])
        writer.flush(catalog)
        writer.wait_for_merges()
        assert rec.refresh() is True
        assert rec.steps.tolist() == list(range(step + 1))
    assert rec.refresh() is False
    assert rec.files != first_files and [p.name for p in rec.files] == ["seg-00000004-L2.h5"]
    rec.close()


# ---- merges on the worker thread ---------------------------------------------------------------------------
def _reports() -> tuple[list, object]:
    """A list and a writer's ``report`` that appends (step, category, subject, message, detail) to it."""
    reports: list = []
    return reports, lambda *args: reports.append(args)


def _gated_writer(directory: Path, fanout: int, fail: bool = False, report=None
                  ) -> tuple[RecordingWriter, threading.Event, list]:
    """A writer whose merges wait for the returned gate (and then fail, with ``fail``); the list collects the
    threads they ran on."""
    writer = RecordingWriter(directory, directory.name, fanout=fanout, report=report)
    gate, threads = threading.Event(), []
    merge = writer._merger._merge

    def gated(inputs: list, level: int) -> tuple[int, Path]:
        threads.append(threading.current_thread())
        assert gate.wait(timeout=30), "the test never opened the gate"
        if fail:
            raise OSError(28, "No space left on device")
        return merge(inputs, level)

    writer._merger._merge = gated
    return writer, gate, threads


def _flush_steps(writer: RecordingWriter, catalog: Catalog, steps: range) -> None:
    for step in steps:
        _buffer_steps(writer, range(step, step + 1))
        writer.flush(catalog)


def test_a_merge_runs_on_a_worker_thread_while_flushes_and_readers_go_on(tmp_path):
    catalog = _catalog(1)
    writer, gate, threads = _gated_writer(tmp_path / "t", fanout=2)
    _flush_steps(writer, catalog, range(5))  # the first merge is held at the gate: flushes do not wait for it
    assert threads and all(t is not threading.main_thread() for t in threads)
    assert sorted(os.listdir(tmp_path / "t")) == [f"seg-0000000{i}-L0.h5" for i in range(1, 6)] + [schema.LOCK_NAME]
    with open_recording(tmp_path / "t") as rec:
        assert rec.steps.tolist() == [0, 1, 2, 3, 4]
    gate.set()
    writer.wait_for_merges()
    assert sorted(os.listdir(tmp_path / "t")) == ["seg-00000004-L2.h5", "seg-00000005-L0.h5", schema.LOCK_NAME]
    with open_recording(tmp_path / "t") as rec:
        assert rec.summary("t0", stat="max")[1].tolist() == [0, 1, 2, 3, 4]
    writer.close(catalog)
    assert os.listdir(tmp_path / "t") == [schema.FINAL_NAME]


def test_close_waits_for_a_running_merge_and_consolidates_everything(tmp_path):
    catalog = _catalog(1)
    writer, gate, _ = _gated_writer(tmp_path / "t", fanout=2)
    _flush_steps(writer, catalog, range(3))
    closing = threading.Thread(target=writer.close, args=(catalog,))
    closing.start()
    closing.join(timeout=0.3)
    assert closing.is_alive()  # waiting for the merge at the gate
    gate.set()
    closing.join(timeout=30)
    assert not closing.is_alive()
    assert os.listdir(tmp_path / "t") == [schema.FINAL_NAME]
    with open_recording(tmp_path / "t") as rec:
        assert rec.is_complete and rec.steps.tolist() == [0, 1, 2]


def test_a_failed_background_merge_is_reported_once_and_close_merges_its_inputs(tmp_path):
    catalog = _catalog(1)
    reports, report = _reports()
    writer, gate, threads = _gated_writer(tmp_path / "t", fanout=2, fail=True, report=report)
    _flush_steps(writer, catalog, range(2))
    gate.set()
    writer.wait_for_merges()
    _flush_steps(writer, catalog, range(2, 3))  # reports the failure, never raises into training
    [(step, category, subject, message, _)] = reports
    assert (category, subject) == (schema.PROBLEM_STORAGE, "merge")
    assert "merging segment files" in message and "No space left on device (ENOSPC)" in message
    _flush_steps(writer, catalog, range(3, 6))  # reported once; no merge is tried again
    assert len(reports) == 1
    writer.wait_for_merges()
    assert len(threads) == 1
    assert sorted(os.listdir(tmp_path / "t")) == [f"seg-0000000{i}-L0.h5" for i in range(1, 7)] + [schema.LOCK_NAME]
    writer._merger._merge = writer._merge  # the disk has space again
    writer.close(catalog)
    with open_recording(tmp_path / "t") as rec:
        assert rec.is_complete and rec.steps.tolist() == list(range(6))


# ---- periodic flushes written on a worker thread ---------------------------------------------------------
def _gated_segment_writes(monkeypatch, fail: bool = False) -> tuple[threading.Event, list]:
    """Make every segment write wait for the returned gate (and then fail, with ``fail``); the list collects
    (thread, file name) of each write."""
    gate, writes = threading.Event(), []

    def gated(path, content, attrs, **options):
        writes.append((threading.current_thread(), Path(path).name))
        assert gate.wait(timeout=30), "the test never opened the gate"
        if fail:
            raise OSError(28, "No space left on device")
        write_segment(path, content, attrs, **options)

    monkeypatch.setattr(writer_module, "write_segment", gated)
    return gate, writes




def _failing_background_write(directory: Path, monkeypatch, steps: range, report=None
                              ) -> tuple[Catalog, RecordingWriter, threading.Event, list]:
    """A writer that buffered ``steps`` and handed them to a background write that fails once the returned
    gate opens."""
    catalog = _catalog(1)
    writer = RecordingWriter(directory, directory.name, report=report)
    gate, writes = _gated_segment_writes(monkeypatch, fail=True)
    _buffer_steps(writer, steps)
    writer.flush(catalog, wait=False)
    return catalog, writer, gate, writes


def test_a_flush_without_waiting_writes_on_a_worker_thread_and_the_next_flush_waits_for_it(tmp_path, monkeypatch):
    catalog = _catalog(1)
    writer = RecordingWriter(tmp_path / "t", "t")
    gate, writes = _gated_segment_writes(monkeypatch)
    _buffer_steps(writer, range(3))
    assert writer.flush(catalog, wait=False) is None  # returns while the write waits at the gate
    assert writes and writes[0][0] is not threading.current_thread()
    catalog.add_tensor(TensorInfo(name="later", node="later", role="intermediate", dtype="float32", shape=(2,),
                                  batched=False))  # the training thread goes on changing the catalog
    _buffer_steps(writer, range(3, 5))
    with pytest.raises(RecordingNotFoundError):
        open_recording(tmp_path / "t")  # nothing on disk yet
    threading.Timer(0.2, gate.set).start()
    path = writer.flush(catalog)  # waits for the first write, then writes its own in this thread
    assert [name for _, name in writes] == [segment_name(1, 0), segment_name(2, 0)]
    assert writes[1][0] is threading.current_thread() and path.name == segment_name(2, 0)
    with h5py.File(tmp_path / "t" / segment_name(1, 0), "r") as f:
        assert [t.name for t in Catalog.read(f).tensors] == ["t0"]  # the catalog as it was at that flush
    with open_recording(tmp_path / "t") as rec:
        assert rec.steps.tolist() == [0, 1, 2, 3, 4]
    writer.close(catalog)
    with open_recording(tmp_path / "t") as rec:
        assert rec.summary("t0", stat="max")[1].tolist() == [0, 1, 2, 3, 4]


def test_a_failed_background_write_is_reported_at_once_and_its_steps_are_written_later(tmp_path, monkeypatch):
    reports, report = _reports()
    catalog, writer, gate, writes = _failing_background_write(tmp_path / "t", monkeypatch, range(2), report)
    gate.set()
    writer._job.thread.join()
    assert reports == []
    writer.poll()  # what the recorder calls at every step: the failure is reported now, not a flush later
    [(step, category, subject, message, detail)] = reports
    assert (step, category, subject) == (1, schema.PROBLEM_STORAGE, "segment write")
    assert "No space left on device (ENOSPC)" in message and "their 2 steps are kept in memory" in message
    assert "free space on that disk" in message and detail["errno"] == "ENOSPC" and detail["steps"] == [0, 1]
    assert len(writes) == 1 and sorted(os.listdir(tmp_path / "t")) == [schema.LOCK_NAME]  # no .tmp left behind
    monkeypatch.setattr(writer_module, "write_segment", write_segment)  # the disk has space again
    _buffer_steps(writer, range(2, 4))
    writer.flush(catalog)
    assert sorted(os.listdir(tmp_path / "t")) == [segment_name(1, 0), segment_name(2, 0), schema.LOCK_NAME]
    with open_recording(tmp_path / "t") as rec:
        assert rec.steps.tolist() == [0, 1, 2, 3]
    writer.close(catalog)
    with open_recording(tmp_path / "t") as rec:
        assert [(e.step, e.category) for e in rec.problems()] == [(1, schema.PROBLEM_STORAGE)]


def test_a_flush_that_waits_writes_what_a_failed_background_write_kept(tmp_path, monkeypatch):
    reports, report = _reports()
    catalog, writer, gate, _ = _failing_background_write(tmp_path / "t", monkeypatch, range(2), report)
    monkeypatch.setattr(writer_module, "write_segment", write_segment)  # the disk has space again
    gate.set()
    _buffer_steps(writer, range(2, 3))
    path = writer.flush(catalog)  # e.g. the flush after a trigger: everything must be on disk when it returns
    assert sorted(os.listdir(tmp_path / "t")) == [segment_name(1, 0), segment_name(2, 0), schema.LOCK_NAME]
    assert path.name == segment_name(2, 0) and len(reports) == 1
    with open_recording(tmp_path / "t") as rec:
        assert rec.steps.tolist() == [0, 1, 2]


def test_close_writes_what_a_failed_background_write_kept(tmp_path, monkeypatch):
    catalog, writer, gate, _ = _failing_background_write(tmp_path / "t", monkeypatch, range(2), _reports()[1])
    gate.set()
    monkeypatch.setattr(writer_module, "write_segment", write_segment)
    writer._job.thread.join()  # failed, while the disk came back
    _buffer_steps(writer, range(2, 3))
    writer.close(catalog)
    assert os.listdir(tmp_path / "t") == [schema.FINAL_NAME]
    with open_recording(tmp_path / "t") as rec:
        assert rec.is_complete and rec.steps.tolist() == [0, 1, 2]


def test_rows_that_keep_failing_are_kept_within_a_memory_bound_and_dropped_loudly(tmp_path, monkeypatch):
    """Failed writes keep their rows for later flushes (a full disk may get space back) until they exceed
    ``MAX_UNWRITTEN_BYTES``; the oldest are then dropped, and the report names exactly their steps. The
    rows kept are renumbered, so the dropped sequence does not read as a deleted file later."""
    reports, report = _reports()
    catalog = _catalog(1)
    writer = RecordingWriter(tmp_path / "t", "t", report=report)
    gate, writes = _gated_segment_writes(monkeypatch, fail=True)
    gate.set()
    for step in range(3):
        _buffer_steps(writer, range(step, step + 1))
        writer.flush(catalog)
    assert [r[1] for r in reports] == [schema.PROBLEM_STORAGE] * 3 and len(writer._unwritten) == 3
    monkeypatch.setattr(writer, "MAX_UNWRITTEN_BYTES", 2 * writer._unwritten[-1][1].nbytes)
    _buffer_steps(writer, range(3, 4))
    writer.flush(catalog)
    [(step, _, _, message, detail)] = [r for r in reports if r[1] == schema.PROBLEM_DROPPED_ROWS]
    lost = detail["steps"]
    kept = sorted(int(s) for _, content in writer._unwritten for s in content.step)
    assert lost == list(range(len(lost))) and kept == list(range(len(lost), 4)) and lost  # the oldest go first
    assert sum(c.nbytes for _, c in writer._unwritten) <= writer.MAX_UNWRITTEN_BYTES
    assert f"{len(lost)} recorded steps were lost" in message and step == lost[-1]
    assert [sequence for sequence, _ in writer._unwritten] == list(range(1, len(writer._unwritten) + 1))
    monkeypatch.setattr(writer_module, "write_segment", write_segment)
    writer.close(catalog)
    with open_recording(tmp_path / "t") as rec:  # renumbered: no gap reads as a deleted file
        assert rec.steps.tolist() == kept and rec.is_complete
        logged = [(e.category, e.detail.get("steps")) for e in rec.problems()]
        assert (schema.PROBLEM_DROPPED_ROWS, lost) in logged


# ---- the schema, read with raw h5py -----------------------------------------------------------------------
def _schema_dataset_paths() -> set[str]:
    """Every dataset path named in ``schema.py``: its ``a/b`` constants, the catalog lists and tensor columns."""
    named = {value for key, value in vars(schema).items()
             if key.isupper() and isinstance(value, str) and "/" in value}
    named |= {schema.STEP_TYPES, schema.KPI_NAMES}
    named |= {f"{schema.TENSORS}/{column}" for column in schema.TENSOR_COLUMNS}
    return named | {schema.GRAPH_INDEX}


def _datasets(f: h5py.File) -> set[str]:
    found: set[str] = set()
    f.visititems(lambda name, obj: found.add(name) if isinstance(obj, h5py.Dataset) else None)
    return found


def test_the_writers_file_holds_exactly_the_schema_paths_with_exact_values(tmp_path):
    catalog = Catalog()
    x = catalog.add_tensor(TensorInfo("x", "x", "input", dtype="float32", shape=(2, 3), batched=True))
    w = catalog.add_tensor(TensorInfo("fc.weight", "fc", "parameter", module="fc", dtype="float32", shape=(3,),
                                      bounds=(-1.0, 1.0)))
    sx, sw = catalog.series_id(x, schema.KIND_VALUE), catalog.series_id(w, schema.grad_kind("aux"))
    train, val = catalog.step_type_id("train"), catalog.step_type_id("val")
    loss = catalog.kpi_id("loss")
    catalog.add_module(ModuleInfo("fc", "Linear", 3))
    catalog.add_graph("abc123", json.dumps({"graph": {}, "positions": {}}))
    writer = RecordingWriter(tmp_path / "run", "run", config={"num_samples": 2})
    writer.add_note(-1, "start")
    writer.add_step(0, train, 2, schema.FLAG_SUMMARY | schema.FLAG_SNAPSHOT, "first", when=100.0)
    writer.add_summaries(0, 0, np.array([sx, sw]), np.stack([_row(6, 1.5, -2, 3), _row(3, -1, -1, 0)]))
    writer.add_summaries(0, 1, np.array([sx]), _row(6, 2.5, -4, 5)[None])
    stats = np.arange(2 * schema.NUM_FIELDS, dtype=np.float64).reshape(2, schema.NUM_FIELDS)
    writer.add_snapshot(0, 1, sx, SnapshotData((2, 3), np.array([0, 1]), stats,
                                               np.array([1, 2, np.nan, 4, 5, np.inf], np.float32), None,
                                               np.array(["cat", "dog"], object)))
    writer.add_snapshot(0, 0, sw, SnapshotData((3,), np.zeros(0, np.int64), np.zeros((0, schema.NUM_FIELDS)),
                                               np.array([7, 9], np.float32), np.array([0, 2])))
    writer.add_kpi(0, loss, 0.5, train)
    writer.flush(catalog)
    writer.add_step(5, val, 1, schema.FLAG_SUMMARY, "val", when=101.0)
    writer.add_summaries(5, 0, np.array([sw]), _row(3, 4, 0, 2)[None])
    writer.add_kpi(5, loss, 0.25, val)
    writer.add_trigger(5, "loss spike")
    writer.close(catalog)

    with h5py.File(tmp_path / "run" / schema.FINAL_NAME, "r") as f:
        assert _datasets(f) == _schema_dataset_paths() | {f"{schema.GRAPHS}/abc123"}
        attrs = f.attrs
        assert attrs[schema.ATTR_FORMAT] == "comgra_ndbg.recording"
        assert attrs[schema.ATTR_FORMAT_VERSION] == schema.FORMAT_VERSION == 4
        assert attrs[schema.ATTR_TRIAL] == "run"
        assert attrs[schema.ATTR_SEQUENCE] == 2 and attrs[schema.ATTR_LEVEL] == FINAL_LEVEL
        assert attrs[schema.ATTR_COVERS].tolist() == [1, 2]
        assert bool(attrs[schema.ATTR_COMPLETE]) is True
        assert attrs[schema.ATTR_CREATED] == writer.created
        assert attrs[schema.ATTR_LIBRARY_VERSION] == __version__
        assert json.loads(attrs[schema.ATTR_CONFIG]) == {"num_samples": 2}

        def read(path):
            return f[path][()]

        def text(path):
            return [v.decode() for v in f[path][()]]

        assert text(f"{schema.TENSORS}/name") == ["x", "fc.weight"]
        assert text(f"{schema.TENSORS}/node") == ["x", "fc"]
        assert text(f"{schema.TENSORS}/role") == ["input", "parameter"]
        assert text(f"{schema.TENSORS}/module") == ["", "fc"]
        assert text(f"{schema.TENSORS}/dtype") == ["float32", "float32"]
        assert text(f"{schema.TENSORS}/shape") == ["[2, 3]", "[3]"]
        assert read(f"{schema.TENSORS}/batched").tolist() == [True, False]
        np.testing.assert_array_equal(read(f"{schema.TENSORS}/bounds_low"), [np.nan, -1.0])
        np.testing.assert_array_equal(read(f"{schema.TENSORS}/bounds_high"), [np.nan, 1.0])
        assert read(schema.SERIES_TENSOR).tolist() == [0, 1] and read(schema.SERIES_TENSOR).dtype == np.int32
        assert text(schema.SERIES_KIND) == ["value", "grad:aux"]
        assert text(schema.STEP_TYPES) == ["train", "val"]
        assert text(schema.KPI_NAMES) == ["loss"]
        assert text(schema.MODULE_PATH) == ["fc"] and text(schema.MODULE_CLASS) == ["Linear"]
        assert read(schema.MODULE_PARAMETERS).tolist() == [3]
        assert json.loads(f[f"{schema.GRAPHS}/abc123"][()]) == {"graph": {}, "positions": {}}

        expected = {
            schema.STEPS_STEP: (np.int64, [0, 5]),
            schema.STEPS_TYPE: (np.int32, [train, val]),
            schema.STEPS_ITERATIONS: (np.int32, [2, 1]),
            schema.STEPS_TIME: (np.float64, [100.0, 101.0]),
            schema.STEPS_FLAGS: (np.uint8, [3, 1]),
            schema.SUMMARY_STEP: (np.int64, [0, 0, 5]),
            schema.SUMMARY_ITERATION: (np.int32, [0, 1, 0]),
            schema.SNAP_STEP: (np.int64, [0, 0]),
            schema.SNAP_ITERATION: (np.int32, [1, 0]),
            schema.SNAP_SERIES: (np.int32, [sx, sw]),
            schema.SNAP_SAMPLES_OFFSET: (np.int64, [0, 2]),
            schema.SNAP_SAMPLES_COUNT: (np.int32, [2, 0]),
            schema.SNAP_VALUES_OFFSET: (np.int64, [0, 6]),
            schema.SNAP_VALUES_COUNT: (np.int64, [6, 2]),
            schema.SNAP_SUBSAMPLED: (np.bool_, [False, True]),
            schema.SNAP_INDEX_OFFSET: (np.int64, [-1, 0]),
            schema.SAMPLE_INDEX: (np.int64, [0, 1]),
            schema.VALUE_POOL: (np.float32, [1, 2, np.nan, 4, 5, np.inf, 7, 9]),
            schema.VALUE_INDEX_POOL: (np.int64, [0, 2]),
            schema.KPI_STEP: (np.int64, [0, 5]),
            schema.KPI_ID: (np.int32, [loss, loss]),
            schema.KPI_VALUE: (np.float64, [0.5, 0.25]),
            schema.KPI_STEP_TYPE: (np.int32, [train, val]),
            schema.NOTE_STEP: (np.int64, [-1]),
        }
        for path, (dtype, values) in expected.items():
            assert f[path].dtype == dtype, path
            np.testing.assert_array_equal(read(path), values, err_msg=path)
        assert text(schema.STEPS_REASON) == ["first", "val"]
        assert text(schema.NOTE_TEXT) == ["start"] and f[schema.NOTE_TIME].dtype == np.float64
        assert text(schema.SAMPLE_CATEGORY) == ["cat", "dog"]
        assert read(schema.TRIGGER_STEP).tolist() == [5] and text(schema.TRIGGER_REASON) == ["loss spike"]
        np.testing.assert_array_equal(read(schema.SNAP_SHAPE), [[2, 3] + [-1] * 6, [3] + [-1] * 7])
        np.testing.assert_array_equal(read(schema.SAMPLE_STATS), stats)

        data = read(schema.SUMMARY_DATA)
        assert data.dtype == np.float64 and data.shape == (2, schema.NUM_FIELDS, 3)
        identity = schema.identity_row()
        np.testing.assert_array_equal(data[sx].T, [_row(6, 1.5, -2, 3), _row(6, 2.5, -4, 5), identity])
        np.testing.assert_array_equal(data[sw].T, [_row(3, -1, -1, 0), identity, _row(3, 4, 0, 2)])


def test_stat_fields_layout_is_pinned():
    assert schema.STAT_FIELDS == ("count", "nan", "inf", "zeros", "sum", "sum_sq", "sum_abs", "min", "max",
                                  "units", "dead_units", "bounded", "saturated", "saturated_units",
                                  "spread_count", "spread_sum_sq", "spread_dev_sq")  # version 2 appended three
    assert schema.MIN_FIELDS == (7,) and schema.MAX_FIELDS == (8,)
    assert schema.identity_row().tolist() == [0, 0, 0, 0, 0, 0, 0, np.inf, -np.inf, 0, 0, 0, 0, 0, 0, 0, 0]


# ---- catalog ------------------------------------------------------------------------------------------------
def test_catalog_round_trips_every_table(tmp_path):
    catalog = Catalog()
    tensors = [
        TensorInfo("model.fc.weight", "model.fc", "parameter", module="model.fc", dtype="float32", shape=(4, 3)),
        TensorInfo("h", "h", "intermediate", dtype="bfloat16", shape=(8, 2, 5, 5, 1), batched=True,
                   bounds=(-1.0, 1.0)),
        TensorInfo("λ", "λ", "loss", dtype="float64", shape=(), bounds=(0.0, np.inf)),
    ]
    for info in tensors:
        catalog.add_tensor(info)
    for tid, kind in [(0, "value"), (0, "grad"), (0, "update"), (1, "value"), (1, "grad:aux"), (2, "value")]:
        catalog.series_id(tid, kind)
    for name in ("short", "long"):
        catalog.step_type_id(name)
    for name in ("loss", "accuracy"):
        catalog.kpi_id(name)
    modules = [ModuleInfo("model", "Sequential", 0), ModuleInfo("model.fc", "Linear", 15)]
    for info in modules:
        catalog.add_module(info)
    catalog.add_graph("h2", '{"graph": 2}')
    catalog.add_graph("h1", '{"graph": 1}')
    with h5py.File(tmp_path / "c.h5", "w") as f:
        catalog.write(f)
    with h5py.File(tmp_path / "c.h5", "r") as f:
        back = Catalog.read(f)
    assert back.tensors == tensors
    assert back.tensors[1].bounds == (-1.0, 1.0) and back.tensors[0].bounds is None
    assert back.tensors[2].shape == () and back.tensors[1].shape == (8, 2, 5, 5, 1)
    assert back.series == catalog.series
    assert back.find_series(1, "grad:aux") == 4 and back.find_series(1, "update") is None
    assert back.step_types == ["short", "long"] and back.step_type_id("long") == 1
    assert back.kpi_names == ["loss", "accuracy"] and back.kpi_id("accuracy") == 1
    assert back.modules == modules
    assert back.graphs == {"h1": '{"graph": 1}', "h2": '{"graph": 2}'}
    assert back.tensor_id("λ") == 2
    assert back.tensors[0].label == "weight"


def test_an_empty_catalog_round_trips(tmp_path):
    with h5py.File(tmp_path / "c.h5", "w") as f:
        Catalog().write(f)
    with h5py.File(tmp_path / "c.h5", "r") as f:
        back = Catalog.read(f)
    assert (back.tensors, back.series, back.step_types, back.kpi_names, back.modules, back.graphs) == (
        [], [], [], [], [], {})


def test_a_merge_hands_each_array_to_hdf5_and_lets_go_of_it_so_the_merged_copy_is_not_held_twice(tmp_path,
                                                                                                 monkeypatch):
    seen = []

    def recording_write(path, content, attrs, **options):
        write_segment(path, content, attrs, **options)
        seen.append((Path(path).name, options.get("consume", False), len(content.step), len(content.summary_step)))

    monkeypatch.setattr(writer_module, "write_segment", recording_write)  # flushes
    monkeypatch.setattr(consolidate_module, "write_segment", recording_write)  # merges
    _write_four_steps(tmp_path, flush_after=range(4))
    final = [entry for entry in seen if entry[0] == schema.FINAL_NAME]
    assert final == [(schema.FINAL_NAME, True, 4, 0)]  # written, then emptied but for its step numbers
    flushed = [entry for entry in seen if entry[0].endswith("-L0.h5")]
    assert [(consume, steps) for _, consume, steps, _ in flushed] == [(False, 1)] * 4  # buffers are kept as they are
    assert all(summaries == 0 for _, consume, _, summaries in seen if consume)  # every merge let go of its copy
    with h5py.File(tmp_path / "trial" / schema.FINAL_NAME, "r") as f:  # and every step made it into the file
        assert sorted(f[schema.STEPS_STEP][()].tolist()) == [0, 1, 2, 3]


def test_the_last_write_at_close_lets_go_of_each_array_too(tmp_path, monkeypatch):
    """A run that never flushed is written at ``close()`` straight into the final file, consuming its arrays
    (a failure there is reported lost, not kept for a retry): one copy of the recording less at the peak."""
    seen = []

    def recording_write(path, content, attrs, **options):
        write_segment(path, content, attrs, **options)
        seen.append((Path(path).name, options.get("consume", False), len(content.step), len(content.summary_step)))

    monkeypatch.setattr(writer_module, "write_segment", recording_write)  # flushes
    monkeypatch.setattr(consolidate_module, "write_segment", recording_write)  # merges
    _write_four_steps(tmp_path, flush_after=())
    assert seen == [(schema.FINAL_NAME, True, 4, 0)]
    with h5py.File(tmp_path / "trial" / schema.FINAL_NAME, "r") as f:
        assert sorted(f[schema.STEPS_STEP][()].tolist()) == [0, 1, 2, 3]
        assert len(f[schema.SUMMARY_STEP][()]) == 4

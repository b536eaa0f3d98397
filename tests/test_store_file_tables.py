"""Merges that read their inputs' value pools and summary tables only as they write them: the merged file is
element for element the one the merge of wholly read inputs writes (series added over time, rows of an
older format version, float64 pools among float32 ones, empty tables), a merge holds one slab of those
tables at a time, and an input that is damaged, replaced or gone makes the merge fail without a file and
without touching its inputs."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

import h5py
import numpy as np
import pytest

from comgra_ndbg import Recorder, check, open_recording
from comgra_ndbg.store import consolidate as consolidate_module
from comgra_ndbg.store import schema
from comgra_ndbg.store.catalog import Catalog, TensorInfo
from comgra_ndbg.store.consolidate import merge_files
from comgra_ndbg.store.damage import DamagedData
from comgra_ndbg.store.file_tables import FileSummaries, FileValues
from comgra_ndbg.store.merger import Segment
from comgra_ndbg.store.segment import SegmentContent, concat, read_segment, segment_name, write_segment
from comgra_ndbg.store.value_blocks import BLOCK, READ_SLAB, ValueBlocks
from recording_faults import REPO, chunk_offset, flip_byte, read_everything

OLD_FIELDS = 14  # rows of format versions 1 and 2
DATA = Path(__file__).resolve().parent / "data"


def _catalog(num_series: int) -> Catalog:
    catalog = Catalog()
    for i in range(num_series):
        tid = catalog.add_tensor(TensorInfo(name=f"t{i}", node=f"t{i}", role="intermediate", dtype="float32",
                                            shape=(8,), batched=False))
        catalog.series_id(tid, schema.KIND_VALUE)
    catalog.step_type_id("train")
    catalog.kpi_id("loss")
    return catalog


def _attrs(sequence: int, covers: tuple[int, ...], level: int, *, complete: bool = False,
           parts: tuple[int, ...] = ()) -> dict:
    return {schema.ATTR_FORMAT: schema.FORMAT_NAME, schema.ATTR_FORMAT_VERSION: schema.FORMAT_VERSION,
            schema.ATTR_TRIAL: "t", schema.ATTR_SEQUENCE: sequence, schema.ATTR_COVERS: np.array(covers, np.int64),
            schema.ATTR_LEVEL: level, schema.ATTR_COMPLETE: complete, schema.ATTR_CREATED: 1.0,
            schema.ATTR_LIBRARY_VERSION: "test", schema.ATTR_CONFIG: "{}", schema.ATTR_RECORDING_ID: "r"} | (
        {schema.ATTR_PARTS: np.array(parts, np.int64)} if parts else {})


def _content(first: int, steps: int, *, series: int, fields: int = schema.NUM_FIELDS, values: int = 0,
             dtype: type = np.float32, summaries: bool = True, seed: int = 0) -> SegmentContent:
    """``steps`` steps from ``first``: summaries of ``series`` series with ``fields`` fields, one snapshot of
    ``values`` element values (of ``dtype``) with two samples, a KPI per step."""
    rng = np.random.default_rng(seed)
    content = SegmentContent(catalog=_catalog(series))
    content.step = np.arange(first, first + steps, dtype=np.int64)
    content.step_type = np.zeros(steps, np.int32)
    content.step_iterations = np.ones(steps, np.int32)
    content.step_time = np.arange(steps, dtype=np.float64)
    content.step_flags = np.zeros(steps, np.uint8)
    content.step_reason = np.array([f"r{first}"] * steps, object)
    content.kpi_step, content.kpi_id = content.step.copy(), np.zeros(steps, np.int32)
    content.kpi_value, content.kpi_type = rng.standard_normal(steps), np.zeros(steps, np.int32)
    if summaries:
        content.summary_step = content.step.copy()
        content.summary_iteration = np.zeros(steps, np.int32)
        content.summary_data = rng.standard_normal((series, fields, steps))
        content.summary_data[:, :, 0] = np.nan  # NaN must come through as NaN
    if values:
        content.snap_step = np.array([first], np.int64)
        content.snap_iteration = np.zeros(1, np.int32)
        content.snap_series = np.zeros(1, np.int32)
        content.snap_shape = np.array([[values] + [-1] * (schema.MAX_RANK - 1)], np.int64)
        content.snap_samples_offset = np.zeros(1, np.int64)
        content.snap_samples_count = np.full(1, 2, np.int32)
        content.snap_values_offset = np.zeros(1, np.int64)
        content.snap_values_count = np.array([values], np.int64)
        content.snap_subsampled = np.zeros(1, np.bool_)
        content.snap_index_offset = np.full(1, -1, np.int64)
        content.sample_index = np.arange(2, dtype=np.int64)
        content.sample_stats = rng.standard_normal((2, fields))
        content.sample_category = np.array(["", ""], object)
        content.values = rng.standard_normal(values).astype(dtype)
        if dtype == np.float64:
            content.values[-1] = 1e300  # inf in float32
    return content


def _write(folder: Path, contents: list[SegmentContent]) -> list[Segment]:
    segments = []
    for sequence, content in enumerate(contents, start=1):
        path = folder / segment_name(sequence, 0)
        write_segment(path, content, _attrs(sequence, (sequence,), 0))
        segments.append(Segment(sequence, path))
    return segments


def _in_memory_merge(inputs: list[Segment], out: Path) -> None:
    """The merge of wholly read inputs (``read_segment`` without ``lazy``), as the reference."""
    parts = []
    for segment in inputs:
        with h5py.File(segment.path, "r") as f:
            parts.append(read_segment(f))
    sequence = max(s.sequence for s in inputs)
    write_segment(out, concat(parts), _attrs(sequence, tuple(s.sequence for s in inputs), 1))


def _datasets(path: Path) -> dict:
    """Every dataset of a file: its values, dtype, shape, chunks and filters."""
    out = {}

    def visit(name: str, item: object) -> None:
        if isinstance(item, h5py.Dataset):
            out[name] = (item[()], item.dtype, item.shape, item.chunks, item.compression, item.fletcher32,
                         item.shuffle, dict(item.attrs))
    with h5py.File(path, "r") as f:
        f.visititems(visit)
        out["/attrs"] = {key: np.asarray(value).tolist() for key, value in f.attrs.items()}
    return out


def _assert_same_files(got: Path, want: Path) -> None:
    a, b = _datasets(got), _datasets(want)
    assert a.keys() == b.keys()
    assert a.pop("/attrs") == b.pop("/attrs")
    for name in a:
        (x, *x_layout), (y, *y_layout) = a[name], b[name]
        assert [str(v) for v in x_layout] == [str(v) for v in y_layout], name
        assert np.array_equal(x, y, equal_nan=np.asarray(x).dtype.kind == "f"), name


def _mixed_inputs(folder: Path) -> list[Segment]:
    return _write(folder, [
        _content(0, 5, series=2, fields=OLD_FIELDS, values=BLOCK + 1000, seed=1),  # an older version's rows
        _content(5, 5, series=2, seed=2),  # no snapshot: empty pools
        _content(10, 5, series=3, values=2 * BLOCK - 1000, dtype=np.float64, seed=3),  # a series more, float64
        _content(15, 5, series=3, summaries=False, seed=4),  # KPIs only: no summary rows
        _content(20, 5, series=3, values=123, seed=5),
    ])


def test_a_merge_of_files_writes_what_the_merge_of_wholly_read_inputs_writes(tmp_path: Path) -> None:
    inputs = _mixed_inputs(tmp_path)
    reference = tmp_path / "reference.h5"
    _in_memory_merge(inputs, reference)
    merged = merge_files(tmp_path, inputs, 1, _attrs)
    assert not any(segment.path.exists() for segment in inputs)
    _assert_same_files(merged.path, reference)
    with h5py.File(merged.path, "r") as f:
        data, pool = f[schema.SUMMARY_DATA][()], f[schema.VALUE_POOL]
        assert data.shape == (3, schema.NUM_FIELDS, 20) and pool.dtype == np.float64 and pool[-124] == 1e300
        identity = schema.identity_row()
        assert (data[2, :, :10] == identity[:, None]).all()  # a series the first files lack: the merge identity
        assert (data[:2, OLD_FIELDS:, :5] == identity[OLD_FIELDS:, None]).all()  # fields the old rows lack


def test_a_merge_with_the_files_of_format_version_2_writes_what_the_merge_of_wholly_read_inputs_writes(
        tmp_path: Path) -> None:
    for path in sorted((DATA / "format_v2" / "killed").glob("seg-*.h5")):
        shutil.copy(path, tmp_path / path.name)
    with h5py.File(tmp_path / segment_name(2, 0), "r") as f:
        catalog = Catalog.read(f)
        old_series = len(catalog.series)
    tid = catalog.add_tensor(TensorInfo(name="new", node="new", role="intermediate", dtype="float32", shape=(8,),
                                        batched=False))
    catalog.series_id(tid, schema.KIND_VALUE)
    content = _content(6, 3, series=old_series + 1, values=10)
    content.catalog = catalog
    write_segment(tmp_path / segment_name(3, 0), content, _attrs(3, (3,), 0))
    inputs = [Segment(s, tmp_path / segment_name(s, 0)) for s in (1, 2, 3)]
    _in_memory_merge(inputs, tmp_path / "reference.h5")
    merged = merge_files(tmp_path, inputs, 1, _attrs)
    _assert_same_files(merged.path, tmp_path / "reference.h5")
    with h5py.File(merged.path, "r") as f:
        assert f[schema.SUMMARY_DATA].shape[:2] == (old_series + 1, schema.NUM_FIELDS)


def test_the_value_pools_are_read_block_by_block_into_one_buffer_and_widen_as_value_blocks_do(tmp_path: Path) -> None:
    inputs = _write(tmp_path, [_content(0, 2, series=1, values=BLOCK + 7, seed=1),
                               _content(2, 2, series=1, values=5, seed=2),
                               _content(4, 2, series=1, values=BLOCK, dtype=np.float64, seed=3)])
    parts, arrays = [], []
    for segment in inputs:
        with h5py.File(segment.path, "r") as f:
            parts.append(read_segment(f, lazy=True))
            arrays.append(read_segment(f).values)
    merged = concat(parts)
    assert isinstance(merged.values, FileValues) and isinstance(merged.summary_data, FileSummaries)
    slabs = [(slab, slab.copy()) for slab in merged.values.slabs()]
    assert [len(copy) for _, copy in slabs] == [READ_SLAB] * (2 * BLOCK // READ_SLAB) + [12]
    assert len({slab.__array_interface__["data"][0] for slab, _ in slabs}) == 1  # one block, filled again
    np.testing.assert_array_equal(np.concatenate([copy for _, copy in slabs]), np.concatenate(arrays))
    blocks = ValueBlocks()
    for array in arrays:
        blocks.append(array)
    assert merged.values.dtype == blocks.dtype == np.float64
    assert FileValues.joined(parts[:2]).dtype == np.float32  # float32 while no pool is float64


def test_a_merge_holds_one_slab_of_the_summary_tables_not_the_tables(tmp_path: Path) -> None:
    """Eight files of 2 MiB of summary rows each: a merge that read them would hold 16 MiB or more."""
    inputs = _write(tmp_path, [_content(100 * i, 100, series=160, seed=i) for i in range(8)])
    tracemalloc.start()
    try:
        merge_files(tmp_path, inputs, 1, _attrs)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < FileSummaries.SLAB_BYTES + 3 * 2**20, peak


@pytest.mark.parametrize("dataset", [schema.VALUE_POOL, schema.SUMMARY_DATA])
def test_a_merge_of_an_input_with_a_damaged_chunk_fails_with_no_file_and_the_inputs_kept(
        tmp_path: Path, dataset: str) -> None:
    inputs = _mixed_inputs(tmp_path)
    victim = inputs[2].path
    flip_byte(victim, chunk_offset(victim, dataset) + 100)
    names = sorted(p.name for p in tmp_path.iterdir())
    fds = len(os.listdir("/proc/self/fd")) if sys.platform.startswith("linux") else None
    with pytest.raises(DamagedData) as raised:
        merge_files(tmp_path, inputs, 1, _attrs)
    assert raised.value.file == victim and raised.value.dataset == dataset and "chunk" in raised.value.reason
    assert sorted(p.name for p in tmp_path.iterdir()) == names  # no merged file, no temporary one
    assert fds is None or len(os.listdir("/proc/self/fd")) == fds


def test_an_input_replaced_after_it_was_read_fails_the_merge_and_stays(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    inputs = _mixed_inputs(tmp_path)
    victim = inputs[2].path
    real_concat = consolidate_module.concat

    def concat_then_replace(parts: list[SegmentContent]) -> SegmentContent:
        merged = real_concat(parts)
        shutil.copy(victim, tmp_path / "copy")
        os.replace(tmp_path / "copy", victim)  # the same bytes, but another file
        return merged

    monkeypatch.setattr(consolidate_module, "concat", concat_then_replace)
    names = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(DamagedData, match="changed since the merge read it") as raised:
        merge_files(tmp_path, inputs, 1, _attrs)
    assert raised.value.file == victim
    assert sorted(p.name for p in tmp_path.iterdir()) == names


def test_an_input_removed_after_it_was_read_fails_the_merge(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inputs = _mixed_inputs(tmp_path)
    real_concat = consolidate_module.concat

    def concat_then_remove(parts: list[SegmentContent]) -> SegmentContent:
        merged = real_concat(parts)
        inputs[0].path.unlink()
        return merged

    monkeypatch.setattr(consolidate_module, "concat", concat_then_remove)
    with pytest.raises(FileNotFoundError):
        merge_files(tmp_path, inputs, 1, _attrs)
    assert sorted(p.name for p in tmp_path.iterdir()) == [s.path.name for s in inputs[1:]]


_KILLED_IN_A_MERGE = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    sys.path.insert(0, os.path.join({repo!r}, "tests"))
    from comgra_ndbg.store import file_tables
    from recording_faults import record

    real, reads = file_tables.FileTable.read_into, []

    def read_then_die(self, *args):
        real(self, *args)
        reads.append(self.name)
        if len(reads) == 3:  # the merged file is part written, its inputs part read
            os.kill(os.getpid(), signal.SIGKILL)

    file_tables.FileTable.read_into = read_then_die
    record(Path({folder!r}), steps=40, fanout=4)
    raise SystemExit("no merge read three slabs")
""")


def test_a_kill_in_the_middle_of_a_merge_leaves_every_flushed_step_and_the_next_writer_cleans_up(
        tmp_path: Path) -> None:
    code = _KILLED_IN_A_MERGE.format(repo=str(REPO), folder=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, timeout=120, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    trial = tmp_path / "t"
    temporary = [p.name for p in trial.iterdir() if p.name.endswith(schema.TEMP_SUFFIX)]
    assert any(name.endswith("-L1.h5" + schema.TEMP_SUFFIX) for name in temporary)  # killed building a merge
    before = read_everything(tmp_path)
    assert before["steps"] == list(range(len(before["steps"]))) and len(before["steps"]) >= 16  # 4 flushes
    assert check(tmp_path).ok
    Recorder(tmp_path, "t", mode="a").close()  # continued with nothing new: cleaned up and consolidated
    assert sorted(p.name for p in trial.iterdir()) == [schema.FINAL_NAME]
    with open_recording(tmp_path) as recording:
        assert recording.is_complete
    after = read_everything(tmp_path)
    assert {**after, "log": None} == {**before, "log": None}

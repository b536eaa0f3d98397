"""Buffered summary rows: copied into blocks as they arrive and made into the segment's dense table slab by
slab as it is written; the table equals the one built whole from the same rows (the merge identity where a
series has no row, the last of two rows for the same cell), and the file written from it equals the file
written from that array."""
from __future__ import annotations

import h5py
import numpy as np
import pytest

from comgra_ndbg import open_recording
from comgra_ndbg.store import schema
from comgra_ndbg.store.catalog import Catalog, TensorInfo
from comgra_ndbg.store.segment import SegmentContent, write_segment
from comgra_ndbg.store.summary_table import SummaryTable
from comgra_ndbg.store.writer import RecordingWriter


def _rows(rng: np.random.Generator, num_series: int, steps: int) -> list[tuple[int, int, np.ndarray, np.ndarray]]:
    """Sparse rows as the recorder hands them over: some series at each (step, iteration), steps out of order
    once, a step with two iterations, and a cell given twice (the later row wins)."""
    out = []
    for step in list(range(steps // 2, steps)) + list(range(steps // 2)):
        for iteration in (0, 1) if step == 3 else (0,):
            series = np.sort(rng.choice(num_series, size=int(rng.integers(1, num_series)), replace=False))
            out.append((step, iteration, series, rng.standard_normal((len(series), schema.NUM_FIELDS))))
    out.append((5, 0, np.array([0]), np.full((1, schema.NUM_FIELDS), 42.0)))  # step 5, series 0 again
    return out


def _dense(rows: list[tuple[int, int, np.ndarray, np.ndarray]], num_series: int) -> tuple[np.ndarray, list]:
    """The table built whole, as the writer built it before."""
    keys = sorted({(s, it) for s, it, _, _ in rows})
    position = {k: i for i, k in enumerate(keys)}
    data = np.zeros((num_series, schema.NUM_FIELDS, len(keys)))
    data[:] = schema.identity_row()[None, :, None]
    for s, it, series, fields in rows:
        data[series, :, position[(s, it)]] = fields
    return data, keys


@pytest.mark.parametrize("block_rows, slab_bytes", [(4096, 1 << 18), (7, 1), (50, 3000)])
def test_the_table_made_slab_by_slab_equals_the_table_built_whole(monkeypatch: pytest.MonkeyPatch, block_rows: int,
                                                                   slab_bytes: int) -> None:
    monkeypatch.setattr(SummaryTable, "BLOCK_ROWS", block_rows)  # rows across many blocks
    monkeypatch.setattr(SummaryTable, "SLAB_BYTES", slab_bytes)  # one series a slab, a few, all
    rng = np.random.default_rng(0)
    rows = _rows(rng, num_series=9, steps=40)
    table = SummaryTable()
    for step, iteration, series, fields in rows:
        table.add(step, iteration, series, fields.copy())
    steps, iterations = table.finish(num_series=11)  # two series of the catalog have no row at all
    want, keys = _dense(rows, 11)
    assert list(zip(steps.tolist(), iterations.tolist())) == keys and len(table) == sum(len(r[2]) for r in rows)
    slabs = [slab.copy() for slab in table.slabs()]
    assert table.shape == want.shape and table.nbytes == want.nbytes
    np.testing.assert_array_equal(np.concatenate(slabs), want)
    assert want[0, 0, keys.index((5, 0))] == 42.0


def test_rows_are_copied_as_they_arrive_and_let_go_of_once_written() -> None:
    table = SummaryTable()
    given = np.ones((2, schema.NUM_FIELDS))
    table.add(0, 0, np.array([0, 1]), given)
    given[:] = -1  # the caller reuses its array: nothing recorded changes
    table.finish(num_series=2)
    assert np.asarray(table)[:, 0, 0].tolist() == [1.0, 1.0]
    list(table.slabs(consume=True))
    assert table._blocks == []


def test_a_segment_written_from_the_rows_equals_one_written_from_the_whole_table(tmp_path) -> None:
    rows = _rows(np.random.default_rng(1), num_series=6, steps=30)
    table = SummaryTable()
    for step, iteration, series, fields in rows:
        table.add(step, iteration, series, fields)
    steps, iterations = table.finish(num_series=6)
    catalog = Catalog()
    for i in range(6):
        catalog.series_id(catalog.add_tensor(TensorInfo(name=f"t{i}", node=f"t{i}", role="intermediate",
                                                        dtype="float32", shape=(4,), batched=False)), schema.KIND_VALUE)
    attrs = {schema.ATTR_FORMAT: schema.FORMAT_NAME, schema.ATTR_FORMAT_VERSION: schema.FORMAT_VERSION}
    whole = SegmentContent(catalog=catalog, summary_step=steps, summary_iteration=iterations,
                           summary_data=_dense(rows, 6)[0])
    write_segment(tmp_path / "whole.h5", whole, attrs)
    write_segment(tmp_path / "rows.h5", SegmentContent(catalog=catalog, summary_step=steps,
                                                      summary_iteration=iterations, summary_data=table), attrs,
                  consume=True)
    with h5py.File(tmp_path / "rows.h5", "r") as a, h5py.File(tmp_path / "whole.h5", "r") as b:
        x, y = a[schema.SUMMARY_DATA], b[schema.SUMMARY_DATA]
        assert (x.shape, x.dtype, x.chunks, x.compression, x.shuffle, x.fletcher32) == \
               (y.shape, y.dtype, y.chunks, y.compression, y.shuffle, y.fletcher32)
        np.testing.assert_array_equal(x[()], y[()])


def test_the_writer_records_summaries_through_the_table(tmp_path) -> None:
    catalog = Catalog()
    for i in range(3):
        catalog.series_id(catalog.add_tensor(TensorInfo(name=f"t{i}", node=f"t{i}", role="intermediate",
                                                        dtype="float32", shape=(4,), batched=False)), schema.KIND_VALUE)
    catalog.step_type_id("train")
    writer = RecordingWriter(tmp_path / "trial", "trial")
    for step in range(5):
        writer.add_step(step, 0, 1, 0, "")
        row = schema.identity_row()
        row[[schema.FIELD["count"], schema.FIELD["sum"], schema.FIELD["min"], schema.FIELD["max"]]] = (
            1, step, step, step)
        writer.add_summaries(step, 0, np.array([step % 3]), row[None])
        if step == 2:
            writer.flush(catalog)
    writer.close(catalog)
    with open_recording(tmp_path / "trial") as recording:
        for i in range(3):
            steps, means = recording.summary(f"t{i}", stat="mean")
            assert steps.tolist() == [s for s in range(5) if s % 3 == i] and means.tolist() == steps.tolist()


def test_of_rows_given_for_the_same_cell_the_last_one_is_kept() -> None:
    table = SummaryTable()
    rng = np.random.default_rng(2)
    last = {}
    for i in range(300):  # many rows of few series at one step, in a random order of series
        series = rng.permutation(4)[:2]
        table.add(0, 0, series, np.full((2, schema.NUM_FIELDS), float(i)))
        last.update({int(s): float(i) for s in series})
    table.finish(num_series=4)
    assert np.asarray(table)[:, 0, 0].tolist() == [last[s] for s in range(4)]

"""Buffered snapshot values: copied into blocks of their own memory as they arrive, written to the file's value
pool block by block and let go of as they are written, read back as they were given."""
from __future__ import annotations

import gc
import mmap
import resource
import sys
import weakref

import h5py
import numpy as np
import pytest

from comgra_ndbg import open_recording
from comgra_ndbg.store import schema
from comgra_ndbg.store.catalog import Catalog, TensorInfo
from comgra_ndbg.store.segment import SegmentContent, SnapshotData, read_segment, write_segment
from comgra_ndbg.store.value_blocks import BLOCK, ValueBlocks
from comgra_ndbg.store.writer import RecordingWriter

NO_STATS = np.zeros((0, schema.NUM_FIELDS))


def _snapshot(values: np.ndarray) -> SnapshotData:
    return SnapshotData((len(values),), np.zeros(0, np.int64), NO_STATS, values, None)


def _catalog() -> Catalog:
    catalog = Catalog()
    tid = catalog.add_tensor(TensorInfo(name="t", node="t", role="intermediate", dtype="float32",
                                        shape=(BLOCK,), batched=False))
    catalog.series_id(tid, schema.KIND_VALUE)
    catalog.step_type_id("train")
    return catalog


def _parts(rng: np.random.Generator) -> list[np.ndarray]:
    """Snapshots that fill a block exactly, cross block boundaries, and are empty."""
    sizes = [BLOCK - 5, 5, 3, 2 * BLOCK + 1, 0, 7]
    return [rng.standard_normal(n).astype(np.float32) for n in sizes]


def test_values_come_back_in_order_across_block_boundaries():
    parts = _parts(np.random.default_rng(0))
    blocks = ValueBlocks()
    for part in parts:
        blocks.append(part)
    want = np.concatenate(parts)
    assert len(blocks) == len(want) and blocks.nbytes == want.nbytes and blocks.dtype == np.float32
    slabs = list(blocks.slabs())
    assert [len(s) for s in slabs] == [BLOCK, BLOCK, BLOCK, len(want) - 3 * BLOCK]
    np.testing.assert_array_equal(np.concatenate(slabs), want)
    np.testing.assert_array_equal(np.asarray(blocks), want)  # not consumed: read again


def test_a_float64_snapshot_widens_the_values_held_before_it():
    blocks = ValueBlocks()
    blocks.append(np.array([1.5, 2.5], np.float32))
    blocks.append(np.array([1e300, -1e-300]))
    blocks.append(np.array([3.0], np.float32))
    assert blocks.dtype == np.float64
    assert np.asarray(blocks).tolist() == [1.5, 2.5, 1e300, -1e-300, 3.0]


def test_consuming_lets_go_of_each_block_once_the_next_is_taken():
    blocks = ValueBlocks()
    blocks.append(np.ones(3 * BLOCK, np.float32))
    held = [weakref.ref(block) for block in blocks._blocks]
    alive_while_written = []
    for slab in blocks.slabs(consume=True):
        gc.collect()
        alive_while_written.append(sum(ref() is not None for ref in held))
        del slab
    gc.collect()
    assert alive_while_written == [3, 2, 1]  # the written blocks are gone, the block being written is kept
    assert all(ref() is None for ref in held) and len(blocks) == 0


def test_the_writer_keeps_no_reference_to_the_values_it_was_given(tmp_path):
    writer = RecordingWriter(tmp_path / "trial", "trial")
    values = np.arange(10, dtype=np.float32)
    alive = weakref.ref(values)
    writer.add_step(0, 0, 1, schema.FLAG_SNAPSHOT, "")
    writer.add_snapshot(0, 0, 0, _snapshot(values))
    values[:] = -1  # what was given is copied: changing it afterwards changes nothing recorded
    del values
    gc.collect()
    assert alive() is None
    writer.close(_catalog())
    with open_recording(tmp_path / "trial") as rec:
        assert rec.snapshot(0, "t", "value").values.tolist() == list(range(10))


def test_a_segment_written_from_blocks_matches_one_written_from_the_whole_array(tmp_path):
    parts = _parts(np.random.default_rng(1))
    blocks = ValueBlocks()
    for part in parts:
        blocks.append(part)
    attrs = {schema.ATTR_FORMAT: schema.FORMAT_NAME, schema.ATTR_FORMAT_VERSION: schema.FORMAT_VERSION}
    write_segment(tmp_path / "blocks.h5", SegmentContent(catalog=_catalog(), values=blocks), attrs, consume=True)
    write_segment(tmp_path / "array.h5", SegmentContent(catalog=_catalog(), values=np.concatenate(parts)), attrs)
    assert len(blocks) == 0
    with h5py.File(tmp_path / "blocks.h5", "r") as a, h5py.File(tmp_path / "array.h5", "r") as b:
        x, y = a[schema.VALUE_POOL], b[schema.VALUE_POOL]
        assert (x.shape, x.dtype, x.chunks, x.fletcher32, x.compression) == \
               (y.shape, y.dtype, y.chunks, y.fletcher32, y.compression)
        np.testing.assert_array_equal(read_segment(a).values, np.concatenate(parts))
        np.testing.assert_array_equal(read_segment(b).values, np.concatenate(parts))


def test_a_written_segment_hands_its_blocks_to_the_steps_after_it_and_close_lets_them_go(tmp_path):
    writer = RecordingWriter(tmp_path / "trial", "trial")
    writer.add_step(0, 0, 1, schema.FLAG_SNAPSHOT, "")
    writer.add_snapshot(0, 0, 0, _snapshot(np.arange(10, dtype=np.float32)))
    block = weakref.ref(writer._buffers.values._blocks[0])
    writer.flush(_catalog())
    writer.add_step(1, 0, 1, schema.FLAG_SNAPSHOT, "")
    writer.add_snapshot(1, 0, 0, _snapshot(np.full(4, 7.0, np.float32)))
    assert writer._buffers.values._blocks[0] is block()  # filled again: no new memory, no page faults
    writer.flush(_catalog(), wait=False)
    writer.close(_catalog())
    gc.collect()
    assert block() is None
    with open_recording(tmp_path / "trial") as rec:
        assert rec.snapshot(0, "t", "value").values.tolist() == list(range(10))
        assert rec.snapshot(1, "t", "value").values.tolist() == [7.0] * 4


@pytest.mark.skipif(not (sys.platform.startswith("linux") and hasattr(mmap, "MAP_POPULATE")
                         and hasattr(resource, "RUSAGE_THREAD")), reason="MAP_POPULATE is Linux's")
def test_a_new_block_takes_no_page_fault_as_its_values_arrive():
    """The block's pages are mapped in the call that makes it, not one page fault per page as values arrive
    (a 1 MiB block has 256 pages of 4 kB)."""
    blocks = ValueBlocks()
    blocks.append(np.zeros(1, np.float32))
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    blocks.append(np.ones(BLOCK - 1, np.float32))
    faults = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before
    assert len(blocks._blocks) == 1 and faults < 32

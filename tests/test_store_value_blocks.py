"""Buffered snapshot values: copied into blocks of their own memory as they arrive, full blocks waiting in a
nameless scratch file in the recording's folder (or in memory where it cannot be written), written to the
file's value pool block by block and let go of as they are written, read back as they were given."""
from __future__ import annotations

import errno
import gc
import mmap
import os
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
from comgra_ndbg.store.value_blocks import BLOCK, READ_SLAB, ValueBlocks
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
    held = [weakref.ref(block) for block in blocks._full]  # no folder for a scratch file: in memory
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
    block = weakref.ref(writer._buffers.values._block)
    writer.flush(_catalog())
    writer.add_step(1, 0, 1, schema.FLAG_SNAPSHOT, "")
    writer.add_snapshot(1, 0, 0, _snapshot(np.full(4, 7.0, np.float32)))
    assert writer._buffers.values._block is block()  # filled again: no new memory, no page faults
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
    values = np.ones(BLOCK - 1, np.float32)  # made before counting: a fresh 1 MiB array takes its own faults
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    blocks.append(values)
    faults = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before
    assert len(blocks._full) == 1 and blocks._block is None and faults < 32


# ---- full blocks in the scratch file -----------------------------------------------------------------------
def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _filled(blocks: ValueBlocks, parts: list[np.ndarray]) -> np.ndarray:
    for part in parts:
        blocks.append(part)
    return np.concatenate(parts)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts file descriptors in /proc")
def test_full_blocks_wait_in_a_nameless_scratch_file_and_memory_holds_one_block(tmp_path):
    fds = _open_fds()
    blocks = ValueBlocks(directory=tmp_path)
    want = _filled(blocks, _parts(np.random.default_rng(3)))  # 3 full blocks and a part of one
    assert blocks.spilled == 3 and all(not isinstance(entry, np.ndarray) for entry in blocks._full)
    assert blocks._block is not None and os.listdir(tmp_path) == [] and _open_fds() == fds + 1
    np.testing.assert_array_equal(np.asarray(blocks), want)  # read back, not consumed: read again below
    slabs = [slab.copy() for slab in blocks.slabs(consume=True)]
    assert [len(s) for s in slabs] == [READ_SLAB] * (3 * BLOCK // READ_SLAB) + [len(want) - 3 * BLOCK]
    np.testing.assert_array_equal(np.concatenate(slabs), want)
    assert len(blocks) == 0 and blocks._scratch is None and _open_fds() == fds  # the file is gone with the values


def test_spilled_float32_blocks_come_back_widened_when_a_float64_snapshot_follows(tmp_path):
    blocks = ValueBlocks(directory=tmp_path)
    first = _filled(blocks, [np.random.default_rng(4).standard_normal(2 * BLOCK + 3).astype(np.float32)])
    blocks.append(np.array([1e300, -1e-300]))
    assert blocks.spilled == 2 and blocks.dtype == np.float64
    values = np.asarray(blocks)
    assert values.dtype == np.float64 and values[-2:].tolist() == [1e300, -1e-300]
    np.testing.assert_array_equal(values[:-2], first.astype(np.float64))


def test_a_full_disk_keeps_the_blocks_in_memory_in_their_place_and_loses_nothing(tmp_path, monkeypatch):
    real = os.pwrite
    full = {"on": False}

    def pwrite(fd: int, data: object, offset: int) -> int:
        if full["on"]:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)
    rng = np.random.default_rng(5)
    blocks = ValueBlocks(directory=tmp_path)
    parts = [rng.standard_normal(BLOCK).astype(np.float32)]
    _filled(blocks, parts)
    full["on"] = True  # the next two blocks find no room: they stay in memory
    parts += [rng.standard_normal(2 * BLOCK).astype(np.float32)]
    blocks.append(parts[-1])
    full["on"] = False  # room again: the blocks after them go to the scratch file
    parts += [rng.standard_normal(BLOCK + 9).astype(np.float32)]
    blocks.append(parts[-1])
    kinds = [isinstance(entry, np.ndarray) for entry in blocks._full]
    assert kinds == [False, True, True, False]
    np.testing.assert_array_equal(np.concatenate([s.copy() for s in blocks.slabs(consume=True)]), np.concatenate(parts))


def test_without_a_folder_for_the_scratch_file_the_blocks_stay_in_memory(tmp_path):
    blocks = ValueBlocks(directory=tmp_path / "gone")
    want = _filled(blocks, _parts(np.random.default_rng(6)))
    assert blocks.spilled == 0 and len(blocks._full) == 3
    np.testing.assert_array_equal(np.asarray(blocks), want)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs POSIX fork")
def test_a_forked_child_never_writes_into_its_parents_scratch_file(tmp_path):
    """The child appends after the parent has: had it written to the file they share, at the offsets it
    inherited, the parent would read the child's values back as its own."""
    rng = np.random.default_rng(7)
    blocks = ValueBlocks(directory=tmp_path)
    parent = [rng.standard_normal(2 * BLOCK).astype(np.float32)]
    _filled(blocks, parent)
    go, done = os.pipe(), os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: waits for the parent's next blocks, then appends blocks of its own
        os.read(go[0], 1)
        code = 1
        try:
            blocks.append(np.full(2 * BLOCK, -7.0, np.float32))
            code = 0 if blocks.spilled == 2 and np.asarray(blocks)[-1] == -7.0 else 2
        finally:
            os.write(done[1], b"x")
            os._exit(code)
    parent.append(rng.standard_normal(2 * BLOCK).astype(np.float32))
    blocks.append(parent[-1])  # spilled at the offsets the child would write to
    os.write(go[1], b"x")
    os.read(done[0], 1)
    assert os.waitpid(pid, 0)[1] == 0  # the child kept its own blocks in memory
    assert blocks.spilled == 4
    np.testing.assert_array_equal(np.asarray(blocks), np.concatenate(parent))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts file descriptors in /proc")
def test_a_recordings_values_wait_in_scratch_files_that_leave_no_trace(tmp_path):
    fds = _open_fds()
    writer = RecordingWriter(tmp_path / "trial", "trial")
    rng = np.random.default_rng(8)
    given = []
    for step in range(6):
        writer.add_step(step, 0, 1, schema.FLAG_SNAPSHOT, "")
        given.append(rng.standard_normal(BLOCK // 2 + step).astype(np.float32))
        writer.add_snapshot(step, 0, 0, _snapshot(given[-1]))
        if step == 2:
            assert writer._buffers.values.spilled == 1
            writer.flush(_catalog(), wait=False)  # written while the next steps fill a scratch file of their own
    assert writer._buffers.values.spilled == 1
    names = [p.name for p in (tmp_path / "trial").iterdir()]  # segments (one perhaps still .tmp), the lock
    assert [name for name in names if not name.startswith(schema.SEGMENT_PREFIX)] == [schema.LOCK_NAME]
    writer.close(_catalog())
    assert _open_fds() == fds
    with open_recording(tmp_path / "trial") as rec:
        for step, values in enumerate(given):
            np.testing.assert_array_equal(rec.snapshot(step, "t", "value").values, values)

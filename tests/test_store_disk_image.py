"""The file object segment files are built in on disk: it reads, writes, seeks and truncates as the file does;
a write that fails (a full disk) is never seen by HDF5, which finishes its file in memory, and is raised
once HDF5 has closed it; the temporary file is then removed and no file descriptor is left open, whether a
segment is written, merged or promoted to ``recording.h5``."""
from __future__ import annotations

import errno
import io
import os
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from comgra_ndbg.store import schema
from comgra_ndbg.store.catalog import Catalog, TensorInfo
from comgra_ndbg.store.consolidate import merge_files, promote
from comgra_ndbg.store.disk_image import DiskImage
from comgra_ndbg.store.live import FINAL_LEVEL
from comgra_ndbg.store.merger import Segment
from comgra_ndbg.store.paged_image import PAGE
from comgra_ndbg.store.segment import SegmentContent, read_segment, segment_name, write_segment

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts file descriptors in /proc")


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def _full_disk(monkeypatch: pytest.MonkeyPatch, room: int) -> dict:
    """``os.pwrite`` on a disk with ``room`` bytes free: the write that fills it is cut short, every later one
    fails with ENOSPC (as a full disk does). Returns the counter of writes that failed."""
    real, state = os.pwrite, {"room": room, "failed": 0}

    def pwrite(fd: int, data: object, offset: int) -> int:
        if state["room"] <= 0:
            state["failed"] += 1
            raise OSError(errno.ENOSPC, "No space left on device")
        written = real(fd, memoryview(data)[:state["room"]], offset)
        state["room"] -= written
        return written

    monkeypatch.setattr(os, "pwrite", pwrite)
    return state


def _catalog() -> Catalog:
    catalog = Catalog()
    for name in ("a", "b"):
        tid = catalog.add_tensor(TensorInfo(name=name, node=name, role="intermediate", dtype="float32", shape=(8,),
                                            batched=False))
        catalog.series_id(tid, schema.KIND_VALUE)
    catalog.step_type_id("train")
    return catalog


def _attrs(sequence: int, covers: tuple[int, ...], level: int, *, complete: bool = False,
           parts: tuple[int, ...] = ()) -> dict:
    return {schema.ATTR_FORMAT: schema.FORMAT_NAME, schema.ATTR_FORMAT_VERSION: schema.FORMAT_VERSION,
            schema.ATTR_TRIAL: "t", schema.ATTR_SEQUENCE: sequence, schema.ATTR_COVERS: np.array(covers, np.int64),
            schema.ATTR_LEVEL: level, schema.ATTR_COMPLETE: complete, schema.ATTR_CREATED: 1.0,
            schema.ATTR_LIBRARY_VERSION: "test", schema.ATTR_CONFIG: "{}", schema.ATTR_RECORDING_ID: "r"} | (
        {schema.ATTR_PARTS: np.array(parts, np.int64)} if parts else {})


def _content(first: int, steps: int, rng: np.random.Generator) -> SegmentContent:
    """``steps`` steps with summaries of both series and about 1.5 MiB of snapshot values."""
    content = SegmentContent(catalog=_catalog())
    content.step = np.arange(first, first + steps, dtype=np.int64)
    content.step_type = np.zeros(steps, np.int32)
    content.step_iterations = np.ones(steps, np.int32)
    content.step_time = np.arange(steps, dtype=np.float64)
    content.step_flags = np.zeros(steps, np.uint8)
    content.step_reason = np.array(["r"] * steps, object)
    content.summary_step = content.step.copy()
    content.summary_iteration = np.zeros(steps, np.int32)
    content.summary_data = rng.standard_normal((2, schema.NUM_FIELDS, steps))
    content.snap_step = np.array([first], np.int64)
    content.snap_iteration = np.zeros(1, np.int32)
    content.snap_series = np.zeros(1, np.int32)
    content.snap_shape = np.array([[400_000] + [-1] * (schema.MAX_RANK - 1)], np.int64)
    content.snap_samples_offset = np.zeros(1, np.int64)
    content.snap_samples_count = np.zeros(1, np.int32)
    content.snap_values_offset = np.zeros(1, np.int64)
    content.snap_values_count = np.array([400_000], np.int64)
    content.snap_subsampled = np.zeros(1, np.bool_)
    content.snap_index_offset = np.full(1, -1, np.int64)
    content.values = rng.standard_normal(400_000).astype(np.float32)
    return content


def _segments(folder: Path, count: int) -> list[Segment]:
    rng = np.random.default_rng(0)
    segments = []
    for sequence in range(1, count + 1):
        path = folder / segment_name(sequence, 0)
        write_segment(path, _content(10 * sequence, 10, rng), _attrs(sequence, (sequence,), 0))
        segments.append(Segment(sequence, path))
    return segments


def _read(path: Path) -> dict:
    """Every dataset of a file, as arrays."""
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, item: out.__setitem__(name, item[()]) if isinstance(item, h5py.Dataset) else None)
    return out


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k], equal_nan=np.asarray(a[k]).dtype.kind == "f")
                                        for k in a)


def test_every_operation_matches_a_file_on_disk(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    with DiskImage(tmp_path / "image") as image, open(tmp_path / "reference", "w+b") as reference:
        for _ in range(300):
            operation = rng.integers(4)
            if operation == 0:  # a write anywhere, across page boundaries, past the end (a gap of zeros)
                position = int(rng.integers(0, 3 * PAGE))
                data = rng.integers(0, 256, int(rng.integers(1, PAGE // 2)), dtype=np.uint8).tobytes()
                assert image.seek(position) == reference.seek(position)
                assert image.write(data) == reference.write(data)
            elif operation == 1:
                position, size = int(rng.integers(0, 3 * PAGE)), int(rng.integers(-1, PAGE))
                image.seek(position), reference.seek(position)
                assert image.read(size) == reference.read(size)
            elif operation == 2:
                size = int(rng.integers(0, 3 * PAGE))
                assert image.truncate(size) == reference.truncate(size)
            else:
                assert image.seek(0, io.SEEK_END) == reference.seek(0, io.SEEK_END)
            assert image.tell() == reference.tell() and len(image) == os.fstat(reference.fileno()).st_size
        image.check()
        reference.flush()
        assert (tmp_path / "image").read_bytes() == (tmp_path / "reference").read_bytes()


def test_a_failed_write_goes_on_in_memory_so_hdf5_closes_its_file_and_is_raised_after(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    values = np.arange(3 * PAGE // 4, dtype=np.float32)  # a file of about 3 MiB
    state = _full_disk(monkeypatch, room=PAGE + 12345)  # the disk fills in the middle of the values
    with DiskImage(tmp_path / "f.tmp") as image:
        with h5py.File(image, "w") as f:  # HDF5 sees no failure: it writes and closes its file
            f.create_dataset("values", data=values, chunks=(16384,), fletcher32=True)
            f.attrs["name"] = "full"
        assert state["failed"] >= 1 and image.error is not None and image.error.errno == errno.ENOSPC
        with pytest.raises(OSError, match="No space left on device"):
            image.check()
        with pytest.raises(OSError, match="No space left on device"):
            image.sync()
        image.seek(0)
        built = io.BytesIO(image.read())  # the whole file: what reached the disk and the rest, from memory
    with h5py.File(built, "r") as f:  # a complete, valid file: HDF5 was never left half-way
        np.testing.assert_array_equal(f["values"][()], values)
        assert f.attrs["name"] == "full"


def test_a_failed_truncate_goes_on_in_memory_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def ftruncate(fd: int, size: int) -> None:
        raise OSError(errno.EFBIG, "File too large")

    with DiskImage(tmp_path / "f.tmp") as image:
        image.write(b"abcdef")
        monkeypatch.setattr(os, "ftruncate", ftruncate)
        assert image.truncate(2 * PAGE) == 2 * PAGE and len(image) == 2 * PAGE
        image.seek(0)
        assert image.read(7) == b"abcdef\0" and image.error.errno == errno.EFBIG


def test_a_closed_image_refuses_every_operation_and_holds_no_descriptor(tmp_path: Path) -> None:
    before = _open_fds()
    image = DiskImage(tmp_path / "f.tmp")
    assert len(_open_fds() - before) == 1
    image.write(b"abc")
    image.close()
    image.close()  # idempotent
    assert _open_fds() == before and image.closed
    for call in (lambda: image.write(b"x"), lambda: image.read(1), lambda: image.seek(0), image.tell,
                 lambda: image.truncate(0), image.flush, image.sync):
        with pytest.raises(ValueError, match="closed image"):
            call()
    assert (tmp_path / "f.tmp").read_bytes() == b"abc"


@pytest.mark.parametrize("room", [0, 20_000, 3 * PAGE // 2])
def test_a_segment_write_on_a_full_disk_raises_and_leaves_no_file_and_no_descriptor(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, room: int) -> None:
    content = _content(0, 10, np.random.default_rng(0))
    before = _open_fds()
    _full_disk(monkeypatch, room)
    with pytest.raises(OSError) as raised:
        write_segment(tmp_path / "seg.h5", content, _attrs(1, (1,), 0))
    assert raised.value.errno == errno.ENOSPC
    assert list(tmp_path.iterdir()) == [] and _open_fds() == before


def test_a_failed_fsync_raises_and_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fsync(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    before = _open_fds()
    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OSError, match="Input/output error"):
        write_segment(tmp_path / "seg.h5", _content(0, 10, np.random.default_rng(0)), _attrs(1, (1,), 0))
    assert list(tmp_path.iterdir()) == [] and _open_fds() == before


def test_an_error_while_the_file_is_built_removes_it_and_closes_it(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: Catalog, f: h5py.File) -> None:
        raise RuntimeError("catalog cannot be written")

    before = _open_fds()
    monkeypatch.setattr(Catalog, "write", broken)
    with pytest.raises(RuntimeError, match="catalog cannot be written"):
        write_segment(tmp_path / "seg.h5", _content(0, 10, np.random.default_rng(0)), _attrs(1, (1,), 0))
    assert list(tmp_path.iterdir()) == [] and _open_fds() == before


def test_a_merge_on_a_full_disk_raises_and_keeps_its_inputs_as_they_were(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    inputs = _segments(tmp_path, 3)
    before_files = {path: _read(path) for path in sorted(tmp_path.iterdir())}
    before = _open_fds()
    _full_disk(monkeypatch, room=PAGE)
    with pytest.raises(OSError, match="No space left on device"):
        merge_files(tmp_path, inputs, 1, _attrs)
    monkeypatch.undo()
    assert _open_fds() == before
    assert sorted(tmp_path.iterdir()) == list(before_files)  # no merged file, no temporary file
    assert all(_same(_read(path), data) for path, data in before_files.items())
    merged = merge_files(tmp_path, inputs, 1, _attrs)  # space is back: the same merge succeeds
    assert sorted(tmp_path.iterdir()) == [merged.path]
    data = _read(merged.path)
    np.testing.assert_array_equal(data[schema.STEPS_STEP], np.arange(10, 40))
    np.testing.assert_array_equal(data[schema.VALUE_POOL],
                                  np.concatenate([d[schema.VALUE_POOL] for d in before_files.values()]))


def test_a_promotion_on_a_full_disk_raises_and_keeps_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    [segment] = _segments(tmp_path, 1)
    data = _read(segment.path)
    before = _open_fds()
    _full_disk(monkeypatch, room=PAGE // 2)
    with pytest.raises(OSError, match="No space left on device"):
        promote(tmp_path, segment, _attrs)
    monkeypatch.undo()
    assert sorted(tmp_path.iterdir()) == [segment.path] and _same(_read(segment.path), data)
    assert _open_fds() == before
    promote(tmp_path, segment, _attrs)
    final = tmp_path / schema.FINAL_NAME
    assert sorted(tmp_path.iterdir()) == [final] and _same(_read(final), data)
    with h5py.File(final, "r") as f:
        assert bool(f.attrs[schema.ATTR_COMPLETE]) and int(f.attrs[schema.ATTR_LEVEL]) == FINAL_LEVEL
        content = read_segment(f)
    assert content.step.tolist() == list(range(10, 20))


def test_without_positional_io_the_image_seeks_and_reads_and_writes_as_before(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the system has no ``os.pwrite`` / ``os.pread`` (Windows), a seek and a plain write or read."""
    monkeypatch.delattr(os, "pwrite")
    monkeypatch.delattr(os, "pread")
    test_every_operation_matches_a_file_on_disk(tmp_path)
    values = np.arange(PAGE // 2, dtype=np.float32)
    with DiskImage(tmp_path / "f.tmp") as image:
        with h5py.File(image, "w") as f:
            f.create_dataset("values", data=values, chunks=(16384,), fletcher32=True)
    with h5py.File(tmp_path / "f.tmp", "r") as f:
        np.testing.assert_array_equal(f["values"][()], values)

"""The in-memory image a segment file goes on being built in after a failed write: a file object that reads,
writes, seeks and truncates as a file on disk does, across its pages, and that h5py builds a whole HDF5 file
in."""
from __future__ import annotations

import io
import os
import tempfile

import h5py
import numpy as np

from comgra_ndbg.store.paged_image import PAGE, PagedImage


def test_every_operation_matches_a_file_on_disk():
    rng = np.random.default_rng(0)
    image, reference = PagedImage(), tempfile.TemporaryFile()
    for _ in range(400):
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
        elif operation == 2:  # cut (the bytes cut read as zeros if the file grows back) or extend with zeros
            size = int(rng.integers(0, 3 * PAGE))
            assert image.truncate(size) == reference.truncate(size)
        else:
            assert image.seek(0, io.SEEK_END) == reference.seek(0, io.SEEK_END)
        assert image.tell() == reference.tell() and len(image) == os.fstat(reference.fileno()).st_size
    reference.seek(0)
    assert b"".join(image.views()) == reference.read()
    reference.close()


def test_h5py_builds_a_file_in_it_that_reads_back_from_disk(tmp_path):
    values = np.arange(3 * PAGE // 4, dtype=np.float32)  # a file of several pages
    image = PagedImage()
    with h5py.File(image, "w") as f:
        f.create_dataset("values", data=values, chunks=(16384,), fletcher32=True)
        f.attrs["name"] = "paged"
    assert len(image) > 2 * PAGE
    (tmp_path / "image.h5").write_bytes(b"".join(image.views()))
    with h5py.File(tmp_path / "image.h5", "r") as f:
        np.testing.assert_array_equal(f["values"][()], values)
        assert f.attrs["name"] == "paged"

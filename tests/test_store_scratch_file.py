"""The scratch file full blocks of snapshot values wait in: read back as written, nameless, written only by
the process that made it, and the same without positional I/O."""
from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest

from comgra_ndbg.store.scratch_file import ScratchFile


def _round_trip(folder: Path) -> None:
    scratch = ScratchFile(folder)
    arrays = [np.arange(10.0), np.full(1000, 7, np.float32), np.random.default_rng(0).standard_normal(70000)]
    offsets = [scratch.append(array) for array in arrays]
    assert offsets == [0, 80, 4080] and os.listdir(folder) == []  # one after the other, no name in the folder
    for offset, array in reversed(list(zip(offsets, arrays))):
        out = np.empty_like(array)
        scratch.read_into(offset, out)
        np.testing.assert_array_equal(out, array)
    scratch.close()
    scratch.close()
    assert scratch.closed


def test_arrays_come_back_from_where_they_were_written(tmp_path: Path) -> None:
    _round_trip(tmp_path)


def test_without_positional_io_a_seek_and_a_plain_read_or_write_do(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("pwrite", "pread", "preadv"):
        monkeypatch.delattr(os, name, raising=False)
    _round_trip(tmp_path)


def test_reading_past_what_was_written_is_an_error_not_garbage(tmp_path: Path) -> None:
    scratch = ScratchFile(tmp_path)
    scratch.append(np.ones(4))
    with pytest.raises(OSError) as raised:
        scratch.read_into(16, np.empty(4))
    assert raised.value.errno == errno.EIO


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs POSIX fork")
def test_a_forked_child_may_read_but_not_write(tmp_path: Path) -> None:
    scratch = ScratchFile(tmp_path)
    scratch.append(np.arange(4.0))
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            out = np.empty(4)
            scratch.read_into(0, out)
            try:
                scratch.append(np.zeros(4))
            except OSError as error:
                code = 0 if error.errno == errno.EBADF and out.tolist() == [0.0, 1.0, 2.0, 3.0] else 2
        finally:
            os._exit(code)
    assert os.waitpid(pid, 0)[1] == 0
    assert scratch.append(np.ones(2)) == 32  # the parent's next array goes where the child's did not

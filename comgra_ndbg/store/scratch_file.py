"""An unnamed file for bytes that wait to be written elsewhere: the full blocks of buffered snapshot values.

Between two flushes a recording buffers the steps it will write; most of those bytes are snapshot values,
which nothing reads before the flush writes them into a segment. Kept in memory they are the largest part
of a recording's memory between flushes and at ``close()``. Written to a scratch file instead, they wait
in the kernel's page cache, which is not the process's memory and which the kernel writes out and takes
back when it needs the room; a flush every few seconds usually reads them back before they ever reach the
disk. The file has no name (``tempfile.TemporaryFile``: ``O_TMPFILE`` where the file system has it, else
a name removed at once), so nothing is left behind whatever ends the process, and it lives in the
recording's own folder, on the disk the user chose for it (a temporary folder may be memory, ``tmpfs``).

Only the process that made the file writes to it: a forked child that inherited it gets ``OSError`` and
keeps its blocks in memory, rather than writing where its parent's blocks are.
"""
from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

import numpy as np

from comgra_ndbg.store.disk_image import read_at, write_at

__all__ = ["ScratchFile"]


class ScratchFile:
    """Arrays appended one after the other, each read back by the offset ``append`` returned.

    >>> folder = tempfile.mkdtemp()
    >>> scratch = ScratchFile(folder)
    >>> first, second = scratch.append(np.arange(3.0)), scratch.append(np.ones(2, np.float32))
    >>> out = np.empty(2, np.float32); scratch.read_into(second, out); first, second, out.tolist()
    (0, 24, [1.0, 1.0])
    >>> scratch.close(); os.listdir(folder)
    []
    """

    def __init__(self, directory: str | os.PathLike) -> None:
        self._file = tempfile.TemporaryFile(dir=Path(directory), prefix=".scratch-")
        self._fd = self._file.fileno()
        self._process = os.getpid()
        self._end = 0

    def append(self, data: np.ndarray) -> int:
        """Write the bytes of the contiguous array ``data`` after those written so far; returns where they
        begin. A failed write (a full disk) raises ``OSError`` and changes nothing that was written."""
        if os.getpid() != self._process:
            raise OSError(errno.EBADF, "the scratch file belongs to the process that made it (this one is a fork)")
        view = memoryview(data).cast("B")
        offset, done = self._end, 0
        while done < len(view):
            done += write_at(self._fd, view[done:], offset + done)
        self._end += done
        return offset

    def read_into(self, offset: int, out: np.ndarray) -> None:
        """Fill the contiguous array ``out`` with the bytes written at ``offset``."""
        view = memoryview(out).cast("B")
        done = 0
        while done < len(view):
            if hasattr(os, "preadv"):  # straight into ``out``
                count = os.preadv(self._fd, [view[done:]], offset + done)
            else:
                data = read_at(self._fd, len(view) - done, offset + done)
                view[done:done + len(data)] = data
                count = len(data)
            if count == 0:
                raise OSError(errno.EIO, f"the scratch file ends {len(view) - done} bytes short of what was written")
            done += count

    @property
    def closed(self) -> bool:
        return self._file.closed

    def close(self) -> None:
        """Let go of the file and of everything written to it; idempotent."""
        self._file.close()

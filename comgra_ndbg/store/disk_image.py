"""The file object h5py builds a segment file in: its temporary file on disk, never a failed write for HDF5.

Segment files were built in memory (``PagedImage``) and then written with plain writes, so that a full disk
was an ``OSError`` of a plain write, never a failure inside HDF5 (which can leave the library with a
half-closed file, or crash the process). The price was the whole file in memory while it was built: the
largest single item of a recording's peak memory, at a merge or the last write of ``close()``. A
``DiskImage`` passes every write on to the temporary file at once (``write_at``): the process holds none of
the file's bytes (the kernel's page cache does, which is not the process's memory). The first write that
fails (``ENOSPC``, ``EFBIG``, ``EIO``) is kept, and from then on the image goes on in memory, from the bytes
written so far: HDF5 never sees the failure, finishes and closes its file as it would have, and
:meth:`check` raises the error afterwards. A failing write thus costs what every write cost before, the
file in memory; a successful one costs nothing.

The image owns its file descriptor: once :meth:`close`\\ d, every operation raises ``ValueError``, so that a
late call from HDF5 can never reach another file that was given the same descriptor number.
"""
from __future__ import annotations

import os
from pathlib import Path

from comgra_ndbg.store.paged_image import PAGE, PagedImage

__all__ = ["DiskImage", "write_at", "read_at"]


def write_at(fd: int, data: memoryview, offset: int) -> int:
    """Write ``data`` at ``offset`` of the file ``fd`` (``os.pwrite``; where there is none, a seek and a
    write: the file's position is used by nobody else); returns how many bytes were written."""
    if hasattr(os, "pwrite"):
        return os.pwrite(fd, data, offset)
    os.lseek(fd, offset, os.SEEK_SET)
    return os.write(fd, data)


def read_at(fd: int, size: int, offset: int) -> bytes:
    """Up to ``size`` bytes at ``offset`` of the file ``fd`` (``os.pread``, or a seek and a read)."""
    if hasattr(os, "pread"):
        return os.pread(fd, size, offset)
    os.lseek(fd, offset, os.SEEK_SET)
    return os.read(fd, size)


class DiskImage:
    """A seekable, readable and writable file object on the file ``path`` (created, or emptied if it
    exists), with what h5py's file-object driver uses: ``seek``, ``tell``, ``read``, ``write``,
    ``truncate``, ``flush``.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as folder, DiskImage(Path(folder) / "f.tmp") as image:
    ...     image.write(b"abc"), image.seek(PAGE + 1), image.write(b"xy")
    ...     image.check(); len(image), image.seek(1), image.read(3), (Path(folder) / "f.tmp").read_bytes()[-3:]
    (3, 1048577, 2)
    (1048579, 1, b'bc\\x00', b'\\x00xy')
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self._size = 0
        self._position = 0
        self._memory: PagedImage | None = None  # after a failed write: the rest of the file is built here
        self.error: OSError | None = None

    def __enter__(self) -> DiskImage:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __len__(self) -> int:
        return self._size if self._memory is None else len(self._memory)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self._open_fd()
        if self._memory is not None:
            return self._memory.seek(offset, whence)
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._position, os.SEEK_END: self._size}[whence]
        self._position = max(base + offset, 0)
        return self._position

    def tell(self) -> int:
        self._open_fd()
        return self._position if self._memory is None else self._memory.tell()

    def read(self, size: int = -1) -> bytes:
        fd = self._open_fd()
        if self._memory is not None:
            return self._memory.read(size)
        end = self._size if size is None or size < 0 else min(self._position + size, self._size)
        parts = []
        while self._position < end:
            data = read_at(fd, end - self._position, self._position)
            if not data:  # cut short behind our back: what a file reads past its end
                break
            parts.append(data)
            self._position += len(data)
        return b"".join(parts)

    def write(self, data: bytes | bytearray | memoryview) -> int:
        fd = self._open_fd()
        if self._memory is not None:
            return self._memory.write(data)
        view = memoryview(data).cast("B")
        done = 0
        try:
            while done < len(view):
                done += write_at(fd, view[done:], self._position + done)
        except OSError as error:
            self._fail(error)
            return self._memory.write(view)
        self._position += done
        self._size = max(self._size, self._position)
        return done

    def truncate(self, size: int | None = None) -> int:
        """Cut the file to ``size`` bytes (the position by default) or extend it with zeros."""
        fd = self._open_fd()
        if self._memory is not None:
            return self._memory.truncate(size)
        size = self._position if size is None else size
        try:
            os.ftruncate(fd, size)
        except OSError as error:
            self._fail(error)
            return self._memory.truncate(size)
        self._size = size
        return size

    def flush(self) -> None:
        """Nothing to do: every write went to the file at once (:meth:`sync` makes it durable)."""
        self._open_fd()

    def check(self) -> None:
        """Raise the first failed write, if there was one (once HDF5 has closed its file)."""
        if self.error is not None:
            raise self.error

    def sync(self) -> None:
        """Make the file's bytes durable (``fsync``); raises the first failed write, if there was one."""
        fd = self._open_fd()
        self.check()
        os.fsync(fd)

    def close(self) -> None:
        """Close the file descriptor (the file stays) and let go of the bytes held in memory; idempotent."""
        fd, self._fd, self._memory = self._fd, None, None
        if fd is not None:
            os.close(fd)

    @property
    def closed(self) -> bool:
        return self._fd is None

    def _open_fd(self) -> int:
        if self._fd is None:
            raise ValueError(f"I/O on the closed image of {self.path}")
        return self._fd

    def _fail(self, error: OSError) -> None:
        """Keep ``error`` and go on in memory, from the bytes written so far (read back from the file, where
        they are in the kernel's page cache)."""
        self.error = error
        memory = PagedImage()
        start = 0
        while start < self._size:
            chunk = read_at(self._fd, min(PAGE, self._size - start), start)
            if not chunk:
                break
            memory.write(chunk)
            start += len(chunk)
        memory.truncate(self._size)
        memory.seek(self._position)
        self._memory = memory

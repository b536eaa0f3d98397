"""The bytes of a file built in memory, held in pages of memory of their own.

A ``DiskImage`` whose write to disk failed (a full disk) goes on building its file here, so that HDF5 can
finish and close it (``disk_image``). One growing buffer (a ``BytesIO``) grows by reallocation: where the
allocator cannot grow it in place it copies it, and on its heap the old buffers' pages stay with the
process. Here the bytes go into pages of ``PAGE`` bytes, each an anonymous mapping that nothing else
shares: the image takes its own size, give or take a page, and every page goes back to the system when the
image is dropped.
"""
from __future__ import annotations

import mmap
import os
from collections.abc import Iterator

__all__ = ["PAGE", "PagedImage"]

PAGE = 1 << 20
"""Bytes per page."""


class PagedImage:
    """A seekable, readable and writable file object in memory that behaves as a file on disk (a write or a
    ``truncate`` past the end extends it with zeros), with what h5py's file-object driver uses: ``seek``,
    ``tell``, ``read``, ``write``, ``truncate``, ``flush``.

    >>> image = PagedImage()
    >>> image.write(b"abc"), image.seek(PAGE + 1), image.write(b"xy")
    (3, 1048577, 2)
    >>> len(image), image.seek(1), image.read(3), len(image.read()), b"".join(image.views())[PAGE - 1:]
    (1048579, 1, b'bc\\x00', 1048575, b'\\x00\\x00xy')
    """

    def __init__(self) -> None:
        self._pages: list[mmap.mmap] = []
        self._size = 0
        self._position = 0

    def __len__(self) -> int:
        return self._size

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._position, os.SEEK_END: self._size}[whence]
        self._position = max(base + offset, 0)
        return self._position

    def tell(self) -> int:
        return self._position

    def read(self, size: int = -1) -> bytes:
        end = self._size if size is None or size < 0 else min(self._position + size, self._size)
        parts = [bytes(view) for view in self._spans(self._position, end)]
        self._position = max(end, self._position)
        return b"".join(parts)

    def write(self, data: bytes | bytearray | memoryview) -> int:
        source = memoryview(data).cast("B")
        end = self._position + len(source)
        while len(self._pages) * PAGE < end:
            self._pages.append(mmap.mmap(-1, PAGE))
        done = 0
        for view in self._spans(self._position, end):
            view[:] = source[done:done + len(view)]
            done += len(view)
        self._position = end
        self._size = max(self._size, end)
        return len(source)

    def truncate(self, size: int | None = None) -> int:
        """Cut the image to ``size`` bytes (the position by default) or extend it with zeros."""
        size = self._position if size is None else size
        if size < self._size:
            for view in self._spans(size, min(self._size, -(-size // PAGE) * PAGE)):
                view[:] = bytes(len(view))  # a later extension reads zeros, as from a file
            del self._pages[-(-size // PAGE):]
        while len(self._pages) * PAGE < size:
            self._pages.append(mmap.mmap(-1, PAGE))
        self._size = size
        return size

    def flush(self) -> None:
        """Nothing to do: the bytes are written by whoever takes ``views``."""

    def views(self) -> Iterator[memoryview]:
        """The image's bytes, page by page (the last one cut to the image's size)."""
        return self._spans(0, self._size)

    def _spans(self, start: int, end: int) -> Iterator[memoryview]:
        """Views of the bytes ``[start, end)``, one per page they touch."""
        while start < end:
            page, offset = divmod(start, PAGE)
            stop = min(end, (page + 1) * PAGE)
            yield memoryview(self._pages[page])[offset:offset + stop - start]
            start = stop

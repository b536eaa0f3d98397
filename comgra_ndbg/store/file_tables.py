"""The value pools and summary tables of segment files, read only while a merge writes them.

These two tables are most of a segment's bytes. A merge used to read them whole from every input, join
them, and write the join: its inputs' tables and their concatenation were all in memory at once. Read with
``read_segment(f, lazy=True)``, a segment's pool and table are instead a reference to the file
(:class:`FileTable`); ``concat`` joins references (:class:`FileValues`, :class:`FileSummaries`), and
``write_segment`` asks for each table slab by slab (``slabs``, 256 KiB), each slab read from the input files
as it is written. A merge thus holds one slab of them, whatever their size.

The inputs are opened a second time for this, after ``read_segment`` has closed them. Files with a final
name are never changed, and only the writer that holds the trial's lock merges or deletes them, so they
are the files that were read; still, each is checked to be (device, inode, size and modification time as
when it was read), and a chunk that fails its checksum raises ``DamagedData``: a merge writes nothing but
its inputs' data, or fails and leaves them as they are.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from comgra_ndbg.store import schema
from comgra_ndbg.store.damage import DamagedData
from comgra_ndbg.store.value_blocks import READ_SLAB, ValueBlocks

__all__ = ["FileTable", "FileValues", "FileSummaries", "file_table"]


@dataclass(frozen=True)
class FileTable:
    """A dataset of a segment file, to be read later: where it is, what it is, and which file it was."""

    path: Path
    name: str  # the dataset's path in the file
    shape: tuple[int, ...]
    dtype: np.dtype
    stamp: tuple[int, int, int, int]  # (device, inode, size, modification time in ns) of the file

    @contextlib.contextmanager
    def open(self) -> Iterator[h5py.Dataset]:
        """The dataset, in its file opened again (without a chunk cache: every chunk is read once); raises
        ``DamagedData`` when the file is no longer the one that was read."""
        with h5py.File(self.path, "r", rdcc_nbytes=0) as f:
            found = _stamp(f)
            if found != self.stamp:
                raise DamagedData(self.path, self.name, f"the file changed since the merge read it (device, inode, "
                                                        f"size, mtime {found}, was {self.stamp}); it is left as it is")
            yield f[self.name]

    def read_into(self, dataset: h5py.Dataset, out: np.ndarray, source: tuple[slice, ...],
                  target: tuple[slice, ...]) -> None:
        """``out[target] = dataset[source]`` without a temporary array; a chunk that cannot be read (failing its
        Fletcher-32 checksum) raises ``DamagedData``."""
        try:
            dataset.read_direct(out, source, target)
        except OSError as error:
            raise DamagedData(self.path, self.name, f"a chunk cannot be read ({error})") from error


def file_table(f: h5py.File, name: str) -> FileTable:
    """A reference to dataset ``name`` of the open segment file ``f``."""
    dataset = f[name]
    return FileTable(Path(f.filename), name, tuple(dataset.shape), np.dtype(dataset.dtype), _stamp(f))


def _stamp(f: h5py.File) -> tuple[int, int, int, int]:
    """What tells the file ``f`` is open on from another file of the same name (the file descriptor's, where
    HDF5 reads through one of its own)."""
    status = os.fstat(f.id.get_vfd_handle()) if f.driver == "sec2" else os.stat(f.filename)
    return status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns


Piece = FileTable | np.ndarray


class FileValues:
    """Value pools one after the other, each a file's (``FileTable``) or an array, read as they are written:
    ``READ_SLAB`` values at a time, so that every slab but the last is whole chunks of the merged pool. float64
    when a piece is, else float32, as ``ValueBlocks`` holds them (float32 would turn 1e300 into inf)."""

    def __init__(self, pieces: list[Piece]) -> None:
        self.pieces = pieces

    @classmethod
    def joined(cls, parts: list[FileValues | ValueBlocks | np.ndarray]) -> FileValues:
        """The pools of ``parts`` one after the other (``ValueBlocks`` are copied into an array)."""
        pieces: list[Piece] = []
        for part in parts:
            pieces.extend(part.pieces if isinstance(part, FileValues) else [np.asarray(part)])
        return cls(pieces)

    def __len__(self) -> int:
        return sum(piece.shape[0] for piece in self.pieces)

    @property
    def shape(self) -> tuple[int]:
        return (len(self),)

    @property
    def dtype(self) -> np.dtype:
        wide = any(np.dtype(piece.dtype) == np.float64 for piece in self.pieces)
        return np.dtype(np.float64 if wide else np.float32)

    @property
    def nbytes(self) -> int:
        """The bytes of the values (not held: they are read as they are written)."""
        return len(self) * self.dtype.itemsize

    def slabs(self, *, consume: bool = False) -> Iterator[np.ndarray]:
        """The values in slabs of ``READ_SLAB`` (the last one shorter), each valid until the next is asked for
        (they share one block). With ``consume`` the pieces are let go of afterwards."""
        block = np.empty(min(READ_SLAB, max(len(self), 1)), self.dtype)
        used = 0
        for piece in self.pieces:
            count = piece.shape[0]
            with piece.open() if isinstance(piece, FileTable) else contextlib.nullcontext(piece) as source:
                start = 0
                while start < count:
                    take = min(len(block) - used, count - start)
                    if isinstance(piece, FileTable):
                        piece.read_into(source, block, np.s_[start:start + take], np.s_[used:used + take])
                    else:
                        block[used:used + take] = source[start:start + take]
                    used += take
                    start += take
                    if used == len(block):
                        yield block
                        used = 0
        if used:
            yield block[:used]
        if consume:
            self.pieces = []


class FileSummaries:
    """Summary tables side by side (their rows one after the other), each a file's (``FileTable``) or an
    array ``[series, fields, rows]``, read as they are written: a few whole series at a time (about
    ``SLAB_BYTES``). Series a piece lacks (written before they existed) are the merge identity, as are the
    fields of rows of an older format version (``schema.pad_fields``)."""

    SLAB_BYTES = 1 << 18

    def __init__(self, pieces: list[Piece]) -> None:
        self.pieces = pieces

    @classmethod
    def joined(cls, parts: list[FileSummaries | np.ndarray]) -> FileSummaries:
        pieces: list[Piece] = []
        for part in parts:
            pieces.extend(part.pieces if isinstance(part, FileSummaries) else [part])
        return cls(pieces)

    @property
    def shape(self) -> tuple[int, int, int]:
        return (max((piece.shape[0] for piece in self.pieces), default=0), schema.NUM_FIELDS,
                sum(piece.shape[2] for piece in self.pieces))

    @property
    def ndim(self) -> int:
        return 3

    @property
    def dtype(self) -> np.dtype:
        return np.result_type(np.float64, *(piece.dtype for piece in self.pieces))

    @property
    def nbytes(self) -> int:
        """The bytes of the table (not held: it is read as it is written)."""
        return int(np.prod(self.shape)) * self.dtype.itemsize

    def slabs(self, *, consume: bool = False) -> Iterator[np.ndarray]:
        """The table a few whole series at a time along its first axis, each slab valid until the next is asked
        for (they share one buffer). The files are opened once per slab, one at a time (HDF5 holds over half a
        MiB per open file). With ``consume`` the pieces are let go of afterwards."""
        num_series, fields, total = self.shape
        step = min(max(1, self.SLAB_BYTES // max(fields * total * self.dtype.itemsize, 1)), max(num_series, 1))
        buffer = np.empty((step, fields, total), self.dtype)
        for first in range(0, num_series, step):
            slab = buffer[:min(step, num_series - first)]
            slab[...] = schema.identity_row()[None, :, None]
            column = 0
            for piece in self.pieces:
                series, width, rows = piece.shape
                if first < series and rows:
                    count = min(first + len(slab), series) - first
                    target = np.s_[:count, :width, column:column + rows]
                    if isinstance(piece, FileTable):
                        with piece.open() as dataset:
                            piece.read_into(dataset, slab, np.s_[first:first + count], target)
                    else:
                        slab[target] = piece[first:first + count]
                column += rows
            yield slab
        if consume:
            self.pieces = []

"""The element values of the snapshots buffered since the last flush: one block of memory being filled, and
the full blocks in a scratch file.

Until a flush writes them (at ``close()``, for a run shorter than ``flush_every_seconds``), a recording's
snapshot values are most of what it holds. Kept as the small arrays they arrived in, they live on the
allocator's heap, which keeps their pages once they are freed. Here each snapshot's values are copied, as
it arrives, to the end of a block of ``BLOCK`` values (whole chunks of the file's value pool) in a mapping
of its own; a full block is written to an unnamed scratch file in the recording's folder (``scratch_file``)
and filled again, so the values wait for the flush in the kernel's page cache, not in the process's memory:
a recording holds one block of values, whatever it buffers. The write reads the full blocks back one at a
time, into one buffer, and hands HDF5 a block at a time.

Where there is no folder (a ``ValueBlocks`` of its own) or the scratch file cannot be made or written (a
full disk), a full block stays in memory and a new one is mapped: nothing is lost, the values only take
memory, as they all did before. A block's pages are populated in the call that maps it (Linux), which costs
less than taking one page fault per page as the values arrive (both on the training thread); the block of a
written segment goes to the steps after it (``recycle``), so a run maps about one block, once.
"""
from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

from comgra_ndbg.store import schema
from comgra_ndbg.store.scratch_file import ScratchFile

__all__ = ["BLOCK", "ValueBlocks"]

BLOCK = 16 * schema.CHUNK_ELEMENTS
"""Values per block (1 MiB of float32): a multiple of the value pool's chunk, so every block is written as
whole chunks, as the pool written in one piece is."""

READ_SLAB = 4 * schema.CHUNK_ELEMENTS
"""Values a spilled block is read back in at a time (256 KiB of float32, whole chunks): the buffer a write
adds to the block being filled."""


class _Spilled(NamedTuple):
    """A full block written to the scratch file: where, and as what dtype (it is converted when read back, if
    the values were widened since)."""

    offset: int
    dtype: np.dtype


class ValueBlocks:
    """Snapshot values one after the other, float32 unless a float64 snapshot is among them (then float64,
    as the file's value pool: float32 would turn 1e300 into inf). ``directory``: where full blocks go to a
    scratch file (None: they stay in memory).

    >>> blocks = ValueBlocks()
    >>> blocks.append(np.array([1.0, 2.0], np.float32)); blocks.append(np.array([3.0], np.float32))
    >>> len(blocks), blocks.dtype, np.asarray(blocks).tolist()
    (3, dtype('float32'), [1.0, 2.0, 3.0])
    >>> blocks.append(np.array([1e300])); blocks.dtype, np.asarray(blocks)[-1]
    (dtype('float64'), np.float64(1e+300))
    """

    def __init__(self, spare: list[np.ndarray] | None = None, directory: str | os.PathLike | None = None) -> None:
        self.dtype = np.dtype(np.float32)
        self.size = 0
        self._full: list[np.ndarray | _Spilled | None] = []  # the full blocks, in order: in memory or spilled
        self._block: np.ndarray | None = None  # the block being filled
        self._spare = [] if spare is None else spare  # blocks to fill before mapping new ones, shared
        self._directory = directory
        self._scratch: ScratchFile | None = None

    def __len__(self) -> int:
        return self.size

    @property
    def shape(self) -> tuple[int]:
        return (self.size,)

    @property
    def nbytes(self) -> int:
        """Bytes of the values held, in memory or in the scratch file (what the writer counts)."""
        return self.size * self.dtype.itemsize

    @property
    def spilled(self) -> int:
        """How many full blocks are in the scratch file."""
        return sum(isinstance(entry, _Spilled) for entry in self._full)

    def append(self, values: np.ndarray) -> None:
        """Copy the 1-D ``values`` after those held."""
        if values.dtype == np.float64 and self.dtype != np.float64:
            self._widen()
        done, count = 0, len(values)
        while done < count:
            if self._block is None:
                self._block = self._take_block()
            used = self.size - len(self._full) * BLOCK
            take = min(BLOCK - used, count - done)
            self._block[used:used + take] = values[done:done + take]
            done += take
            self.size += take
            if used + take == BLOCK:
                self._put_away()

    def slabs(self, *, consume: bool = False) -> Iterator[np.ndarray]:
        """The values held in slabs of whole chunks: a block in memory at a time, a spilled one ``READ_SLAB`` at a
        time, read back into one buffer, so each slab is valid until the next is asked for; the last block cut
        to what it holds. With ``consume`` each block is let go of once the next is asked for, and the scratch
        file once all are: the blocks are empty afterwards."""
        buffer = None
        for position in range(len(self._full)):
            entry = self._full[position]
            if consume:
                self._full[position] = None
            if isinstance(entry, np.ndarray):
                yield entry
                continue
            if buffer is None or buffer.dtype != entry.dtype:
                buffer = np.empty(READ_SLAB, entry.dtype)
            for start in range(0, BLOCK, READ_SLAB):
                self._scratch.read_into(entry.offset + start * entry.dtype.itemsize, buffer)
                yield buffer if buffer.dtype == self.dtype else buffer.astype(self.dtype)
        used = self.size - len(self._full) * BLOCK
        if used:
            yield self._block[:used]
        if consume:
            self._release()

    def recycle(self) -> None:
        """Hand the blocks in memory to the spare list this was made with, for the next ``ValueBlocks`` sharing
        it to fill: memory already written once, which takes no page faults. The values held are gone.

        >>> spare = []
        >>> a = ValueBlocks(spare); a.append(np.array([1.0, 2.0], np.float32)); block = a._block
        >>> a.recycle(); b = ValueBlocks(spare); b.append(np.array([3.0], np.float32))
        >>> b._block is block, np.asarray(b).tolist(), len(a), spare
        (True, [3.0], 0, [])
        """
        self._spare.extend(entry for entry in self._full if isinstance(entry, np.ndarray))
        if self._block is not None:
            self._spare.append(self._block)
        self._release()

    def __array__(self, dtype: np.dtype | None = None, copy: bool | None = None) -> np.ndarray:
        """The values as one array (a copy)."""
        out = np.concatenate([slab.copy() for slab in self.slabs()]) if self.size else np.zeros(0, self.dtype)
        return out if dtype is None else out.astype(dtype, copy=False)

    def _put_away(self) -> None:
        """The block being filled is full: to the scratch file, to be filled again, or else kept in memory."""
        spilled = self._spill(self._block) if self._directory is not None else None
        if spilled is not None:
            self._full.append(spilled)
        else:
            self._full.append(self._block)
            self._block = None

    def _spill(self, block: np.ndarray) -> _Spilled | None:
        """``block`` written to the scratch file, or None where it cannot be (no room on the disk, a folder that
        is gone, a forked child of the process that made the file)."""
        try:
            if self._scratch is None:
                self._scratch = ScratchFile(self._directory)
            return _Spilled(self._scratch.append(block), block.dtype)
        except OSError:
            return None

    def _release(self) -> None:
        """Let go of every block and of the scratch file."""
        self._full, self._block, self.size = [], None, 0
        if self._scratch is not None:
            self._scratch.close()
            self._scratch = None

    def _take_block(self) -> np.ndarray:
        """A spare block of this dtype, else a new one (another thread may recycle into the spare list)."""
        try:
            block = self._spare.pop()
        except IndexError:
            return _mapped(self.dtype)
        return block if block.dtype == self.dtype else _mapped(self.dtype)

    def _widen(self) -> None:
        """Hold float64 from now on: the values held in memory so far are converted (spilled ones when they
        are read back)."""
        wide = np.dtype(np.float64)
        for position, entry in enumerate(self._full):
            if isinstance(entry, np.ndarray):
                self._full[position] = _converted(entry, wide)
        if self._block is not None:
            self._block = _converted(self._block, wide)
        self.dtype = wide


def _converted(block: np.ndarray, dtype: np.dtype) -> np.ndarray:
    copy = _mapped(dtype)
    copy[:] = block
    return copy


_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
"""Linux: map a block's pages at once, in one call, rather than one page fault at a time as the values arrive
(filling 4 MiB of fresh blocks, measured here: 1.4 ms populated against 3.2 ms by page faults). The price: a
segment's last block is resident whole (at most 1 MiB, 2 MiB for float64) though partly filled."""


def _mapped(dtype: np.dtype) -> np.ndarray:
    """An array of ``BLOCK`` elements in an anonymous mapping of its own: unmapped, its pages back with the
    system, once the array and every view of it are gone. Its pages are populated when it is mapped, where the
    system can (a block is filled whole unless it is a segment's last)."""
    size = BLOCK * dtype.itemsize
    if _POPULATE:
        return np.frombuffer(mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _POPULATE), dtype)
    return np.frombuffer(mmap.mmap(-1, size), dtype)

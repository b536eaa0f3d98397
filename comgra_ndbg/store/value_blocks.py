"""The element values of the snapshots buffered since the last flush, packed into blocks of their own memory.

Until a flush writes them (at ``close()``, for a run shorter than ``flush_every_seconds``), a recording's
snapshot values are most of what it holds in memory. Kept as the small arrays they arrived in, they live on
the allocator's heap, which keeps their pages once they are freed: the write stacked their concatenation
and the file image on top of them. Here each snapshot's values are copied, as it arrives, to the end of a
sequence of blocks, each a mapping of its own of ``BLOCK`` values (whole chunks of the file's value pool);
the write hands HDF5 one block at a time (and at ``close()`` gives each back to the system once written).
The arrays the snapshots arrived in are freed after their step and their heap space serves the next ones.
A new block's pages are populated in the call that maps it (Linux), which costs less than taking one page
fault per page as the values arrive (both on the training thread); during a run, the blocks of a segment
once written are kept (``recycle``) for the steps after it, so a long run pays that once, not at every
snapshot step.
"""
from __future__ import annotations

import mmap
from collections.abc import Iterator

import numpy as np

from comgra_ndbg.store import schema

__all__ = ["BLOCK", "ValueBlocks"]

BLOCK = 16 * schema.CHUNK_ELEMENTS
"""Values per block (1 MiB of float32): a multiple of the value pool's chunk, so every block is written as
whole chunks, as the pool written in one piece is."""


class ValueBlocks:
    """Snapshot values one after the other, float32 unless a float64 snapshot is among them (then float64,
    as the file's value pool: float32 would turn 1e300 into inf).

    >>> blocks = ValueBlocks()
    >>> blocks.append(np.array([1.0, 2.0], np.float32)); blocks.append(np.array([3.0], np.float32))
    >>> len(blocks), blocks.dtype, np.asarray(blocks).tolist()
    (3, dtype('float32'), [1.0, 2.0, 3.0])
    >>> blocks.append(np.array([1e300])); blocks.dtype, np.asarray(blocks)[-1]
    (dtype('float64'), np.float64(1e+300))
    """

    def __init__(self, spare: list[np.ndarray] | None = None) -> None:
        self.dtype = np.dtype(np.float32)
        self.size = 0
        self._blocks: list[np.ndarray] = []
        self._spare = [] if spare is None else spare  # blocks to fill before mapping new ones, shared

    def __len__(self) -> int:
        return self.size

    @property
    def shape(self) -> tuple[int]:
        return (self.size,)

    @property
    def nbytes(self) -> int:
        """Bytes of the values held (what the writer counts; the blocks' unused tail is not touched)."""
        return self.size * self.dtype.itemsize

    def append(self, values: np.ndarray) -> None:
        """Copy the 1-D ``values`` after those held."""
        if values.dtype == np.float64 and self.dtype != np.float64:
            self._widen()
        done, count = 0, len(values)
        while done < count:
            used = self.size % BLOCK
            if used == 0 and self.size == len(self._blocks) * BLOCK:
                self._blocks.append(self._block())
            take = min(BLOCK - used, count - done)
            self._blocks[-1][used:used + take] = values[done:done + take]
            done += take
            self.size += take

    def slabs(self, *, consume: bool = False) -> Iterator[np.ndarray]:
        """The values held, block by block (the last one cut to what it holds). With ``consume`` each block is
        let go of once the next is asked for: the blocks are empty afterwards."""
        remaining = self.size
        while self._blocks if consume else remaining > 0:
            block = self._blocks.pop(0) if consume else self._blocks[(self.size - remaining) // BLOCK]
            slab = block[:min(remaining, BLOCK)]
            del block
            remaining -= len(slab)
            yield slab
        if consume:
            self.size = 0

    def recycle(self) -> None:
        """Hand the blocks to the spare list this was made with, for the next ``ValueBlocks`` sharing it to
        fill: memory already written once, which takes no page faults. The values held are gone.

        >>> spare = []
        >>> a = ValueBlocks(spare); a.append(np.array([1.0, 2.0], np.float32)); block = a._blocks[0]
        >>> a.recycle(); b = ValueBlocks(spare); b.append(np.array([3.0], np.float32))
        >>> b._blocks[0] is block, np.asarray(b).tolist(), len(a), spare
        (True, [3.0], 0, [])
        """
        self._spare.extend(self._blocks)
        self._blocks, self.size = [], 0

    def __array__(self, dtype: np.dtype | None = None, copy: bool | None = None) -> np.ndarray:
        """The values as one array (a copy)."""
        out = np.concatenate(list(self.slabs())) if self.size else np.zeros(0, self.dtype)
        return out if dtype is None else out.astype(dtype, copy=False)

    def _block(self) -> np.ndarray:
        """A spare block of this dtype, else a new one (another thread may recycle into the spare list)."""
        try:
            block = self._spare.pop()
        except IndexError:
            return _mapped(self.dtype)
        return block if block.dtype == self.dtype else _mapped(self.dtype)

    def _widen(self) -> None:
        """Hold float64 from now on: the values held so far are converted."""
        wide = []
        for block in self._blocks:
            copy = _mapped(np.dtype(np.float64))
            copy[:] = block
            wide.append(copy)
        self._blocks, self.dtype = wide, np.dtype(np.float64)


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

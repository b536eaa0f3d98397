"""The summary rows buffered since the last flush, and the dense table a segment stores, made from them a few
series at a time as it is written.

A segment stores its summaries as one dense table ``[series, fields, rows]``: every series at every
(step, iteration) that recorded summaries, the merge identity where a series has none. The rows a step
hands the writer are sparse (a sentinel step of the tiered default summarizes the parameters only), so the
dense table is several times their bytes: four times on the MLP of ``benchmarks/recording_size.py``, 4 MiB
for 300 steps, which used to be built whole at every flush and at ``close()``, beside the thousands of
small arrays the rows had arrived in. Here each step's rows are copied, as they arrive, into blocks of
``BLOCK_ROWS`` rows, and the dense table is made slab by slab (``slabs``) while the segment is written:
what a recording holds is its rows, once, and a write adds one slab.
"""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from comgra_ndbg.store import schema

__all__ = ["SummaryTable"]


class _Block:
    """``BLOCK_ROWS`` rows: the series of each, its (step, iteration) key, and its fields."""

    def __init__(self, size: int) -> None:
        self.series = np.empty(size, np.int64)
        self.key = np.empty(size, np.int64)
        self.fields = np.empty((size, schema.NUM_FIELDS), np.float64)
        self.used = 0


class SummaryTable:
    """Summary rows as they arrive (``add``), then, once :meth:`finish` has named the table's series, the dense
    table ``[series, NUM_FIELDS, (step, iteration)]`` of a segment, its columns in step order.

    >>> table = SummaryTable()
    >>> table.add(4, 0, np.array([1]), np.full((1, schema.NUM_FIELDS), 5.0))
    >>> table.add(3, 0, np.array([0, 1]), np.full((2, schema.NUM_FIELDS), 7.0))
    >>> steps, iterations = table.finish(num_series=2)
    >>> steps.tolist(), table.shape == (2, schema.NUM_FIELDS, 2), np.asarray(table)[1, 0].tolist()
    ([3, 4], True, [7.0, 5.0])
    >>> bool((np.asarray(table)[0, :, 1] == schema.identity_row()).all())  # series 0 has no row at step 4
    True
    """

    BLOCK_ROWS = 4096
    SLAB_BYTES = 1 << 18

    def __init__(self) -> None:
        self._blocks: list[_Block] = []
        self._keys: dict[tuple[int, int], int] = {}  # (step, iteration) -> key, in the order they came
        self._columns: np.ndarray | None = None  # key -> column of the table, once finished
        self.shape = (0, schema.NUM_FIELDS, 0)
        self.dtype = np.dtype(np.float64)
        self.ndim = 3

    def __len__(self) -> int:
        """How many rows were added."""
        return sum(block.used for block in self._blocks)

    @property
    def nbytes(self) -> int:
        """Bytes of the dense table (what the file holds; not what is held here)."""
        return int(np.prod(self.shape)) * self.dtype.itemsize

    def add(self, step: int, iteration: int, series: np.ndarray, rows: np.ndarray) -> None:
        """Copy the rows ``[k, NUM_FIELDS]`` of the series ids ``[k]`` at one (step, iteration)."""
        key = self._keys.setdefault((step, iteration), len(self._keys))
        done, count = 0, len(series)
        while done < count:
            if not self._blocks or self._blocks[-1].used == self.BLOCK_ROWS:
                self._blocks.append(_Block(self.BLOCK_ROWS))
            block = self._blocks[-1]
            take = min(self.BLOCK_ROWS - block.used, count - done)
            block.series[block.used:block.used + take] = series[done:done + take]
            block.key[block.used:block.used + take] = key
            block.fields[block.used:block.used + take] = rows[done:done + take]
            block.used += take
            done += take

    def finish(self, num_series: int) -> tuple[np.ndarray, np.ndarray]:
        """Fix the table's shape: ``num_series`` series (the catalog's) and one column per (step, iteration),
        in order; returns the step and the iteration of each column (the segment's ``summary`` index)."""
        keys = sorted(self._keys)
        self._columns = np.empty(len(keys), np.int64)
        for column, key in enumerate(keys):
            self._columns[self._keys[key]] = column
        self.shape = (num_series, schema.NUM_FIELDS, len(keys))
        return np.array([k[0] for k in keys], np.int64), np.array([k[1] for k in keys], np.int32)

    def slabs(self, *, consume: bool = False) -> Iterator[np.ndarray]:
        """The table a few whole series at a time along its first axis (about ``SLAB_BYTES``), each slab valid
        until the next is asked for (they share one buffer). A block's rows are taken by their series, which
        each block orders once, so a slab costs two binary searches a block. Rows of the same series at the
        same (step, iteration) overwrite each other in the order they came. With ``consume`` the blocks are
        let go of afterwards."""
        num_series, fields, columns = self.shape
        if num_series and columns:
            orders = [np.argsort(block.series[:block.used], kind="stable") for block in self._blocks]
            ordered = [block.series[order] for block, order in zip(self._blocks, orders)]
            step = min(max(1, self.SLAB_BYTES // (fields * columns * self.dtype.itemsize)), num_series)
            buffer = np.empty((step, fields, columns), self.dtype)
            for first in range(0, num_series, step):
                slab = buffer[:min(step, num_series - first)]
                slab[...] = schema.identity_row()[None, :, None]
                for block, order, series in zip(self._blocks, orders, ordered):
                    chosen = order[np.searchsorted(series, first):np.searchsorted(series, first + len(slab))]
                    slab[block.series[chosen] - first, :, self._columns[block.key[chosen]]] = block.fields[chosen]
                yield slab
        if consume:
            self._blocks = []

    def __array__(self, dtype: np.dtype | None = None, copy: bool | None = None) -> np.ndarray:
        """The dense table as one array (a copy)."""
        slabs = [slab.copy() for slab in self.slabs()]
        out = np.concatenate(slabs) if slabs else np.zeros(self.shape, self.dtype)
        return out if dtype is None else out.astype(dtype, copy=False)

"""The summary rows of one open step, all claimed in one reducer: which series each claimed row holds, and
the rows taken from the reducer so far.

A step's values, gradients and updates are summarised into the rows of a single ``Reducer`` in the order
they are claimed. The recorder adds a block per group of rows it knows the series of (``add``), takes the
reducer's rows when it wants them on their way to the host (``take``: at the end of a gradient set, so a
device's rows travel while the optimizer steps), and reads the whole step once, when its record is built
(``finish``). A loop claims the same blocks at every step, so the record's series and iterations and the
order that puts the rows next to them are kept per layout of blocks: a step's rows cost one copy out of
the reducer, and none more when the blocks lie in claim order. A take renumbers the reducer's rows from 0:
every row the recorder still knows by its number in the reducer becomes a block before the next take.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from comgra_ndbg.recorder.step_record import SummaryRows, zeros
from comgra_ndbg.stats.collected import Collected
from comgra_ndbg.stats.reducer import Reducer
from comgra_ndbg.store import schema

__all__ = ["Failure", "StepRows"]

Failure = tuple[int | None, int, str]
"""A row that could not be computed: (its series id, or None when no block holds it; its row; why)."""

_LAYOUTS_KEPT = 64


class StepRows:
    """The blocks and taken rows of one step (a new one per step).

    >>> import torch
    >>> reducer, rows = Reducer(), StepRows()
    >>> rows.add(np.array([7]), zeros(1), [reducer.add(torch.ones(3))])
    slice(0, 1, None)
    >>> rows.take(reducer, wait=True)
    >>> rows.add(np.array([9]), zeros(1), [reducer.add(torch.zeros(2))])  # the reducer's row 0: the step's row 1
    slice(1, 2, None)
    >>> done = rows.finish(reducer, lambda failures: None)
    >>> done.series.tolist(), done.data[:, schema.FIELD["sum"]].tolist()
    ([7, 9], [3.0, 0.0])
    """

    __slots__ = ("_blocks", "_chunks", "_taken")

    def __init__(self) -> None:
        self._blocks: list[tuple[np.ndarray, np.ndarray, slice | np.ndarray]] = []  # (series, iterations, rows)
        self._chunks: list[np.ndarray | Collected] = []  # what each take got, in order
        self._taken = 0  # rows taken from the reducer so far: the first row of the reducer's next rows

    def add(self, series: np.ndarray, iterations: np.ndarray, at: range | slice | Sequence[int] | np.ndarray
            ) -> slice | np.ndarray:
        """The rows ``at`` of the reducer's rows not taken yet hold ``series`` in ``iterations``: read-only
        arrays kept from step to step make the record's layout known at once (see the module docstring).
        Returns where those rows are among the step's (for ``read``)."""
        offset = self._taken
        if type(at) is list and at and at[-1] - at[0] == len(at) - 1 and at == list(range(at[0], at[-1] + 1)):
            at = range(at[0], at[-1] + 1)  # consecutive rows (``Reducer.add_many``'s): a slice, kept per layout
        if (type(at) is range and at.step == 1) or type(at) is slice:  # (``rows_at``, inline: several times a step)
            at = slice(at.start + offset, at.stop + offset)
        elif offset or not isinstance(at, np.ndarray):
            at = np.asarray(at, dtype=np.int64) + offset
        self._blocks.append((series, iterations, at))
        return at

    def take(self, reducer: Reducer, *, wait: bool) -> None:
        """Take the reducer's rows: on the host they are computed already; from a device they start on their
        way (read at ``finish``) unless ``wait``. Rows computed on the host already stay in the reducer unless
        ``wait``: ``finish`` takes them with the rest, in one piece."""
        if not wait and reducer.ready:
            return
        rows = reducer.take_ready()
        if rows is None:
            collected = reducer.collect_later()
            if wait or not collected.travelling:
                collected.rows()
            self._chunks.append(collected)
            self._taken += len(collected)
        elif len(rows):
            self._chunks.append(rows)
            self._taken += len(rows)

    def read(self, at: slice | np.ndarray, report: Callable[[list[Failure]], None]) -> np.ndarray:
        """Rows at ``at`` (as ``add`` made them) among those taken, waiting for a device where needed."""
        return self._joined(report)[at]

    def finish(self, reducer: Reducer, report: Callable[[list[Failure]], None]) -> SummaryRows:
        """The step's rows: the reducer's last rows taken, every chunk read (``report`` gets the rows that
        could not be computed, once), the blocks' rows put next to their series."""
        self.take(reducer, wait=True)
        data = self._joined(report)
        if not self._blocks:
            return SummaryRows.empty()
        series, iterations, order = _layout(self._blocks)
        if order is not None:
            return SummaryRows(series, iterations, data[order])
        return SummaryRows(series, iterations, data if len(data) == len(series) else data[:len(series)])

    def _joined(self, report: Callable[[list[Failure]], None]) -> np.ndarray:
        """Every chunk taken so far as one array (read from the devices, failures reported), kept as the one
        chunk from then on."""
        chunks = self._chunks
        if len(chunks) == 1 and type(chunks[0]) is np.ndarray:
            return chunks[0]
        if not chunks:
            return np.zeros((0, schema.NUM_FIELDS))
        parts, failures, first = [], [], 0
        for chunk in chunks:
            if type(chunk) is np.ndarray:
                parts.append(chunk)
            else:
                parts.append(chunk.rows())
                if chunk.failed and not chunk.reported:
                    chunk.reported = True
                    failures += [(first + row, reason) for row, reason in chunk.failed.items()]
            first += len(parts[-1])
        joined = parts[0] if len(parts) == 1 else np.concatenate(parts)
        self._chunks = [joined]
        if failures:
            report([(self._series_of(row), row, reason) for row, reason in sorted(failures)])
        return joined

    def _series_of(self, row: int) -> int | None:
        """The series the block holding step row ``row`` gives it (None: no block holds it)."""
        for series, _, at in self._blocks:
            if type(at) is slice:
                if at.start <= row < at.stop:
                    return int(series[row - at.start])
            elif len(hits := np.flatnonzero(at == row)):
                return int(series[hits[0]])
        return None


def _layout(blocks: list[tuple[np.ndarray, np.ndarray, slice | np.ndarray]]
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The series and iterations of ``blocks`` in the order of their rows, and the index that takes those rows
    out of the step's rows (None: they are the step's first rows, in order). Kept per layout when every array is
    read-only (the cache holds them, so an id is never reused while its entry lives)."""
    key = tuple([(id(s), id(i), (a.start, a.stop) if type(a) is slice else id(a)) for s, i, a in blocks])
    found = _LAYOUTS.get(key)
    if found is not None:
        return found[1]
    ordered = sorted(blocks, key=lambda block: _first(block[2]))
    series = np.concatenate([s for s, _, _ in ordered]) if len(ordered) > 1 else ordered[0][0]
    iterations = np.concatenate([i for _, i, _ in ordered]) if len(ordered) > 1 else ordered[0][1]
    order = np.concatenate([np.arange(a.start, a.stop) if type(a) is slice else a for _, _, a in ordered])
    identity = bool(len(order)) and order[0] == 0 and bool((np.diff(order) == 1).all())
    layout = (series, zeros(len(series)) if not np.count_nonzero(iterations) else iterations,
              None if identity or not len(order) else order)
    kept = [a for block in blocks for a in block if type(a) is np.ndarray]
    if all(not a.flags.writeable for a in kept):
        if len(ordered) > 1:
            series.flags.writeable = False
        if layout[2] is not None:
            layout[2].flags.writeable = False
        if len(_LAYOUTS) >= _LAYOUTS_KEPT:  # a loop whose layouts never repeat
            _LAYOUTS.clear()
        _LAYOUTS[key] = (kept, layout)
    return layout


def _first(at: slice | np.ndarray) -> int:
    """The first of a block's rows among the step's (blocks are laid out in that order)."""
    if type(at) is slice:
        return at.start
    return int(at.min()) if len(at) else -1


_LAYOUTS: dict[tuple, tuple[list[np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray | None]]] = {}

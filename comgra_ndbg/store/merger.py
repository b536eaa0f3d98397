"""Merging segment files on a worker thread, so that the training thread never waits for a merge.

A flush writes its level-0 segment in the caller's thread: when ``flush()`` returns, those steps are on
disk. Once ``fanout`` segments of one level exist they are merged into one of the next level, which reads
and rewrites all their data: close to a second for eight segments of a long run with snapshots, a stall
the training thread used to take every eighth flush. Here a worker thread does it; h5py lets go of the
GIL while HDF5 compresses and writes, so the merge runs beside training. Readers see the inputs or the
merged file (``list_live_segments``), exactly as before.

The worker exists only while a level is full, and is not a daemon: an interpreter that exits while it
merges lets that merge finish (a killed process leaves complete files either way). A failed merge (a full
disk) leaves its inputs as they are and stops merging in the background; ``take_error`` hands the error
to the training thread once, and ``drain`` returns every segment for ``close()`` to merge. A writer that
continues a trial ``adopt``s the files already there, so they are merged like its own.

No merge takes more than ``max_bytes`` of array bytes (``Segment.nbytes``, what reading its inputs whole
would take; it holds their smaller tables and reads the rest as it writes it): of a full level it merges
the longest run of oldest files under that cap, and a file that cannot join the next one under the cap is
*sealed*, never merged in the background again, together with every older file (so that merges keep
joining neighbours only). ``close()`` groups what is left under the same cap (``group_under_cap``).
"""
from __future__ import annotations

import math
import os
import threading
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from comgra_ndbg.store.malloc_trim import trim

__all__ = ["BackgroundMerger", "Segment", "group_under_cap"]


class Segment(NamedTuple):
    """A live file of the writer: its sequence, its path, and the array bytes reading it takes."""

    sequence: int
    path: Path
    nbytes: int = 0


def group_under_cap(segments: list[Segment], max_bytes: float) -> list[list[Segment]]:
    """``segments`` (oldest first) cut into runs of neighbours whose bytes add up to at most ``max_bytes``
    (a file above the cap on its own is a run of one); greedy, so every run but the last is full.

    >>> sizes = {1: 5, 2: 4, 3: 9, 4: 1}
    >>> runs = group_under_cap([Segment(s, Path(f"seg{s}"), n) for s, n in sizes.items()], 10)
    >>> [[s.sequence for s in run] for run in runs]
    [[1, 2], [3, 4]]
    """
    runs: list[list[Segment]] = []
    total = 0
    for segment in segments:
        if runs and total + segment.nbytes <= max_bytes:
            runs[-1].append(segment)
            total += segment.nbytes
        else:
            runs.append([segment])
            total = segment.nbytes
    return runs


class BackgroundMerger:
    """The live segments of one writer, by level, and the worker thread that merges full levels.

    ``merge(inputs, level)`` writes one segment of ``level`` covering ``inputs`` and deletes them; it
    runs on the worker thread. ``max_bytes`` caps the array bytes of one merge (``math.inf``: no cap).
    """

    def __init__(self, merge: Callable[[list[Segment], int], Segment], fanout: int,
                 max_bytes: float = math.inf) -> None:
        self._merge = merge
        self.fanout = fanout
        self.max_bytes = max_bytes
        self._levels: dict[int, list[Segment]] = defaultdict(list)
        self._sealed: list[Segment] = []  # never merged in the background: close() groups them
        self._condition = threading.Condition()
        self._worker: threading.Thread | None = None
        self._process = os.getpid()  # a forked child inherits the state but not the thread
        self._stopped = False
        self._error: BaseException | None = None

    def add(self, segment: Segment, level: int = 0) -> None:
        """Register a freshly flushed level-0 segment (or an existing file of ``level``); starts merging if
        that filled a level."""
        with self._condition:
            self._levels[level].append(segment)
            if not self._stopped and not self._merging() and self._next_merge(take=False) is not None:
                self._worker = threading.Thread(target=self._work, name="comgra-ndbg-merge", daemon=False)
                self._process = os.getpid()
                self._worker.start()

    def adopt(self, segment: Segment, level: int, *, sealed: bool = False) -> None:
        """Take over a live file a previous writer of the trial left (merged later like the writer's own;
        ``sealed`` ones, the files of a closed recording, only by ``close()``). Files come oldest first, so a
        sealed one seals every file adopted before it: merges join neighbours only."""
        if sealed:
            with self._condition:
                self._sealed.extend(item for level in sorted(self._levels) for item in self._levels[level])
                self._levels.clear()
                self._sealed.append(segment)
        else:
            self.add(segment, level)

    def wait(self) -> None:
        """Return once no merge is running (and none is due)."""
        with self._condition:
            while self._merging():
                self._condition.wait()

    def take_error(self) -> BaseException | None:
        """The error of a failed background merge, once (None when there was none)."""
        with self._condition:
            error, self._error = self._error, None
        return error

    def drain(self) -> list[Segment]:
        """Stop merging, wait for a running merge, and return every live segment, oldest first."""
        with self._condition:
            self._stopped = True
            while self._merging():
                self._condition.wait()
            return sorted([item for items in self._levels.values() for item in items] + self._sealed)

    def _merging(self) -> bool:
        return self._worker is not None and self._process == os.getpid()

    def _next_merge(self, *, take: bool) -> tuple[int, list[Segment]] | None:
        """The level and inputs of the next merge (taken off their level with ``take``), or None. Of a full
        level, the longest run of its oldest files under the cap; a first file that cannot join the second
        under it is sealed, with every older file, and the level looked at again. Holds the lock."""
        for level in sorted(self._levels):
            items = self._levels[level]
            while len(items) >= self.fanout:
                run = group_under_cap(items[:self.fanout], self.max_bytes)[0]
                if len(run) >= 2:
                    if take:
                        del items[:len(run)]
                    return level, run
                self._seal(level)
        return None

    def _seal(self, level: int) -> None:
        """Seal the oldest file of ``level`` and every file of higher levels (all older than it)."""
        older = [item for other in sorted(self._levels) if other > level for item in self._levels[other]]
        for other in [other for other in self._levels if other > level]:
            self._levels[other].clear()
        self._sealed.extend(older + [self._levels[level].pop(0)])

    def _work(self) -> None:
        while True:
            with self._condition:
                due = None if self._stopped else self._next_merge(take=True)
                if due is None:
                    self._worker = None
                    self._condition.notify_all()
                    return
                level, inputs = due
            try:
                merged = self._merge(inputs, level + 1)
            except Exception as error:  # noqa: BLE001 - reported to the training thread by raise_error
                with self._condition:
                    self._levels[level][:0] = inputs
                    self._error = error
                    self._stopped = True
                continue
            finally:
                trim()  # what the merge freed in this thread's malloc arena goes back to the system
            with self._condition:
                self._levels[level + 1].append(merged)

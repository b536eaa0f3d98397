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
"""
from __future__ import annotations

import os
import threading
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

__all__ = ["BackgroundMerger"]

Segment = tuple[int, Path]  # (sequence, path)


class BackgroundMerger:
    """The live segments of one writer, by level, and the worker thread that merges full levels.

    ``merge(inputs, level)`` writes one segment of ``level`` covering ``inputs`` and deletes them; it
    runs on the worker thread.
    """

    def __init__(self, merge: Callable[[list[Segment], int], Segment], fanout: int) -> None:
        self._merge = merge
        self.fanout = fanout
        self._levels: dict[int, list[Segment]] = defaultdict(list)
        self._condition = threading.Condition()
        self._worker: threading.Thread | None = None
        self._process = os.getpid()  # a forked child inherits the state but not the thread
        self._stopped = False
        self._error: BaseException | None = None

    def add(self, sequence: int, path: Path, level: int = 0) -> None:
        """Register a freshly flushed level-0 segment (or an existing file of ``level``); starts merging if
        that filled a level."""
        with self._condition:
            self._levels[level].append((sequence, path))
            if not self._stopped and not self._merging() and self._full_level() is not None:
                self._worker = threading.Thread(target=self._work, name="comgra-ndbg-merge", daemon=False)
                self._process = os.getpid()
                self._worker.start()

    def adopt(self, sequence: int, path: Path, level: int) -> None:
        """Take over a live file a previous writer of the trial left (merged later like the writer's own)."""
        self.add(sequence, path, level)

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
            return sorted(item for items in self._levels.values() for item in items)

    def _merging(self) -> bool:
        return self._worker is not None and self._process == os.getpid()

    def _full_level(self) -> int | None:
        return next((level for level in sorted(self._levels) if len(self._levels[level]) >= self.fanout), None)

    def _work(self) -> None:
        while True:
            with self._condition:
                level = None if self._stopped else self._full_level()
                if level is None:
                    self._worker = None
                    self._condition.notify_all()
                    return
                inputs = self._levels[level][:self.fanout]
                del self._levels[level][:self.fanout]
            try:
                merged = self._merge(inputs, level + 1)
            except Exception as error:  # noqa: BLE001 - reported to the training thread by raise_error
                with self._condition:
                    self._levels[level][:0] = inputs
                    self._error = error
                    self._stopped = True
                continue
            with self._condition:
                self._levels[level + 1].append(merged)

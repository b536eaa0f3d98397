"""The recording writer: buffers rows in numpy, flushes them as atomically renamed segment files.

Flushes happen when the recorder asks (by time or step count), segments of one level are merged into one
of the next level once ``fanout`` of them exist (so a long run keeps a logarithmic number of files; on a
worker thread, see ``merger``), and ``close`` merges everything into ``recording.h5``. No merge takes more
than ``max_file_bytes`` of array bytes (it holds its inputs' smaller tables in memory): a recording larger
than that ends as several files of about that size, the last of them ``recording.h5``, whose
``parts`` attribute names them all (``consolidate``). A process killed at any moment leaves every flushed
step readable: files with final names are complete, and a merge only deletes what a complete, renamed
merged file already covers.

Storage failures (a full disk, a vanished folder) never raise into the training loop: they go to
``report`` (the recorder's problems log: a warning and a row of the recording's ``log`` table), and the
rows that failed to be written are kept and written by a later flush, up to ``MAX_UNWRITTEN_BYTES``; beyond
that the oldest are given up, and the report names their steps.
"""
from __future__ import annotations

import errno
import json
import math
import os
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from comgra_ndbg.errors import InvalidArgumentError
from comgra_ndbg.store import schema
from comgra_ndbg.store.buffers import RowBuffers
from comgra_ndbg.store.catalog import Catalog
from comgra_ndbg.store.damage import step_text
from comgra_ndbg.store.live import FINAL_LEVEL, list_live_segments
from comgra_ndbg.store.lock import WriterLock
from comgra_ndbg.store.malloc_trim import trim
from comgra_ndbg.store.consolidate import consolidate, merge_files
from comgra_ndbg.store.merger import BackgroundMerger, Segment
from comgra_ndbg.store.segment import SegmentContent, SnapshotData, array_bytes, segment_name, write_segment
from comgra_ndbg.store.trial import ExistingTrial, check_trial_name, existing_trial, prepare_trial_folder
from comgra_ndbg.store.value_blocks import ValueBlocks

__all__ = ["RecordingWriter", "list_live_segments", "check_trial_name", "FINAL_LEVEL", "Report",
           "DEFAULT_MAX_FILE_BYTES", "check_max_file_bytes"]

DEFAULT_MAX_FILE_BYTES = 256 * 2**20
"""Array bytes one merge may put into one file (the smaller tables of which a merge holds in memory)."""


def check_max_file_bytes(value: object) -> float:
    """``max_file_bytes`` as given by the user: a positive int, or None for no cap (``math.inf``)."""
    if value is None:
        return math.inf
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InvalidArgumentError(f"max_file_bytes must be a positive int (array bytes per merged file, default "
                                   f"{DEFAULT_MAX_FILE_BYTES}) or None for no cap, got {value!r}")
    return int(value)

Report = Callable[[int, str, str, str, dict], None]
"""``report(step, category, subject, message, detail)``: who hears of a problem (the recorder's problems log
warns, with counts); the writer itself adds it to the recording's ``log`` table."""


class RecordingWriter:
    """Buffers one trial's rows and writes them as segments into ``directory``.

    ``mode`` and ``overwrite`` as for ``Recorder`` (``store/trial.py``); with ``mode="a"`` on an existing
    trial, :attr:`existing` holds what the trial already has (its catalog and last recorded step).
    ``max_file_bytes`` caps the array bytes of a merged file (None: no cap, one ``recording.h5`` always).
    """

    MAX_UNWRITTEN_BYTES = 256 * 2**20  # rows kept for a retry after failed writes, at most

    def __init__(self, directory: Path, trial: str, *, mode: str = "w-", overwrite: bool = False,
                 config: dict | None = None, fanout: int = 8, report: Report | None = None,
                 max_file_bytes: int | None = DEFAULT_MAX_FILE_BYTES) -> None:
        self.max_file_bytes = check_max_file_bytes(max_file_bytes)
        self.directory = Path(directory)
        self.trial = trial
        self.fanout = fanout
        self.report = report or _warn
        self.config_json = json.dumps(config or {}, sort_keys=True, default=str)
        resume = prepare_trial_folder(self.directory, trial, mode, overwrite)
        self.existing = existing_trial(self.directory) if resume else ExistingTrial()
        self.recording_id = self.existing.recording_id
        self.created = self.existing.created or time.time()
        self._sequence = self.existing.last_sequence
        self._lock = WriterLock(self.directory, self.recording_id)
        try:
            self._lock.acquire(self._sequence)
        except OSError as error:
            raise InvalidArgumentError(f"cannot write into {self.directory} ({error.strerror or error}); pass a "
                                       f"folder you can write to") from error
        self._merger = BackgroundMerger(self._merge, fanout, self.max_file_bytes)
        for sequence, level, path in self.existing.live:
            self._merger.adopt(Segment(sequence, path, array_bytes(path)), level, sealed=level >= FINAL_LEVEL)
        self._spare_blocks: list[np.ndarray] = []  # value blocks of written segments, for the next ones to fill
        self._buffers = RowBuffers(self._spare_blocks, self.directory)
        self._failures = 0
        self._unwritten: list[tuple[int, SegmentContent]] = []  # taken from the buffers, not yet on disk
        self._job: _BackgroundWrite | None = None
        self.closed = False

    # ---- buffering -------------------------------------------------------------------------------------
    @property
    def pending_steps(self) -> int:
        return len(self._buffers.steps)

    def add_step(self, step: int, step_type: int, iterations: int, flags: int, reason: str,
                 when: float | None = None) -> None:
        self._buffers.steps.append((step, step_type, iterations, time.time() if when is None else when, flags,
                                    reason))

    def add_summaries(self, step: int, iteration: int, series: np.ndarray, rows: np.ndarray) -> None:
        """Rows ``[k, NUM_FIELDS]`` of the series ids ``[k]`` at one (step, iteration)."""
        self._buffers.summaries.add(step, iteration, np.asarray(series, np.int64), rows)

    def add_snapshot(self, step: int, iteration: int, series: int, data: SnapshotData) -> None:
        self._buffers.add_snapshot(step, iteration, series, data)

    def add_kpi(self, step: int, kpi: int, value: float, step_type: int) -> None:
        self._buffers.kpis.append((step, kpi, value, step_type))

    def add_note(self, step: int, text: str, when: float | None = None) -> None:
        self._buffers.notes.append((step, time.time() if when is None else when, text))

    def add_trigger(self, step: int, reason: str) -> None:
        """Mark that a flight-recorder trigger fired at ``step``."""
        self._buffers.triggers.append((step, reason))

    def add_profile(self, step: int, modules: list[str], rows: np.ndarray) -> None:
        """Profile rows ``[len(modules), len(PROFILE_FIELDS)]`` of one profiled step (``schema.PROFILE_*``)."""
        for module, row in zip(modules, rows):
            self._buffers.profile.append((step, module, row))

    def add_process(self, step: int, row: np.ndarray) -> None:
        """The step's row of ``PROCESS_FIELDS`` (wall time and memory)."""
        self._buffers.process.append((step, row))

    def add_log(self, step: int, category: str, subject: str, message: str, detail: dict | None = None,
                when: float | None = None) -> None:
        """A row of the recording's ``log`` table, written with the step data."""
        self._buffers.add_log(step, category, subject, message, detail, when)

    def _problem(self, step: int, category: str, subject: str, message: str, detail: dict) -> None:
        """A problem of the writer's own: a row of the log table (written with the next segment that reaches
        the disk) and a report."""
        self.add_log(step, category, subject, message, detail)
        self.report(step, category, subject, message, detail)

    # ---- flushing --------------------------------------------------------------------------------------
    def flush(self, catalog: Catalog, *, wait: bool = True) -> Path | None:
        """Write everything buffered as one new segment; returns its path (None when nothing was written).

        With ``wait=False`` a worker thread writes it and the call returns at once: those steps are on disk
        once the next flush or ``close()`` returns. Failures are reported (``report``), never raised; what
        failed to be written is kept for the next flush.
        """
        self._settle()
        path = None
        if wait:
            path = self._write_buffered(catalog)
        else:
            self._write_in_background(catalog)
        self._report_merge_error()
        return path

    def poll(self) -> None:
        """Report a background write that has failed since the last look (cheap: an attribute check while
        it runs); the recorder calls this at every step."""
        job = self._job
        if job is not None and job.done and job.error is not None:
            self._settle()

    def _take_buffered(self, catalog: Catalog) -> None:
        """Move the buffered rows into a segment's content, queued for writing under the next sequence."""
        content = self._buffers.build(catalog.copy())
        self._buffers = RowBuffers(self._spare_blocks, self.directory)
        if not content.is_empty():
            self._sequence += 1
            self._unwritten.append((self._sequence, content))

    def _write_unwritten(self, *, final: bool = False, consume: bool = False) -> Path | None:
        """Write every queued content, oldest first, each as a level-0 segment; with ``final`` (a single one
        and nothing else on disk) as the consolidated file itself. Returns the last path written. ``consume``
        (at ``close()``, where a content that fails is reported lost rather than kept for a retry) lets go of
        each array once HDF5 holds it: one copy of the buffered steps less at the peak."""
        path = None
        while self._unwritten:
            sequence, content = self._unwritten[0]
            last = final and len(self._unwritten) == 1
            path = self.directory / (schema.FINAL_NAME if last else segment_name(sequence, 0))
            nbytes = content.nbytes  # before ``consume`` empties it
            write_segment(path, content, self._attrs(sequence, (sequence,), FINAL_LEVEL if last else 0,
                                                     complete=last), consume=consume)
            if not consume and isinstance(content.values, ValueBlocks):
                content.values.recycle()  # written: the next steps' values fill its blocks
            del self._unwritten[0]
            self._lock.beat(sequence)
            if not last:
                self._merger.add(Segment(sequence, path, nbytes))
        return path

    def _write_buffered(self, catalog: Catalog, *, final: bool = False, consume: bool = False) -> Path | None:
        self._take_buffered(catalog)
        try:
            path = self._write_unwritten(final=final, consume=consume)
        except Exception as error:  # noqa: BLE001 - reported; the rows stay for the next flush
            self._failed(error)
            return None
        self._failures = 0
        return path

    def _failed(self, error: BaseException) -> None:
        """Report a failed write and keep what it could not write, within ``MAX_UNWRITTEN_BYTES`` (a full
        disk may get space back); the oldest rows beyond are given up, and reported with their steps."""
        self._failures += 1
        steps = _steps_of(self._unwritten)
        code = errno.errorcode.get(getattr(error, "errno", None) or -1, "")
        self._problem(max(steps, default=-1), schema.PROBLEM_STORAGE, "segment write",
                    f"writing {len(self._unwritten)} segment file(s) into {self.directory} failed ({_describe(error)});"
                    f" their {len(steps)} steps are kept in memory and written at the next flush"
                    f"{'; free space on that disk' if code in ('ENOSPC', 'EDQUOT', 'EFBIG') else ''}",
                    {"errno": code, "error": str(error), "failures": self._failures, "steps": _span(steps)})
        dropped: list[tuple[int, SegmentContent]] = []
        while len(self._unwritten) > 1 and sum(c.nbytes for _, c in self._unwritten) > self.MAX_UNWRITTEN_BYTES:
            dropped.append(self._unwritten.pop(0))
        if dropped:
            self._renumber(dropped[0][0])
            self._report_dropped(dropped, f"they could not be written ({_describe(error)}) and the rows kept for "
                                          f"retrying exceeded {self.MAX_UNWRITTEN_BYTES // 2**20} MiB")

    def _renumber(self, first: int) -> None:
        """Give the kept contents consecutive sequences from ``first``: sequences only mean something on disk,
        and a gap there would read as a deleted file."""
        self._unwritten = [(first + i, content) for i, (_, content) in enumerate(self._unwritten)]
        self._sequence = first + len(self._unwritten) - 1

    def _report_dropped(self, dropped: list[tuple[int, SegmentContent]], why: str) -> None:
        steps = _steps_of(dropped)
        self._problem(max(steps, default=-1), schema.PROBLEM_DROPPED_ROWS, "segment write",
                    f"{len(steps)} recorded steps were lost ({step_text(steps) if steps else 'KPIs and notes only'})"
                    f": {why}", {"steps": steps})

    def _write_in_background(self, catalog: Catalog) -> None:
        self._take_buffered(catalog)
        if not self._unwritten:
            return
        job = _BackgroundWrite(os.getpid())
        job.thread = threading.Thread(target=self._run_background_write, args=(job,), name="comgra-ndbg-write",
                                      daemon=False)  # an exiting interpreter lets the write finish
        self._job = job
        job.thread.start()

    def _run_background_write(self, job: _BackgroundWrite) -> None:
        try:
            self._write_unwritten()
        except Exception as error:  # noqa: BLE001 - reported in the caller's thread by _settle
            job.error = error
        finally:
            trim()  # what the write freed in this thread's malloc arena goes back to the system
            job.done = True

    def _settle(self) -> None:
        """Wait for the background write and report its failure."""
        job, self._job = self._job, None
        if job is None:
            return
        if job.process != os.getpid():  # a forked child: the thread and what it writes are the parent's
            self._unwritten.clear()
            return
        job.thread.join()
        if job.error is not None:
            self._failed(job.error)
        else:
            self._failures = 0

    def _report_merge_error(self) -> None:
        error = self._merger.take_error()
        if error is not None:
            self._problem(-1, schema.PROBLEM_STORAGE, "merge",
                        f"merging segment files in {self.directory} in the background failed ({_describe(error)}); "
                        f"they stay as they are (every step stays readable) and close() merges them", {})

    def wait_for_merges(self) -> None:
        """Return once no segment merge runs in the background (they start when a level fills up)."""
        self._merger.wait()

    def _merge(self, inputs: list[Segment], level: int, complete: bool = False,
               parts: tuple[int, ...] = ()) -> Segment:
        """One merge, in the background or at ``close()`` (``consolidate.merge_files``)."""
        return merge_files(self.directory, inputs, level, self._attrs, complete=complete, parts=parts)

    def close(self, catalog: Catalog) -> Path | None:
        """Flush, then merge every segment into ``recording.h5`` (or, when nothing was flushed yet, write the
        buffered steps as ``recording.h5`` directly; above ``max_file_bytes``, into several files, the last
        ``recording.h5``); idempotent. A failure is reported and leaves the
        segments as they are (readable; ``mode="a"`` consolidates them later). Returns the final file, or
        None when it could not be written."""
        if self.closed:
            return self.directory / schema.FINAL_NAME
        self.closed = True
        consolidated = False
        try:
            self._settle()  # what a failed background write kept is retried right here
            self._spare_blocks.clear()  # nothing is buffered after this write: no block is to be filled again
            # A run that never flushed writes its steps straight into the final file: one write, not a
            # segment and a copy of it.
            direct = not self._merger.drain() and not self._unwritten
            written = self._write_buffered(catalog, final=direct, consume=True)  # a failure here is reported lost
            self._report_merge_error()
            if self._unwritten:
                self._report_dropped(self._unwritten, "they could not be written when the recorder closed")
                self._unwritten = []
                return None
            inputs = self._merger.drain()  # a failed background merge left its inputs: merged here
            if direct and written is not None:
                consolidated = True
                return written
            self._consolidate(inputs, catalog)
            consolidated = True
            return self.directory / schema.FINAL_NAME
        except Exception as error:  # noqa: BLE001 - reported; the segments stay readable
            self._problem(-1, schema.PROBLEM_STORAGE, "close",
                        f"consolidating {self.directory} into {schema.FINAL_NAME} failed ({_describe(error)}); its "
                        f"segment files stay as they are and readable", {"error": str(error)})
            return None
        finally:
            self._lock.release(consolidated)

    def _consolidate(self, inputs: list[Segment], catalog: Catalog) -> None:
        if not inputs:
            # An empty recording still gets a file, so readers can tell "nothing recorded" from "no recording".
            self._sequence += 1
            write_segment(self.directory / schema.FINAL_NAME, SegmentContent(catalog=catalog),
                          self._attrs(self._sequence, (self._sequence,), FINAL_LEVEL, complete=True))
        else:
            consolidate(self.directory, inputs, self.max_file_bytes, self._attrs, self._merge)

    def _attrs(self, sequence: int, covers: tuple[int, ...], level: int, *, complete: bool,
               parts: tuple[int, ...] = ()) -> dict:
        from comgra_ndbg import __version__

        return {
            schema.ATTR_FORMAT: schema.FORMAT_NAME,
            schema.ATTR_FORMAT_VERSION: schema.FORMAT_VERSION,
            schema.ATTR_TRIAL: self.trial,
            schema.ATTR_SEQUENCE: sequence,
            schema.ATTR_COVERS: np.array(covers, dtype=np.int64),
            schema.ATTR_LEVEL: level,
            schema.ATTR_COMPLETE: complete,
            schema.ATTR_CREATED: self.created,
            schema.ATTR_LIBRARY_VERSION: __version__,
            schema.ATTR_CONFIG: self.config_json,
            schema.ATTR_RECORDING_ID: self.recording_id,
        } | ({schema.ATTR_PARTS: np.array(parts, dtype=np.int64)} if parts else {})


def _steps_of(contents: list[tuple[int, SegmentContent]]) -> list[int]:
    return sorted({int(s) for _, content in contents for s in content.step})


def _span(steps: list[int]) -> list[int]:
    return [steps[0], steps[-1]] if steps else []


def _describe(error: BaseException) -> str:
    """``OSError(28, ...)`` as ``[Errno 28] No space left on device (ENOSPC)``."""
    code = getattr(error, "errno", None)
    name = errno.errorcode.get(code, "") if isinstance(code, int) else ""
    return f"{type(error).__name__}: {error}" + (f" ({name})" if name and name not in str(error) else "")


def _warn(step: int, category: str, subject: str, message: str, detail: dict) -> None:
    """The report of a writer used on its own: a warning."""
    warnings.warn(f"comgra_ndbg: {message}", RuntimeWarning, stacklevel=4)


@dataclass
class _BackgroundWrite:
    """One segment write running on a worker thread, and how it ended."""

    process: int  # the pid that started it: a forked child has no such thread
    thread: threading.Thread | None = None
    error: BaseException | None = None
    done: bool = False

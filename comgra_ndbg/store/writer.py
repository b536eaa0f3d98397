"""The recording writer: buffers rows in numpy, flushes them as atomically renamed segment files.

Flushes happen when the recorder asks (by time or step count), segments of one level are merged into one
of the next level once ``fanout`` of them exist (so a long run keeps a logarithmic number of files; on a
worker thread, see ``merger``), and ``close`` merges everything into ``recording.h5``. A process killed at
any moment leaves every flushed step readable: files with final names are complete, and a merge only
deletes what a complete, renamed merged file already covers.
"""
from __future__ import annotations

import json
import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from comgra_ndbg.errors import InvalidArgumentError, RecordingExistsError
from comgra_ndbg.store import schema
from comgra_ndbg.store.catalog import Catalog
from comgra_ndbg.store.index_pool import SharedPool
from comgra_ndbg.store.merger import BackgroundMerger
from comgra_ndbg.store.segment import (SegmentContent, SnapshotData, commit_file, concat, parse_segment_name,
                                       read_segment, segment_name, write_segment)

__all__ = ["RecordingWriter", "list_live_segments", "check_trial_name", "FINAL_LEVEL"]

FINAL_LEVEL = 99  # level of the consolidated file written by close()
_RESULTS_NAME = "analysis.json"  # written beside the recording by ``store.results``


def check_trial_name(trial: object) -> None:
    """A trial names one folder inside the group folder: a non-empty str without path separators, and not
    ``.`` or ``..`` (which would point at the group folder or above it).

    >>> check_trial_name("baseline-lr3e-4")
    >>> check_trial_name("../runs")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    comgra_ndbg.errors.InvalidArgumentError: trial '../runs' must name one folder inside the group folder: ...
    """
    if not isinstance(trial, str) or not trial.strip():
        raise InvalidArgumentError(f"trial must be a non-empty str (or None for a time-stamped name), got {trial!r}")
    if trial in (".", "..") or any(c in trial for c in ("/", "\\", "\0")) or (os.altsep and os.altsep in trial):
        raise InvalidArgumentError(f"trial {trial!r} must name one folder inside the group folder: no '/' or '\\', "
                                   f"not '.' or '..'; e.g. 'baseline' or 'lr3e-4'")


def _written_here(path: Path) -> bool:
    """Whether ``path``, inside a trial folder, is a file this library writes there (so ``mode='w'`` may
    delete it): the recording, its segments, the stored analysis, or a temporary file of one of them."""
    name = path.name
    if name.endswith(schema.TEMP_SUFFIX):
        name = name[:-len(schema.TEMP_SUFFIX)]
        if name.startswith(_RESULTS_NAME + "."):
            name = _RESULTS_NAME
    return path.is_file() and (name in (schema.FINAL_NAME, _RESULTS_NAME) or parse_segment_name(name) is not None)


def list_live_segments(directory: Path) -> list[tuple[int, int, Path]]:
    """Files of a trial directory that no other file covers, as (sequence, level, path), oldest first.

    A merged file's ``covers`` attribute names the sequences it replaces; a crash between renaming the
    merged file and deleting its inputs leaves both on disk, and this is where the inputs are ignored.
    """
    directory = Path(directory)
    for _ in range(_SCAN_ATTEMPTS):
        found: list[tuple[int, int, Path, frozenset[int]]] = []
        vanished = False
        for path in directory.iterdir():
            parsed = parse_segment_name(path.name)
            if parsed is not None:
                sequence, level = parsed
                covers = frozenset((sequence,)) if level == 0 else _covers(path)
            elif path.name == schema.FINAL_NAME:
                level, covers = FINAL_LEVEL, _covers(path)
                sequence = max(covers, default=0)
            else:
                continue
            if covers:
                found.append((sequence, level, path, covers))
            elif not path.exists():
                vanished = True  # merged away since the listing: the file covering it is missing from it
        if not vanished:
            break
    live = [
        (sequence, level, path)
        for sequence, level, path, covers in found
        if not any(other is not path and covers <= other_covers
                   and (len(other_covers) > len(covers) or other_level > level)
                   for _, other_level, other, other_covers in found)
    ]
    return sorted(live, key=lambda item: item[0])


_SCAN_ATTEMPTS = 20  # listings tried when merged files vanish under a concurrent merge
_COVERS_CACHE: dict[tuple[str, int, int], frozenset[int]] = {}


def _covers(path: Path) -> frozenset[int]:
    """Sequences a merged file holds (empty if the file vanished or cannot be read)."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return frozenset()
    key = (str(path), stat.st_mtime_ns, stat.st_ino)
    cached = _COVERS_CACHE.get(key)
    if cached is None:
        try:
            with h5py.File(path, "r") as f:
                cached = frozenset(int(v) for v in f.attrs[schema.ATTR_COVERS])
        except (OSError, KeyError):
            cached = frozenset()
        if len(_COVERS_CACHE) > 4096:  # a long-lived reader sees many merged files come and go
            _COVERS_CACHE.clear()
        _COVERS_CACHE[key] = cached
    return cached


class RecordingWriter:
    """Buffers one trial's rows and writes them as segments into ``directory``."""

    MAX_FAILED_FLUSHES = 3  # consecutive failed flushes after which the buffered rows are given up

    def __init__(self, directory: Path, trial: str, *, mode: str = "w-", config: dict | None = None,
                 fanout: int = 8) -> None:
        self.directory = Path(directory)
        self.trial = trial
        self.fanout = fanout
        self.created = time.time()
        self.config_json = json.dumps(config or {}, sort_keys=True, default=str)
        self._prepare(mode)
        self._sequence = 0
        self._merger = BackgroundMerger(self._merge, fanout)
        self._reset_buffers()
        self._failures = 0
        self._unwritten: list[tuple[int, SegmentContent]] = []  # taken from the buffers, not yet on disk
        self._job: _BackgroundWrite | None = None
        self.closed = False

    def _prepare(self, mode: str) -> None:
        if mode not in ("w", "w-"):
            raise InvalidArgumentError(f"mode must be 'w' (overwrite) or 'w-' (fail if the trial exists), got {mode!r}")
        check_trial_name(self.trial)
        for folder in (self.directory.parent, self.directory):
            if folder.exists() and not folder.is_dir():
                raise InvalidArgumentError(f"{folder} is a file, not a folder; pass the folder to record into "
                                           f"(trials are written to <folder>/<trial>/)")
        if self.directory.exists() and any(self.directory.iterdir()):
            if mode == "w-":
                raise RecordingExistsError(
                    f"trial {self.trial!r} already has a recording at {self.directory}; choose another trial "
                    f"name, or pass mode='w' to replace it")
            foreign = sorted(p.name for p in self.directory.iterdir() if not _written_here(p))
            if foreign:
                raise RecordingExistsError(
                    f"{self.directory} holds files that are not part of a recording ({', '.join(foreign[:3])}"
                    f"{', ...' if len(foreign) > 3 else ''}); mode='w' replaces only a recording, so nothing was "
                    f"deleted: choose another trial name or folder")
            shutil.rmtree(self.directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    # ---- buffering -------------------------------------------------------------------------------------
    def _reset_buffers(self) -> None:
        self._steps: list[tuple[int, int, int, float, int, str]] = []
        self._summaries: list[tuple[int, int, np.ndarray, np.ndarray]] = []
        self._snapshots: list[tuple[int, int, int, SnapshotData]] = []
        self._kpis: list[tuple[int, int, float, int]] = []
        self._notes: list[tuple[int, float, str]] = []
        self._triggers: list[tuple[int, str]] = []

    @property
    def pending_steps(self) -> int:
        return len(self._steps)

    def add_step(self, step: int, step_type: int, iterations: int, flags: int, reason: str,
                 when: float | None = None) -> None:
        self._steps.append((step, step_type, iterations, time.time() if when is None else when, flags, reason))

    def add_summaries(self, step: int, iteration: int, series: np.ndarray, rows: np.ndarray) -> None:
        """Rows ``[k, NUM_FIELDS]`` of the series ids ``[k]`` at one (step, iteration)."""
        self._summaries.append((step, iteration, np.asarray(series, np.int64), rows))

    def add_snapshot(self, step: int, iteration: int, series: int, data: SnapshotData) -> None:
        self._snapshots.append((step, iteration, series, data))

    def add_kpi(self, step: int, kpi: int, value: float, step_type: int) -> None:
        self._kpis.append((step, kpi, value, step_type))

    def add_note(self, step: int, text: str) -> None:
        self._notes.append((step, time.time(), text))

    def add_trigger(self, step: int, reason: str) -> None:
        """Mark that a flight-recorder trigger fired at ``step``."""
        self._triggers.append((step, reason))

    # ---- flushing --------------------------------------------------------------------------------------
    def flush(self, catalog: Catalog, *, wait: bool = True) -> Path | None:
        """Write everything buffered as one new segment; returns its path (None when nothing was buffered).

        With ``wait=False`` a worker thread writes it and the call returns at once (None): those steps are on
        disk once the next flush or ``close()`` returns. A write that failed in the background is raised by
        the next ``wait=False`` call, which writes nothing (its steps are kept and written by the call after
        it); a call that waits writes them first and raises only if that fails too. Also raises the error
        of a merge that failed in the background (after writing).
        """
        self._settle(raise_error=not wait)
        path = None
        if wait:
            path = self._write_buffered(catalog)
        else:
            self._write_in_background(catalog)
        self._merger.raise_error()
        return path

    def _take_buffered(self, catalog: Catalog) -> None:
        """Move the buffered rows into a segment's content, queued for writing under the next sequence."""
        content = self._build(catalog.copy())
        self._reset_buffers()
        if not content.is_empty():
            self._sequence += 1
            self._unwritten.append((self._sequence, content))

    def _write_unwritten(self, *, final: bool = False) -> Path | None:
        """Write every queued content, oldest first, each as a level-0 segment; with ``final`` (a single one
        and nothing else on disk) as the consolidated file itself. Returns the last path written."""
        path = None
        while self._unwritten:
            sequence, content = self._unwritten[0]
            last = final and len(self._unwritten) == 1
            path = self.directory / (schema.FINAL_NAME if last else segment_name(sequence, 0))
            write_segment(path, content, self._attrs(sequence, (sequence,), FINAL_LEVEL if last else 0,
                                                     complete=last))
            del self._unwritten[0]
            if not last:
                self._merger.add(sequence, path)
        return path

    def _write_buffered(self, catalog: Catalog, *, final: bool = False) -> Path | None:
        self._take_buffered(catalog)
        try:
            path = self._write_unwritten(final=final)
        except Exception:
            self._count_failure()
            raise
        self._failures = 0
        return path

    def _count_failure(self) -> None:
        """Keep what failed to be written for the next flush (a full disk may get space back), but not
        forever."""
        self._failures += 1
        if self._failures >= self.MAX_FAILED_FLUSHES:
            self._unwritten.clear()
            self._failures = 0

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
        except Exception as error:  # noqa: BLE001 - raised in the caller's thread by _settle
            job.error = error

    def _settle(self, *, raise_error: bool = True) -> None:
        """Wait for the background write; count its failure and (``raise_error``) raise it here."""
        job, self._job = self._job, None
        if job is None:
            return
        if job.process != os.getpid():  # a forked child: the thread and what it writes are the parent's
            self._unwritten.clear()
            return
        job.thread.join()
        if job.error is not None:
            self._count_failure()
            if raise_error:
                raise job.error

    def wait_for_merges(self) -> None:
        """Return once no segment merge runs in the background (they start when a level fills up)."""
        self._merger.wait()

    def _merge(self, inputs: list[tuple[int, Path]], level: int, complete: bool = False) -> tuple[int, Path]:
        parts, covers = [], []
        for _, path in inputs:
            with h5py.File(path, "r") as f:
                parts.append(read_segment(f))
                covers.extend(int(v) for v in f.attrs[schema.ATTR_COVERS])
        sequence = max(s for s, _ in inputs)
        name = schema.FINAL_NAME if complete else segment_name(sequence, level)
        out = self.directory / name
        write_segment(out, concat(parts), self._attrs(sequence, tuple(sorted(covers)), level, complete=complete))
        for _, path in inputs:
            if path != out:
                path.unlink(missing_ok=True)
        return sequence, out

    def close(self, catalog: Catalog) -> Path | None:
        """Flush, then merge every segment into ``recording.h5`` (or, when nothing was flushed yet, write the
        buffered steps as ``recording.h5`` directly); idempotent."""
        if self.closed:
            return self.directory / schema.FINAL_NAME
        direct = False
        try:
            self._settle(raise_error=False)  # what a failed background write kept is retried right here
            # A run that never flushed writes its steps straight into the final file: one write, not a
            # segment and a copy of it.
            direct = not self._merger.drain() and not self._unwritten
            written = self._write_buffered(catalog, final=direct)
        finally:
            inputs = self._merger.drain()  # a failed background merge left its inputs: merged here
        self.closed = True
        if direct and written is not None:
            return written
        if not inputs:
            # An empty recording still gets a file, so readers can tell "nothing recorded" from "no recording".
            self._sequence += 1
            write_segment(self.directory / schema.FINAL_NAME, SegmentContent(catalog=catalog),
                          self._attrs(self._sequence, (self._sequence,), FINAL_LEVEL, complete=True))
        elif len(inputs) == 1:
            self._promote(*inputs[0])
        else:
            self._merge(inputs, FINAL_LEVEL, complete=True)
        return self.directory / schema.FINAL_NAME

    def _promote(self, sequence: int, path: Path) -> None:
        """Make the one remaining segment the final file: a byte copy with the final attributes, renamed into
        place (crash-safe like ``write_segment``), instead of reading and recompressing all of it."""
        with h5py.File(path, "r") as f:
            covers = tuple(int(v) for v in f.attrs[schema.ATTR_COVERS])
        out = self.directory / schema.FINAL_NAME
        tmp = out.with_name(out.name + schema.TEMP_SUFFIX)
        shutil.copyfile(path, tmp)
        with h5py.File(tmp, "r+") as f:
            for key, value in self._attrs(sequence, covers, FINAL_LEVEL, complete=True).items():
                f.attrs[key] = value
        commit_file(tmp, out)
        path.unlink(missing_ok=True)

    def _attrs(self, sequence: int, covers: tuple[int, ...], level: int, *, complete: bool) -> dict:
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
        }

    def _build(self, catalog: Catalog) -> SegmentContent:
        c = SegmentContent(catalog=catalog)
        if self._steps:
            cols = list(zip(*self._steps))
            c.step = np.array(cols[0], np.int64)
            c.step_type = np.array(cols[1], np.int32)
            c.step_iterations = np.array(cols[2], np.int32)
            c.step_time = np.array(cols[3], np.float64)
            c.step_flags = np.array(cols[4], np.uint8)
            c.step_reason = np.array(cols[5], object)
        if self._summaries:
            keys = sorted({(s, it) for s, it, _, _ in self._summaries})
            position = {k: i for i, k in enumerate(keys)}
            data = np.zeros((len(catalog.series), schema.NUM_FIELDS, len(keys)), np.float64)
            data[:, schema.FIELD["min"], :] = np.inf
            data[:, schema.FIELD["max"], :] = -np.inf
            for s, it, series, rows in self._summaries:
                data[series, :, position[(s, it)]] = rows
            c.summary_step = np.array([k[0] for k in keys], np.int64)
            c.summary_iteration = np.array([k[1] for k in keys], np.int32)
            c.summary_data = data
        if self._snapshots:
            self._build_snapshots(c)
        if self._kpis:
            cols = list(zip(*self._kpis))
            c.kpi_step, c.kpi_id = np.array(cols[0], np.int64), np.array(cols[1], np.int32)
            c.kpi_value, c.kpi_type = np.array(cols[2], np.float64), np.array(cols[3], np.int32)
        if self._triggers:
            c.trigger_step = np.array([t[0] for t in self._triggers], np.int64)
            c.trigger_reason = np.array([t[1] for t in self._triggers], object)
        if self._notes:
            cols = list(zip(*self._notes))
            c.note_step, c.note_time = np.array(cols[0], np.int64), np.array(cols[1], np.float64)
            c.note_text = np.array(cols[2], object)
        return c

    def _build_snapshots(self, c: SegmentContent) -> None:
        snapshots = self._snapshots
        n = len(snapshots)
        datas = [s[3] for s in snapshots]
        c.snap_step = np.array([s[0] for s in snapshots], np.int64)
        c.snap_iteration = np.array([s[1] for s in snapshots], np.int32)
        c.snap_series = np.array([s[2] for s in snapshots], np.int32)
        c.snap_shape = np.array([_padded_shape(d.shape) for d in datas], np.int64).reshape(n, schema.MAX_RANK)
        sample_counts = np.fromiter((len(d.sample_index) for d in datas), np.int64, n)
        value_counts = np.fromiter((len(d.values) for d in datas), np.int64, n)
        c.snap_samples_count = sample_counts.astype(np.int32)
        c.snap_values_count = value_counts
        c.snap_samples_offset = np.cumsum(sample_counts) - sample_counts
        c.snap_values_offset = np.cumsum(value_counts) - value_counts
        index_pool = SharedPool()
        c.snap_index_offset = np.fromiter((-1 if d.value_index is None else index_pool.add(d.value_index)
                                           for d in datas), np.int64, n)
        c.snap_subsampled = c.snap_index_offset >= 0
        c.sample_index = np.concatenate([d.sample_index for d in datas]).astype(np.int64, copy=False)
        c.sample_category = np.full(int(sample_counts.sum()), "", dtype=object)
        for i in [i for i, d in enumerate(datas) if d.sample_category is not None]:
            c.sample_category[c.snap_samples_offset[i]:c.snap_samples_offset[i] + sample_counts[i]] = \
                datas[i].sample_category
        c.sample_stats = np.concatenate([d.sample_stats for d in datas]).reshape(-1, schema.NUM_FIELDS)
        c.values = np.concatenate([d.values for d in datas]).astype(np.float32, copy=False)
        c.value_index = index_pool.array()


def _padded_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """A snapshot's shape as a row of the shape table: its first ``MAX_RANK`` dimensions, ``-1`` padded."""
    shape = tuple(shape[: schema.MAX_RANK])
    return shape + (-1,) * (schema.MAX_RANK - len(shape))


@dataclass
class _BackgroundWrite:
    """One segment write running on a worker thread, and how it ended."""

    process: int  # the pid that started it: a forked child has no such thread
    thread: threading.Thread | None = None
    error: BaseException | None = None

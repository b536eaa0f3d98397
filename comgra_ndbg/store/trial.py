"""Opening a trial folder for writing: create it, replace it (``overwrite=True``) or continue it (``mode="a"``).

A trial folder that holds steps is never replaced by accident: ``mode="w-"`` (the default) refuses it, and
``mode="w"`` replaces it only with ``overwrite=True`` (a killed run's steps are exactly what its owner wants
to look at). ``mode="a"`` continues it after its last recorded step, whether it was finished or killed:
:func:`existing_trial` reads what the new writer needs to go on (catalog, sequence numbers, the trial's
``recording_id``) and refuses a damaged trial, which ``comgra-ndbg check --salvage`` repairs first.
"""
from __future__ import annotations

import os
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

from comgra_ndbg.errors import InvalidArgumentError, RecordingExistsError
from comgra_ndbg.store import schema
from comgra_ndbg.store.catalog import Catalog
from comgra_ndbg.store.damage import READ_ERRORS, Damage, corrupt_error
from comgra_ndbg.store.live import scan_trial
from comgra_ndbg.store.lock import read_lock
from comgra_ndbg.store.segment import parse_segment_name

__all__ = ["MODES", "MAX_TRIAL_BYTES", "ExistingTrial", "check_trial_name", "prepare_trial_folder",
           "existing_trial"]

MODES = ("w-", "w", "a")
MAX_TRIAL_BYTES = 200  # a folder name: 255 bytes on most file systems, with room for names derived from it
_RESULTS_NAME = "analysis.json"  # written beside the recording by ``store.results``


def check_trial_name(trial: object) -> None:
    """A trial names one folder inside the group folder: a non-empty str without path separators or NUL, not
    ``.`` or ``..`` (which would point at the group folder or above it), and at most 200 bytes of UTF-8.

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
    size = len(trial.encode("utf-8", "surrogatepass"))
    if size > MAX_TRIAL_BYTES:
        raise InvalidArgumentError(f"trial name is {size} bytes long ({trial[:40]!r}…); a trial names a folder, so "
                                   f"keep it to {MAX_TRIAL_BYTES} bytes of UTF-8")
    try:
        trial.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgumentError(f"trial {trial!r} holds a lone surrogate, which no file system can store; "
                                   f"use plain text") from None


def _written_here(path: Path) -> bool:
    """Whether ``path``, inside a trial folder, is a file this library writes there (so ``overwrite=True``
    may delete it): the recording, its segments, the lock, the stored analysis, or a temporary file of one."""
    name = path.name
    if name.endswith(schema.TEMP_SUFFIX):
        name = name[:-len(schema.TEMP_SUFFIX)]
        if name.startswith(_RESULTS_NAME + "."):
            name = _RESULTS_NAME
    return path.is_file() and (name in (schema.FINAL_NAME, _RESULTS_NAME, schema.LOCK_NAME)
                               or parse_segment_name(name) is not None)


def prepare_trial_folder(directory: Path, trial: str, mode: str, overwrite: bool) -> bool:
    """Check ``mode`` against what ``directory`` holds, replace it where asked, create it; returns whether an
    existing recording is to be continued (``mode="a"`` on a trial with files)."""
    if mode not in MODES:
        raise InvalidArgumentError(f"mode must be 'w-' (fail if the trial exists), 'w' (replace it, with "
                                   f"overwrite=True) or 'a' (continue it), got {mode!r}")
    if not isinstance(overwrite, bool):
        raise InvalidArgumentError(f"overwrite must be True or False, got {overwrite!r}")
    check_trial_name(trial)
    for folder in (directory.parent, directory):
        if folder.exists() and not folder.is_dir():
            raise InvalidArgumentError(f"{folder} is a file, not a folder; pass the folder to record into "
                                       f"(trials are written to <folder>/<trial>/)")
    occupied = directory.exists() and any(directory.iterdir())
    if occupied and mode == "a" and not overwrite:
        return any(_written_here(p) and not p.name.endswith(schema.TEMP_SUFFIX) and p.name != schema.LOCK_NAME
                   for p in directory.iterdir())
    if occupied:
        _replace(directory, trial, mode, overwrite)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / (schema.LOCK_NAME + schema.TEMP_SUFFIX)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        raise InvalidArgumentError(f"cannot write into {directory} ({error.strerror or error}); pass a folder you can "
                                   f"write to, on a disk with free space") from error
    return False


def _replace(directory: Path, trial: str, mode: str, overwrite: bool) -> None:
    ours = [p for p in directory.iterdir() if _written_here(p)]
    foreign = sorted(p.name for p in directory.iterdir() if not _written_here(p))
    if foreign and (mode == "w" or not ours):
        raise RecordingExistsError(
            f"{directory} holds files that are not part of a recording ({', '.join(foreign[:3])}"
            f"{', ...' if len(foreign) > 3 else ''}); a trial is only ever replaced when it holds nothing but a "
            f"recording, so nothing was deleted: choose another trial name or folder")
    if not overwrite:
        hint = "pass mode='a' to continue it after its last recorded step, or overwrite=True to delete it"
        if mode == "w-":
            hint = "choose another trial name, " + hint
        raise RecordingExistsError(f"trial {trial!r} already has a recording at {directory}; {hint}")
    lock = read_lock(directory)
    if lock is not None and lock.held:
        raise RecordingExistsError(f"trial {trial!r} at {directory} is being written by process {lock.pid} on "
                                   f"{lock.host} right now; it cannot be replaced while it runs")
    shutil.rmtree(directory)


@dataclass
class ExistingTrial:
    """What a writer continuing a trial starts from."""

    catalog: Catalog = field(default_factory=Catalog)
    recording_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: float | None = None
    last_sequence: int = 0
    last_step: int | None = None
    live: list[tuple[int, int, Path]] = field(default_factory=list)  # (sequence, level, path), oldest first
    killed: bool = False


def existing_trial(directory: Path) -> ExistingTrial:
    """Read a trial to continue it: its newest catalog, identity, last sequence and last recorded step; removes
    what a killed writer left behind (temporary files, inputs of a merge that a complete file covers).
    Raises ``CorruptRecordingError`` for a damaged trial and ``RecordingExistsError`` for one still written."""
    lock = read_lock(directory)
    if lock is not None and lock.held:
        raise RecordingExistsError(f"trial folder {directory} is being written by process {lock.pid} on {lock.host} "
                                   f"right now; it can be continued once that process has ended")
    scan = scan_trial(directory)
    damage = [Damage("unreadable", path, "the file cannot be read", why) for path, why in scan.unreadable]
    damage += [Damage("foreign", path, "a file of another recording", f"recording_id {identity}")
               for path, identity in scan.foreign]
    damage += [Damage("missing", None, "segment files are missing", sequences=run) for run in scan.missing]
    if not scan.live and not damage:
        return ExistingTrial()
    try:
        found = _read_existing(scan.live) if not damage else None
    except READ_ERRORS as error:
        damage.append(Damage("unreadable", scan.live[-1][2], "the newest file cannot be read", str(error)))
    if damage:
        raise corrupt_error(directory, damage)
    live_names = {path.name for *_, path in scan.live}
    for path in sorted(directory.iterdir()):  # what a killed writer left behind, already covered or never read
        if path.name.endswith(schema.TEMP_SUFFIX) or (parse_segment_name(path.name) and path.name not in live_names):
            path.unlink(missing_ok=True)
    found.live = scan.live
    found.killed = lock is not None or not any(level >= 99 for _, level, _ in scan.live)
    return found


def _read_existing(live: list[tuple[int, int, Path]]) -> ExistingTrial:
    from comgra_ndbg.store.live import file_identity

    found = ExistingTrial()
    last_steps = []
    for _, _, path in live:
        with h5py.File(path, "r") as f:
            covers = f.attrs[schema.ATTR_COVERS]
            found.last_sequence = max(found.last_sequence, int(np.max(covers)))
            steps = f[schema.STEPS_STEP][()] if schema.STEPS_STEP in f else np.zeros(0, np.int64)
            kpis = f[schema.KPI_STEP][()] if schema.KPI_STEP in f else np.zeros(0, np.int64)
            if len(steps) or len(kpis):
                last_steps.append(int(max(np.max(steps, initial=-1), np.max(kpis, initial=-1))))
            if path == live[-1][2]:
                found.catalog = Catalog.read(f)
                found.recording_id = file_identity(f.attrs)
                found.created = float(f.attrs.get(schema.ATTR_CREATED, 0.0))
    found.last_step = max(last_steps) if last_steps else None
    return found

"""Which files of a trial folder hold the trial, and which are damaged, foreign or missing.

A merged file's ``covers`` attribute names the sequences it replaces; a crash between renaming the merged
file and deleting its inputs leaves both on disk, and :func:`scan_trial` ignores the inputs (the *covers
rule*, ``docs/format.md``). It also reports, instead of passing over them in silence:

- files under a final name that cannot be opened or whose attributes cannot be read (*unreadable*),
- files of another recording (*foreign*: a different ``recording_id``, or for version-1 files a different
  trial name and start time),
- sequences no file covers although a later one, or the writer's lock, shows they were written (*missing*).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import h5py

from comgra_ndbg.store import schema
from comgra_ndbg.store.damage import READ_ERRORS
from comgra_ndbg.store.lock import LockInfo, read_lock
from comgra_ndbg.store.segment import parse_segment_name

__all__ = ["FINAL_LEVEL", "FileHeader", "TrialScan", "scan_trial", "list_live_segments", "file_identity",
           "read_header", "consolidated"]

FINAL_LEVEL = 99  # level of the consolidated file written by close()
_SCAN_ATTEMPTS = 20  # listings tried when merged files vanish under a concurrent merge


@dataclass(frozen=True)
class FileHeader:
    """The root attributes a scan needs: sequences covered, level, and whose recording the file is."""

    covers: frozenset[int]
    level: int
    identity: str


@dataclass
class TrialScan:
    """The result of :func:`scan_trial`; ``live`` is what a reader reads, oldest first."""

    live: list[tuple[int, int, Path]] = field(default_factory=list)  # (sequence, level, path)
    unreadable: list[tuple[Path, str]] = field(default_factory=list)  # (path, why)
    foreign: list[tuple[Path, str]] = field(default_factory=list)  # (path, its identity)
    missing: list[tuple[int, ...]] = field(default_factory=list)  # runs of consecutive missing sequences
    identity: str = ""
    lock: LockInfo | None = None
    temporary: list[Path] = field(default_factory=list)  # *.tmp left by an interrupted write: never read

    @property
    def damaged(self) -> bool:
        return bool(self.unreadable or self.foreign or self.missing)


def file_identity(attrs: h5py.AttributeManager) -> str:
    """Whose recording a file belongs to: its ``recording_id``, or for version-1 files, which have none,
    the trial name and the time its writer started (the same in every file one writer wrote)."""
    identity = attrs.get(schema.ATTR_RECORDING_ID)
    if identity is not None:
        return identity.decode() if isinstance(identity, bytes) else str(identity)
    return f"v1:{attrs.get(schema.ATTR_TRIAL, '')}:{float(attrs.get(schema.ATTR_CREATED, 0.0))!r}"


_HEADERS: dict[tuple[str, int, int, int], FileHeader] = {}


def read_header(path: Path) -> FileHeader | None:
    """The header of a file with a final name (cached while the file stays the same); None when the file
    vanished; raises one of ``READ_ERRORS`` when it cannot be read."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    key = (str(path), stat.st_mtime_ns, stat.st_ino, stat.st_size)
    header = _HEADERS.get(key)
    if header is None:
        parsed = parse_segment_name(path.name)
        try:
            with h5py.File(path, "r") as f:
                covers = frozenset(int(v) for v in f.attrs[schema.ATTR_COVERS])
                level = int(f.attrs.get(schema.ATTR_LEVEL, FINAL_LEVEL if parsed is None else parsed[1]))
                header = FileHeader(covers, level, file_identity(f.attrs))
        except FileNotFoundError:
            return None
        if not header.covers:
            raise ValueError("its covers attribute is empty")
        if len(_HEADERS) > 4096:  # a long-lived reader sees many merged files come and go
            _HEADERS.clear()
        _HEADERS[key] = header
    return header


def scan_trial(directory: Path) -> TrialScan:
    """The live files of a trial folder, and what is wrong with the others (see the module docstring)."""
    directory = Path(directory)
    lock = read_lock(directory)  # before the listing: what the lock names is then on disk in the listing
    for _ in range(_SCAN_ATTEMPTS):
        scan = _scan_once(directory, lock)
        if scan is not None:
            return scan
    return _scan_once(directory, lock, settle=True)


def _scan_once(directory: Path, lock: LockInfo | None, settle: bool = False) -> TrialScan | None:
    found: list[tuple[int, int, Path, FileHeader]] = []
    scan = TrialScan(lock=lock)
    for path in sorted(directory.iterdir()):
        name = path.name
        if name.endswith(schema.TEMP_SUFFIX):
            scan.temporary.append(path)
            continue
        parsed = parse_segment_name(name)
        if parsed is None and name != schema.FINAL_NAME:
            continue
        try:
            header = read_header(path)
        except READ_ERRORS as error:
            if not path.exists():
                return None if not settle else scan
            scan.unreadable.append((path, _why(error)))
            continue
        if header is None:  # merged away since the listing: the file covering it is missing from it
            if settle:
                continue
            return None
        sequence = parsed[0] if parsed is not None else max(header.covers)
        found.append((sequence, header.level, path, header))
    scan.identity = _trial_identity(found, lock)
    own = []
    for item in found:
        if item[3].identity == scan.identity:
            own.append(item)
        else:
            scan.foreign.append((item[2], item[3].identity))
    scan.live = sorted(((sequence, level, path) for sequence, level, path, header in own
                        if not any(other is not path and header.covers <= other_header.covers
                                   and (len(other_header.covers) > len(header.covers) or other_level > level)
                                   for _, other_level, other, other_header in own)), key=lambda item: item[0])
    covered = set().union(*(header.covers for *_, header in own)) if own else set()
    last = max(covered | {lock.last_sequence if lock is not None and lock.recording_id == scan.identity else 0}
               | {parse_segment_name(p.name)[0] for p, _ in scan.unreadable if parse_segment_name(p.name)})
    scan.missing = _runs(sorted(set(range(1, last + 1)) - covered))
    return scan


def _trial_identity(found: list, lock: LockInfo | None) -> str:
    """The trial's own identity: the lock's, else the consolidated file's, else the most common (ties: the
    file written first)."""
    if lock is not None and lock.recording_id:
        return lock.recording_id
    final = [header.identity for _, level, _, header in found if level == FINAL_LEVEL]
    if final:
        return final[0]
    if not found:
        return ""
    counts = Counter(header.identity for *_, header in found)
    best = max(counts.values())
    return next(header.identity for *_, header in sorted(found, key=lambda item: item[0])
                if counts[header.identity] == best)


def _runs(values: list[int]) -> list[tuple[int, ...]]:
    runs: list[list[int]] = []
    for v in values:
        if runs and v == runs[-1][-1] + 1:
            runs[-1].append(v)
        else:
            runs.append([v])
    return [tuple(run) for run in runs]


def _why(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return f"{type(error).__name__}: {text}"


def consolidated(sequences: list[int], complete: bool, parts: tuple[int, ...]) -> bool:
    """Whether the live files of sequences ``sequences`` (oldest first) are a closed recording: the newest is
    the ``complete`` file and they are exactly the ``parts`` it names (itself alone when it names none).

    >>> consolidated([8, 20], True, (8, 20)), consolidated([8, 20, 21], True, (8, 20)), consolidated([9], True, ())
    (True, False, True)
    """
    return bool(sequences) and complete and sequences == list(parts or sequences[-1:])


def list_live_segments(directory: Path) -> list[tuple[int, int, Path]]:
    """Files of a trial directory that hold the trial, as (sequence, level, path), oldest first (the covers
    rule; damaged and foreign files left out: :func:`scan_trial` reports them)."""
    return scan_trial(directory).live

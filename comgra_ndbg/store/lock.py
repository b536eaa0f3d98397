"""The writer's lock file: who writes a trial, whether it still runs, and how far it got.

``writer.lock`` in the trial folder is created when a writer opens the trial and removed by ``close()``.
The writing process holds an exclusive ``flock`` on it for its lifetime, which the kernel drops when the
process dies however it dies, so another process on the same machine can tell a live trial from a killed
one without trusting a pid that may have been reused. Inside is one JSON object, rewritten in place after
every segment that reaches the disk: pid, host, start time, the trial's ``recording_id``, the last sequence
number committed and the time of that commit (the heartbeat). The last sequence lets a reader notice that
the newest segment files were deleted, which nothing else would show.

Where ``flock`` is missing (Windows) or does not reach across machines (some network file systems), the
state falls back to the pid (same host) or is reported as unknown.
"""
from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from comgra_ndbg.errors import RecordingExistsError
from comgra_ndbg.store import schema

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

__all__ = ["LockInfo", "WriterLock", "read_lock", "trial_state", "LIVE", "FINISHED", "KILLED", "INCOMPLETE"]

LIVE, FINISHED, KILLED, INCOMPLETE = "live", "finished", "killed", "incomplete"
_SIZE = 1024  # the record is padded to this size and rewritten in place, never truncated


@dataclass(frozen=True)
class LockInfo:
    """What a lock file says, and whether its writer still holds it (None: cannot tell)."""

    path: Path
    pid: int
    host: str
    started: float
    heartbeat: float
    last_sequence: int
    recording_id: str
    held: bool | None
    closed: bool = False  # closed without consolidating (a failed final write): not killed


class WriterLock:
    """The lock of one writer: :meth:`acquire` at open, :meth:`beat` after each commit, :meth:`release`."""

    def __init__(self, directory: Path, recording_id: str) -> None:
        self.path = Path(directory) / schema.LOCK_NAME
        self.recording_id = recording_id
        self.started = time.time()
        self.last_sequence = 0
        self._fd: int | None = None
        self._pid = os.getpid()

    def acquire(self, last_sequence: int = 0) -> None:
        """Take the lock; raises ``RecordingExistsError`` when a live process holds it."""
        self.last_sequence = last_sequence
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                info = read_lock(self.path.parent)
                who = f"process {info.pid} on {info.host}" if info is not None else "another process"
                raise RecordingExistsError(
                    f"trial folder {self.path.parent} is being written by {who} right now; wait for it to finish, "
                    f"or record into another trial") from None
        self._fd = fd
        self.beat(last_sequence)

    def beat(self, last_sequence: int | None = None, *, closed: bool = False) -> None:
        """Record that sequence ``last_sequence`` is on disk (the heartbeat); never raises."""
        if self._fd is None or os.getpid() != self._pid:  # a forked child does not speak for the writer
            return
        if last_sequence is not None:
            self.last_sequence = max(self.last_sequence, last_sequence)
        record = json.dumps({"pid": self._pid, "host": socket.gethostname(), "started": self.started,
                             "heartbeat": time.time(), "last_sequence": self.last_sequence,
                             "recording_id": self.recording_id, "closed": closed}).encode()
        try:
            os.pwrite(self._fd, record.ljust(_SIZE), 0)
        except OSError:  # a full disk: the data writes report it; the heartbeat is only a hint
            pass

    def release(self, consolidated: bool = True) -> None:
        """Let go of the lock (``close()`` calls this last): remove the file once the trial is consolidated,
        else keep it, marked closed, so the trial does not read as killed."""
        if self._fd is None:
            return
        if os.getpid() == self._pid:
            if consolidated:
                try:
                    self.path.unlink()
                except OSError:  # already gone or not removable: a stale lock is taken over by its heartbeat
                    pass
            else:
                self.beat(closed=True)
        os.close(self._fd)
        self._fd = None


def read_lock(directory: Path) -> LockInfo | None:
    """The lock of the trial folder ``directory``, or None when it has none (closed, or written by a version
    without locks)."""
    path = Path(directory) / schema.LOCK_NAME
    for _ in range(3):  # a read that overlaps the writer's in-place rewrite is taken again
        try:
            with open(path, "rb") as f:
                data = json.loads(f.read().decode("utf-8", "replace").strip() or "{}")
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            time.sleep(0.01)
            continue
        if data:
            return LockInfo(path, int(data.get("pid", -1)), str(data.get("host", "")),
                            float(data.get("started", 0.0)), float(data.get("heartbeat", 0.0)),
                            int(data.get("last_sequence", 0)), str(data.get("recording_id", "")), _held(path, data),
                            bool(data.get("closed", False)))
    return None


def _held(path: Path, data: dict) -> bool | None:
    """Whether a live process holds the lock: by ``flock`` where there is one, else by pid on this host."""
    if fcntl is not None:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return True
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False
        finally:
            os.close(fd)
    if data.get("host") != socket.gethostname():  # pragma: no cover - no flock and another machine
        return None
    try:  # pragma: no cover - Windows
        os.kill(int(data.get("pid", -1)), 0)
    except OSError:  # pragma: no cover
        return False
    return True  # pragma: no cover


def trial_state(directory: Path, complete: bool) -> tuple[str, LockInfo | None]:
    """``live``, ``finished``, ``killed`` or ``incomplete`` (not closed, no lock to tell why: written by a
    version without locks, or its lock was deleted), with the lock that says so."""
    lock = read_lock(directory) if Path(directory).is_dir() else None
    if lock is not None and lock.held:
        return LIVE, lock
    if complete:
        return FINISHED, lock
    if lock is not None and lock.held is False and not lock.closed:
        return KILLED, lock
    return INCOMPLETE, lock

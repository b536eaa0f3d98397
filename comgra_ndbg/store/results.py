"""Analysis results stored with a recording: one JSON file per trial, replaced atomically.

``analysis.json`` lies in the trial directory (next to the segment files; for a recording that is a single
``.h5`` file, ``<stem>.analysis.json`` beside it). It is written to a temporary name in the same
directory, flushed and fsynced, then renamed over the old file, and the directory is fsynced: a reader sees
the old results or the new ones, never a torn file, even if the writer is killed. The payload carries the
number of steps and the last step the analysis saw, so results of a recording that has grown since are
recognisable as stale.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from comgra_ndbg.errors import RecordingFormatError
from comgra_ndbg.store.segment import fsync_directory

__all__ = ["RESULTS_NAME", "RESULTS_FORMAT", "RESULTS_VERSION", "StoredAnalysis", "results_path",
           "write_results", "read_results"]

RESULTS_NAME = "analysis.json"
RESULTS_FORMAT = "comgra_ndbg.analysis"
RESULTS_VERSION = 1


@dataclass(frozen=True)
class StoredAnalysis:
    """Results read back: ``diagnosis`` is the plain dict the analysis wrote; ``stale`` is True when the
    recording now holds a different number of steps than the analysis saw."""

    path: Path
    num_steps: int
    last_step: int
    created: float
    diagnosis: dict
    stale: bool


def results_path(location: str | Path) -> Path:
    """Where the results of the recording at ``location`` (a trial directory or one ``.h5`` file) live."""
    location = Path(location)
    if location.is_file():
        return location.with_name(location.stem + "." + RESULTS_NAME)
    return location / RESULTS_NAME


def write_results(location: str | Path, diagnosis: dict, *, num_steps: int, last_step: int) -> Path:
    """Atomically replace the stored results of the recording at ``location``; returns the file's path."""
    path = results_path(location)
    payload = {"format": RESULTS_FORMAT, "format_version": RESULTS_VERSION, "num_steps": int(num_steps),
               "last_step": int(last_step), "created": time.time(), "diagnosis": _clean(diagnosis)}
    text = json.dumps(payload, indent=1, sort_keys=True)
    fd, temp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, _plain_file_mode())  # mkstemp makes 0600; results are as readable as the recording
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)
    return path


def _plain_file_mode() -> int:
    """The mode ``open()`` gives a new file: 0666 less the process umask (read without changing it where the
    platform reports it)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def read_results(location: str | Path, *, num_steps: int | None = None) -> StoredAnalysis | None:
    """The stored results of the recording at ``location``, or None when there are none.

    ``num_steps`` (the recording's current step count) decides ``stale``; without it nothing is stale.
    """
    path = results_path(location)
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise RecordingFormatError(f"{path} holds no readable analysis results ({error}); delete it and run "
                                   f"comgra_ndbg.analyze() again") from None
    if payload.get("format") != RESULTS_FORMAT or int(payload.get("format_version", -1)) > RESULTS_VERSION:
        raise RecordingFormatError(f"{path} is not an analysis file this version can read (format "
                                   f"{payload.get('format')!r}, version {payload.get('format_version')!r}); "
                                   f"upgrade comgra_ndbg or run comgra_ndbg.analyze() again")
    steps = int(payload["num_steps"])
    return StoredAnalysis(path, steps, int(payload["last_step"]), float(payload["created"]),
                          payload["diagnosis"], stale=num_steps is not None and num_steps != steps)


def _clean(value: object) -> object:
    """JSON-safe copy: tuples become lists, non-finite floats become strings "nan", "inf", "-inf"."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value

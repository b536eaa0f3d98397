"""Opening the files that hold a trial, and saying which steps the damaged or missing ones took with them.

``open_views`` scans the trial folder (``live.scan_trial``), opens each live file (``FileView``), and turns
whatever could not be used into :class:`~comgra_ndbg.store.damage.Damage` records: unreadable and foreign
files, missing sequences, and, when the reader reads around damage, files whose index tables fail their
checksums. A file lost as a whole takes steps nobody can name any more; the records give the last step
before it and the first after it (``between``), from the neighbouring files.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from comgra_ndbg.errors import RecordingFormatError, RecordingNotFoundError
from comgra_ndbg.store import schema
from comgra_ndbg.store.damage import Damage, DamagedData
from comgra_ndbg.store.fileview import SNAPSHOT_INDEX_TABLES, FileView
from comgra_ndbg.store.live import TrialScan, scan_trial
from comgra_ndbg.store.segment import parse_segment_name

__all__ = ["open_views", "file_steps", "between"]

_LIST_ATTEMPTS = 20  # listings tried when files vanish under a concurrent merge


def open_views(location: Path, current: dict[Path, FileView], *, skip: bool
               ) -> tuple[dict[Path, FileView], list[Damage]] | None:
    """The views of the files that hold the trial now and the damage found, or None when they are exactly
    the ``current`` ones (nothing changed). Views in ``current`` are reused; new ones that turn out unusable
    are closed. With ``skip``, files whose index tables fail are left out (and reported) instead of failing
    the reader later, on first use."""
    for attempt in range(1, _LIST_ATTEMPTS + 1):
        scan = TrialScan(live=[(0, 0, location)]) if location.is_file() else scan_trial(location)
        live = [path for _, _, path in scan.live]
        if not live and not scan.damaged:
            raise RecordingNotFoundError(f"{location} holds no flushed segment yet")
        if list(current) == live and not scan.damaged:
            return None
        opened: dict[Path, FileView] = {}
        damage: list[Damage] = []
        try:
            for path in live:
                view = current.get(path)
                if view is None:
                    try:
                        view = FileView(path)
                    except DamagedData as error:
                        damage.append(Damage("unreadable", path, "the file cannot be read", error.reason))
                        continue
                if skip and view is not current.get(path):
                    try:
                        view.preload()
                    except DamagedData as error:
                        if error.dataset not in SNAPSHOT_INDEX_TABLES or not _without_snapshots(view):
                            view.close()
                            damage.append(Damage("unreadable", path, f"its index ({error.dataset}) cannot be read",
                                                 error.reason))
                            continue
                        damage.append(Damage("unreadable", path, f"its snapshots' index ({error.dataset}) cannot be "
                                             f"read: its snapshots are left out", error.reason))
                opened[path] = view
        except RecordingFormatError:
            for path, view in opened.items():
                if path not in current:
                    view.close()
            if attempt >= _LIST_ATTEMPTS or all(path.exists() for path in live):
                raise
            continue
        views = dict(sorted(opened.items(), key=lambda kv: kv[1].sequence))
        damage += _scan_damage(scan, views)
        return views, _located(damage, views)
    raise AssertionError("unreachable")  # pragma: no cover


def _without_snapshots(view: FileView) -> bool:
    """Whether ``view`` reads with its snapshots left out: every other index table intact."""
    view.drop_snapshots()
    try:
        view.preload()
    except DamagedData:
        return False
    return True


def _scan_damage(scan: TrialScan, views: dict[Path, FileView]) -> list[Damage]:
    damage = []
    for path, why in scan.unreadable:
        parsed = parse_segment_name(path.name)
        damage.append(Damage("unreadable", path, "the file cannot be read", why,
                             sequences=(parsed[0],) if parsed and parsed[1] == 0 else ()))
    for path, identity in scan.foreign:
        damage.append(Damage("foreign", path, "a file of another recording was left out",
                             f"its recording_id {identity} is not this trial's {scan.identity}"))
    for run in scan.missing:
        owner = next((path for path, _ in scan.unreadable if (parse_segment_name(path.name) or (0,))[0] in run), None)
        if owner is None:
            damage.append(Damage("missing", None, "segment files are missing (deleted?)",
                                 "no file holds these sequences, though later ones exist", sequences=run))
    return damage


def _located(damage: list[Damage], views: dict[Path, FileView]) -> list[Damage]:
    """``damage`` with ``between`` filled in for files lost as a whole, from the neighbouring views."""
    out = []
    for d in damage:
        if d.kind in ("unreadable", "missing") and not d.steps:
            sequence = min(d.sequences) if d.sequences else _sequence_of(d.file)
            if sequence is not None:
                d = Damage(d.kind, d.file, d.what, d.reason, d.steps, d.tensors, between(views, sequence),
                           d.sequences)
        out.append(d)
    return out


def _sequence_of(path: Path | None) -> int | None:
    parsed = parse_segment_name(path.name) if path is not None else None
    return parsed[0] if parsed else None


def file_steps(view: FileView) -> tuple[int, ...]:
    """The steps a file holds (from its steps table, or its KPIs for a file of skipped steps); () when its
    index cannot be read."""
    try:
        steps = np.concatenate([view.array(schema.STEPS_STEP), view.array(schema.KPI_STEP)]).astype(np.int64)
    except DamagedData:
        return ()
    return tuple(np.unique(steps).tolist())


def between(views: dict[Path, FileView], sequence: int) -> tuple[int, int]:
    """The last step recorded before sequence ``sequence`` and the first after it (-1: none)."""
    before, after = -1, -1
    for view in views.values():
        steps = file_steps(view)
        if not steps:
            continue
        if view.sequence < sequence:
            before = max(before, steps[-1])
        elif view.sequence > sequence:
            after = steps[0] if after < 0 else min(after, steps[0])
    return before, after

"""``check``: verify every file of a recording, list exactly what is damaged or missing, and salvage the rest.

For each trial: the folder is scanned (unreadable, foreign and missing segment files: ``live``), every live
file is read chunk by chunk against its checksums (``salvage.read_file``), and the trial's state (finished,
live, killed) and problems log are summarised. ``salvage=True`` copies every intact row into a new trial,
``<trial>-salvaged`` beside the original (or ``out``), whose log lists what was lost (category ``damage``);
the original is never changed.

>>> import tempfile, torch
>>> from comgra_ndbg import Recorder
>>> with tempfile.TemporaryDirectory() as folder:
...     with Recorder(folder, trial="demo") as rec:
...         with rec.step(0):
...             _ = rec.register_tensor("x", torch.ones(2))
...     check(folder).ok
True
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from comgra_ndbg.errors import InvalidArgumentError, RecordingExistsError
from comgra_ndbg.store import schema
from comgra_ndbg.store.catalog import Catalog
from comgra_ndbg.store.damage import Damage
from comgra_ndbg.store.live import TrialScan, consolidated, scan_trial
from comgra_ndbg.store.lock import trial_state
from comgra_ndbg.store.salvage import FileContent, read_file
from comgra_ndbg.store.segment import parse_segment_name

__all__ = ["TrialCheck", "CheckReport", "check"]


@dataclass
class TrialCheck:
    """What ``check`` found in one trial."""

    trial: str
    location: Path
    state: str
    files: list[Path] = field(default_factory=list)
    steps: int = 0
    damage: list[Damage] = field(default_factory=list)
    problems: dict[str, int] = field(default_factory=dict)  # problems log: category -> rows
    temporary: list[Path] = field(default_factory=list)
    salvaged: Path | None = None
    salvaged_steps: int = 0

    @property
    def ok(self) -> bool:
        return not self.damage

    def text(self) -> str:
        """The report of this trial, for a terminal."""
        verdict = "OK" if self.ok else f"DAMAGED ({len(self.damage)} finding{'s' * (len(self.damage) != 1)})"
        lines = [f"trial {self.trial}: {verdict}, {self.state}, {self.steps} readable steps in {len(self.files)} "
                 f"file{'s' * (len(self.files) != 1)}, every chunk checked against its checksum"]
        lines += [f"  {d.describe()}" for d in self.damage]
        if self.temporary:
            lines.append(f"  {len(self.temporary)} temporary file(s) of an interrupted write, never read: "
                         f"{', '.join(p.name for p in self.temporary[:3])}")
        if self.problems:
            counts = ", ".join(f"{n} {category}" for category, n in sorted(self.problems.items()))
            lines.append(f"  problems log: {counts} (Recording.problems(), `comgra-ndbg info`)")
        if self.salvaged is not None:
            lines.append(f"  salvaged {self.salvaged_steps} steps into {self.salvaged} (its log lists what was lost)")
        elif not self.ok:
            lines.append(f"  run `comgra-ndbg check {self.location} --salvage` to copy everything readable into a "
                         f"new recording")
        return "\n".join(lines)


@dataclass
class CheckReport:
    """``check``'s findings for every trial; ``ok`` when nothing is damaged or missing."""

    trials: list[TrialCheck]

    @property
    def ok(self) -> bool:
        return all(t.ok for t in self.trials)

    def __str__(self) -> str:
        return "\n".join(t.text() for t in self.trials)


def check(path: str | Path, trial: str | None = None, *, salvage: bool = False, out: str | Path | None = None
          ) -> CheckReport:
    """Verify every segment of the recording at ``path`` (a group folder, a trial folder or one file).

    ``salvage=True`` writes, for each damaged trial, everything still readable into a new trial
    (``<trial>-salvaged`` beside it, or ``out`` when one trial is checked)."""
    from comgra_ndbg.store.ranks import rank_folders
    from comgra_ndbg.store.reader import _resolve

    entries = _resolve(Path(path))
    if trial is not None:
        entries = [(name, location) for name, location in entries if name == trial]
        if not entries:
            raise InvalidArgumentError(f"no trial {trial!r} in {path}")
    entries = [entry for name, location in entries for entry in  # each rank of a distributed trial on its own
               ([(f"{name}/{folder.name}", folder) for folder in rank_folders(location).values()] or [(name, location)])]
    if out is not None and len(entries) > 1:
        raise InvalidArgumentError("out= names one trial folder; pass trial= to salvage one trial of a group")
    reports = []
    for name, location in entries:
        report, contents = _check_trial(name, location)
        if salvage and not report.ok:
            target = Path(out) if out is not None else location.with_name(
                (location.name if location.is_dir() else location.stem) + "-salvaged")
            report.salvaged, report.salvaged_steps = _salvage(contents, report.damage, target)
        reports.append(report)
    return CheckReport(reports)


def _check_trial(name: str, location: Path) -> tuple[TrialCheck, list[FileContent]]:
    """Check one trial: scan, read every live file chunk by chunk, report. A live writer's merge may delete
    a file after the scan listed it; the merged file is then in place (it is renamed before its inputs are
    deleted), so the scan is taken again and only files not read yet are read."""
    read: dict[Path, FileContent] = {}
    for _ in range(_ATTEMPTS):
        scan = scan_trial(location) if location.is_dir() else TrialScan(live=[(0, 0, location)])
        files = [path for *_, path in scan.live]
        for path in files:
            if path not in read:
                read[path] = read_file(path)
        if all(path.exists() or _intact(read[path]) for path in files):
            break
        for path in files:
            if not path.exists():
                del read[path]
    contents = [read[path] for path in files]
    report = TrialCheck(name, location, "incomplete", files, temporary=scan.temporary)
    steps_of = [sorted({s[0] for s in c.steps} | {int(r[0]) for r in c.tables.get("kpi", [])}) for c in contents]
    report.damage += _scan_damage(scan, files, steps_of)
    for content in contents:
        report.damage += content.damage
    report.steps = len({s[0] for c in contents for s in c.steps})
    complete = bool(files) and _consolidated(scan.live)
    if location.is_dir():
        report.state = trial_state(location, complete)[0]
    elif complete:
        report.state = "finished"
    report.problems = dict(Counter(str(row[2]) for c in contents for row in c.tables.get("log", [])
                                   if str(row[2]) in schema.PROBLEM_CATEGORIES))
    return report, contents


_ATTEMPTS = 50


def _intact(content: FileContent) -> bool:
    return not content.damage


def _consolidated(live: list[tuple[int, int, Path]]) -> bool:
    """Whether the live files are a closed recording (``live.consolidated``), by the newest one's attributes."""
    import h5py

    try:
        with h5py.File(live[-1][2], "r") as f:
            complete = bool(f.attrs.get(schema.ATTR_COMPLETE, False))
            parts = tuple(int(v) for v in f.attrs.get(schema.ATTR_PARTS, ()))
            own = int(f.attrs.get(schema.ATTR_SEQUENCE, 0))
    except (OSError, KeyError, ValueError, TypeError):
        return False
    return consolidated([sequence for sequence, *_ in live[:-1]] + [own], complete, parts)


def _scan_damage(scan: TrialScan, live: list[Path], steps_of: list[list[int]]) -> list[Damage]:
    """Unreadable, foreign and missing files, with the steps around each gap from the neighbouring files."""
    sequences = [s for s, *_ in scan.live]

    def between(sequence: int) -> tuple[int, int]:
        before = [steps[-1] for s, steps in zip(sequences, steps_of) if s < sequence and steps]
        after = [steps[0] for s, steps in zip(sequences, steps_of) if s > sequence and steps]
        return (max(before) if before else -1, min(after) if after else -1)

    damage = []
    for path, why in scan.unreadable:
        parsed = parse_segment_name(path.name)
        damage.append(Damage("unreadable", path, "the file cannot be read", why,
                             between=between(parsed[0]) if parsed else None))
    for path, identity in scan.foreign:
        damage.append(Damage("foreign", path, "a file of another recording (left out)",
                             f"its recording_id {identity} is not this trial's {scan.identity}"))
    for run in scan.missing:
        if not any((parse_segment_name(p.name) or (0,))[0] in run for p, _ in scan.unreadable):
            damage.append(Damage("missing", None, "segment files are missing (deleted?)", "", between=between(run[0]),
                                 sequences=run))
    return damage


def _salvage(contents: list[FileContent], damage: list[Damage], target: Path) -> tuple[Path, int]:
    """Write every intact row of ``contents`` as a new, complete recording in the trial folder ``target``."""
    from comgra_ndbg.store.writer import RecordingWriter

    if target.exists() and any(target.iterdir()):
        raise RecordingExistsError(f"{target} exists already; delete it or pass another out= (--out) to salvage into")
    catalog = _best_catalog(contents)
    if catalog is None:
        raise InvalidArgumentError("nothing can be salvaged: no file of the recording has a readable catalog")
    writer = RecordingWriter(target, target.name, mode="w-", config={"salvaged_from": str(contents[0].path.parent)})
    known = len(catalog.series)
    steps = set()
    for content in contents:
        for row in content.steps:
            writer.add_step(row[0], row[1], row[2], row[4], row[5], when=row[3])
            steps.add(row[0])
        for step, iteration, series, rows in content.summaries:
            keep = series < known
            if keep.any():
                writer.add_summaries(step, iteration, series[keep], rows[keep])
        for step, iteration, series, data in content.snapshots:
            if series < known:
                writer.add_snapshot(step, iteration, series, data)
        for step, kpi, value, step_type in content.tables.get("kpi", []):
            writer.add_kpi(int(step), int(kpi), float(value), int(step_type))
        for step, when, text in content.tables.get("notes", []):
            writer.add_note(int(step), str(text), when=float(when))
        for step, reason in content.tables.get("triggers", []):
            writer.add_trigger(int(step), str(reason))
        for step, when, category, subject, message, detail in content.tables.get("log", []):
            writer.add_log(int(step), str(category), str(subject), str(message), json.loads(detail) if detail else None,
                           when=float(when))
    for d in damage:
        writer.add_log(max(d.steps) if d.steps else -1, schema.PROBLEM_DAMAGE, d.file.name if d.file else "",
                       f"lost when the recording was salvaged: {d.describe()}",
                       {"kind": d.kind, "steps": list(d.steps), "tensors": list(d.tensors),
                        "between": list(d.between) if d.between else None})
    writer.close(catalog)
    return target, len(steps)


def _best_catalog(contents: list[FileContent]) -> Catalog | None:
    """The newest intact catalog, widened by nothing: series beyond it are dropped by the salvage."""
    catalogs = [c.catalog for c in contents if c.catalog is not None]
    if not catalogs:
        return None
    return max(catalogs, key=lambda c: (len(c.series), len(c.tensors), len(c.step_types), len(c.kpi_names)))

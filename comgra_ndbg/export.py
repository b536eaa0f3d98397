"""Export a recording's summaries, events and hypotheses as tidy tables, for people who analyse elsewhere.

One row per (trial, step, tensor, kind, statistic) — the "long" layout pandas, R and spreadsheets pivot
freely — read through the :class:`~comgra_ndbg.store.reader.Recording` and derived with
:mod:`comgra_ndbg.stats.statistics`, so every number equals ``Recording.summary(...)``. Events and hypotheses
come from the stored analysis, or from a fresh one when none is stored or it is stale. Non-finite numbers
are written as ``nan``, ``inf`` and ``-inf`` in both formats (as in ``analysis.json``), so no value is lost.

>>> from comgra_ndbg.analysis.events import Diagnosis
>>> hypothesis_rows(Diagnosis("t", 10, 9, (), (), ()))
[]
>>> json_safe({"a": (1.0, float("nan"))})
{'a': [1.0, 'nan']}
"""
from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from comgra_ndbg.analysis import Diagnosis, analyze, stored_diagnosis
from comgra_ndbg.errors import InvalidArgumentError
from comgra_ndbg.stats.statistics import STATISTICS, derive
from comgra_ndbg.store.reader import Recording, list_trials, open_recording

__all__ = ["SUMMARY_COLUMNS", "EVENT_COLUMNS", "HYPOTHESIS_COLUMNS", "FORMATS", "current_diagnosis",
           "summary_rows", "event_rows", "hypothesis_rows", "json_safe", "write_csv", "export"]

SUMMARY_COLUMNS = ("trial", "step", "tensor", "node", "role", "kind", "statistic", "value")
EVENT_COLUMNS = ("trial", "family", "node", "kind", "from_state", "to_state", "onset", "end", "magnitude",
                 "strength", "at_start", "evidence")
HYPOTHESIS_COLUMNS = ("trial", "rank", "type", "origin", "node", "onset", "confidence", "sentence",
                      "chain_events")
FORMATS = ("csv", "json")


def current_diagnosis(recording: Recording) -> tuple[Diagnosis, bool]:
    """The recording's diagnosis and whether it was computed now: the stored one when it is up to date,
    otherwise a fresh :func:`~comgra_ndbg.analyze`, stored for the GUI when the folder is writable."""
    stored = recording.analysis()
    if stored is not None and not stored.stale:
        found = stored_diagnosis(recording)
        if found is not None:
            return found, False
    try:
        return analyze(recording, store=True), True
    except OSError:  # a read-only recording: the diagnosis is still worth showing
        return analyze(recording, store=False), True


def summary_rows(recording: Recording, statistics: Sequence[str] | None = None) -> Iterator[dict]:
    """Tidy rows of every recorded tensor, kind and statistic (``statistics``: a subset of
    :data:`~comgra_ndbg.stats.statistics.STATISTICS`, all by default), in tensor, kind, step order."""
    chosen = list(STATISTICS) if statistics is None else list(statistics)
    unknown = [s for s in chosen if s not in STATISTICS]
    if unknown:
        raise InvalidArgumentError(f"unknown statistic(s) {unknown}; choose from {sorted(STATISTICS)}")
    catalog = recording.catalog
    for tid, kind in catalog.series:
        info = catalog.tensors[tid]
        steps, rows = recording.summary_rows(info.name, kind)
        if not len(steps):
            continue
        derived = derive(rows)
        for stat in chosen:
            for step, value in zip(steps.tolist(), derived[stat].tolist()):
                yield {"trial": recording.trial, "step": step, "tensor": info.name, "node": info.node,
                       "role": info.role, "kind": kind, "statistic": stat, "value": value}


def event_rows(diagnosis: Diagnosis) -> list[dict]:
    """One row per event of the diagnosis, in step order; ``evidence`` lists the series it rests on."""
    return [{"trial": diagnosis.trial, "family": e.family, "node": e.node, "kind": e.kind,
             "from_state": e.from_state, "to_state": e.to_state, "onset": e.onset, "end": e.end,
             "magnitude": e.magnitude, "strength": e.strength, "at_start": e.at_start,
             "evidence": ";".join(x.series for x in e.evidence)} for e in diagnosis.events]


def hypothesis_rows(diagnosis: Diagnosis) -> list[dict]:
    """One row per hypothesis, best first (``rank`` 1); empty for a healthy run."""
    return [{"trial": diagnosis.trial, "rank": rank, "type": h.type, "origin": h.origin, "node": h.node,
             "onset": h.onset, "confidence": h.confidence, "sentence": h.sentence,
             "chain_events": len(h.chain.events)} for rank, h in enumerate(diagnosis.hypotheses, start=1)]


def json_safe(value: object) -> object:
    """A copy that strict JSON can hold: tuples become lists, non-finite floats the strings "nan", "inf",
    "-inf" (the convention of ``analysis.json``; ``diagnosis_from_dict`` reads them back)."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def write_csv(path: Path, columns: Sequence[str], rows: Iterable[dict]) -> int:
    """Write ``rows`` under a header of ``columns``; returns the number of data rows."""
    count = 0
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns), lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow(row)
            count += 1
    return count


def export(path: str | Path, out: str | Path, *, to: str = "csv", trial: str | None = None,
           statistics: Sequence[str] | None = None) -> dict[str, Path]:
    """Export every trial at ``path`` (or only ``trial``) into the folder ``out``.

    ``to="csv"`` writes ``summaries.csv``, ``events.csv`` and ``hypotheses.csv``; ``to="json"`` writes one
    ``export.json`` holding the same three tables as lists of row objects. Returns name -> file written.
    """
    if to not in FORMATS:
        raise InvalidArgumentError(f"unknown export format {to!r}; choose one of {list(FORMATS)}")
    trials = list_trials(path)
    if trial is not None:
        trials = [trial]
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise InvalidArgumentError(f"cannot create the export folder {out} ({error.strerror}); pass another "
                                   f"--out") from None
    if to == "json":
        return {"export": _export_json(path, trials, out / "export.json", statistics)}
    written = {name: out / f"{name}.csv" for name in ("summaries", "events", "hypotheses")}
    events: list[dict] = []
    hypotheses: list[dict] = []
    with open(written["summaries"], "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(SUMMARY_COLUMNS), lineterminator="\n")
        writer.writeheader()
        for name in trials:  # streamed trial by trial: a long recording never sits in memory as rows
            with open_recording(path, name) as recording:
                diagnosis, _ = current_diagnosis(recording)
                writer.writerows(summary_rows(recording, statistics))
            events.extend(event_rows(diagnosis))
            hypotheses.extend(hypothesis_rows(diagnosis))
    write_csv(written["events"], EVENT_COLUMNS, events)
    write_csv(written["hypotheses"], HYPOTHESIS_COLUMNS, hypotheses)
    return written


def _export_json(path: str | Path, trials: list[str], target: Path, statistics: Sequence[str] | None) -> Path:
    tables: dict[str, list[dict]] = {"summaries": [], "events": [], "hypotheses": []}
    for name in trials:
        with open_recording(path, name) as recording:
            diagnosis, _ = current_diagnosis(recording)
            tables["summaries"].extend(summary_rows(recording, statistics))
        tables["events"].extend(event_rows(diagnosis))
        tables["hypotheses"].extend(hypothesis_rows(diagnosis))
    payload = {"format": "comgra_ndbg.export", "trials": trials,
               "columns": {"summaries": SUMMARY_COLUMNS, "events": EVENT_COLUMNS, "hypotheses": HYPOTHESIS_COLUMNS},
               **tables}
    target.write_text(json.dumps(json_safe(payload), allow_nan=False), encoding="utf-8")
    return target

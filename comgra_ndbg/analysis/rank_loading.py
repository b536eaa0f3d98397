"""Reading every rank of a distributed trial for the cross-rank checks, and adding their findings to a
diagnosis.

The one place where ``analysis/ranks.py`` meets the reader: each rank's parameter value summaries (the
fingerprints), total gradient norm, loss KPI, steps, writer state and ``ddp_wrapped`` flag become a
:class:`~comgra_ndbg.analysis.ranks.RankRun`.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from comgra_ndbg.analysis.events import Diagnosis
from comgra_ndbg.analysis.ranks import RankRun, RankThresholds, check_ranks, rank_diagnosis
from comgra_ndbg.errors import CorruptRecordingError, RecordingFormatError, UnknownSeriesError
from comgra_ndbg.store import schema
from comgra_ndbg.store.reader import Recording

__all__ = ["load_rank_runs", "with_rank_checks"]

LOSS_KPI = "loss"


def load_rank_runs(recording: Recording, *, unreadable: list[str] | None = None) -> list[RankRun]:
    """One :class:`RankRun` per rank of ``recording``'s trial (none for a single-process trial). A rank whose
    recording cannot be read is left out (the others are still compared), with a sentence appended to
    ``unreadable`` when given."""
    runs = []
    for rank in recording.ranks:
        try:
            other = recording if rank == recording.rank else recording.with_rank(rank)
        except (CorruptRecordingError, RecordingFormatError) as error:
            if unreadable is not None:
                unreadable.append(f"rank {rank} could not be read and is left out of the checks across ranks "
                                  f"({error})")
            continue
        try:
            runs.append(_rank_run(other, rank))
        finally:
            if other is not recording:
                other.close()
    return runs


def _rank_run(recording: Recording, rank: int) -> RankRun:
    fingerprints, squares = {}, {}
    for tensor in recording.tensors:
        if tensor.role != "parameter":
            continue
        for kind, target in ((schema.KIND_VALUE, fingerprints), (schema.KIND_GRAD, squares)):
            try:
                target[tensor.name] = recording.summary_rows(tensor.name, kind)
            except UnknownSeriesError:
                continue
    loss = recording.kpi(LOSS_KPI) if LOSS_KPI in recording.kpi_names else (np.zeros(0, np.int64), np.zeros(0))
    return RankRun(rank, np.unique(recording.steps), fingerprints, recording.ddp_wrapped, loss,
                   _norm(squares), recording.state)


def _norm(grads: dict[str, tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """The gradient norm over every parameter per step, √ΣΣx², from each parameter's summary rows."""
    if not grads:
        return np.zeros(0, np.int64), np.zeros(0)
    steps = np.unique(np.concatenate([s for s, _ in grads.values()]))
    total = np.zeros(len(steps))
    for s, rows in grads.values():
        np.add.at(total, np.searchsorted(steps, s), rows[:, schema.FIELD["sum_sq"]])
    return steps, np.sqrt(total)


def with_rank_checks(diagnosis: Diagnosis, recording: Recording,
                     thresholds: RankThresholds = RankThresholds()) -> Diagnosis:
    """``diagnosis`` of one rank with the cross-rank findings of its trial added: their events first, their
    hypotheses ahead of the rank's own (a desync or a rank gone its own way explains what follows on it)."""
    if not recording.ranks:
        return diagnosis
    notes: list[str] = []
    missing = sorted(set(range(recording.world_size)) - set(recording.ranks))
    if missing:
        notes.append(f"rank{'s' * (len(missing) > 1)} {', '.join(map(str, missing))} of {recording.world_size} "
                     f"{'have' if len(missing) > 1 else 'has'} no recording in {recording.trial_folder} (not recorded "
                     f"there, or nothing flushed yet) and {'are' if len(missing) > 1 else 'is'} not compared")
    findings = check_ranks(load_rank_runs(recording, unreadable=notes), thresholds)
    events, hypotheses = rank_diagnosis(findings, diagnosis.last_step)
    return replace(diagnosis, events=events + diagnosis.events, hypotheses=hypotheses + diagnosis.hypotheses,
                   notes=diagnosis.notes + tuple(notes))

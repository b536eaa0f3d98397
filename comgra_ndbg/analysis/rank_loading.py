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
from comgra_ndbg.errors import UnknownSeriesError
from comgra_ndbg.store import schema
from comgra_ndbg.store.reader import Recording

__all__ = ["load_rank_runs", "with_rank_checks"]

LOSS_KPI = "loss"


def load_rank_runs(recording: Recording) -> list[RankRun]:
    """One :class:`RankRun` per rank of ``recording``'s trial (none for a single-process trial)."""
    runs = []
    for rank in recording.ranks:
        other = recording if rank == recording.rank else recording.with_rank(rank)
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
    if len(recording.ranks) < 2:
        return diagnosis
    findings = check_ranks(load_rank_runs(recording), thresholds)
    if not findings:
        return diagnosis
    events, hypotheses = rank_diagnosis(findings, diagnosis.last_step)
    return replace(diagnosis, events=events + diagnosis.events, hypotheses=hypotheses + diagnosis.hypotheses)

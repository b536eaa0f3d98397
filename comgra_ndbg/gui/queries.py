"""The explorer's data queries: numpy arrays and plain values out of the cached readers, for one selection.

Each query takes the :class:`~comgra_ndbg.gui.state.ReaderCache` and what is selected, reads through the
cache (so a whole series is read once per trial generation and moving the step is an array lookup), and
returns what a pure figure builder takes. Series of a whole node merge its tensors' sufficient statistics,
as the analysis does.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from comgra_ndbg.analysis.events import Event
from comgra_ndbg.errors import UnknownSeriesError
from comgra_ndbg.gui.ranks import split_rank_key
from comgra_ndbg.gui.state import ReaderCache, Selection
from comgra_ndbg.stats.sentinels import is_sentinel
from comgra_ndbg.stats.statistics import STATISTICS, derive, derive_one, merge_groups
from comgra_ndbg.store import schema
from comgra_ndbg.store.reader import Recording, Snapshot

__all__ = ["ElementValues", "element_values", "node_events", "node_rows", "node_series", "primary_tensor",
           "series_values", "statistics_at", "statistics_over", "timeline_curves", "trace_curves"]


def series_values(cache: ReaderCache, trial: str, tensor: str, kind: str, iteration: int | None, stat: str
                  ) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, values)`` of one statistic of one tensor (``iteration=None``: the iterations merged)."""
    def compute(recording: Recording) -> tuple[np.ndarray, np.ndarray]:
        if iteration is None:
            steps, rows = recording.summary_rows(tensor, kind)
        else:
            steps, rows = cache.series_rows(trial, tensor, kind, iteration)
        return _present(steps, rows, derive_one(rows, stat) if len(rows) else np.zeros(0))
    return cache.memo(trial, ("values", tensor, kind, iteration, stat), compute)


def node_series(cache: ReaderCache, trial: str, node: str, kind: str, stat: str) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, values)`` of a statistic of a whole node: the sufficient statistics of its tensors merged per
    step (iterations merged), as the analysis reads a node. Empty when no tensor of it has ``kind``."""
    def compute(recording: Recording) -> tuple[np.ndarray, np.ndarray]:
        found = node_rows(recording, node, kind)
        if found is None:
            return np.zeros(0, np.int64), np.zeros(0)
        return _present(found[0], found[1], derive_one(found[1], stat))
    return cache.memo(trial, ("node-values", node, kind, stat), compute)


def _present(steps: np.ndarray, rows: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The steps where the statistic exists: a sentinel row (``stats/sentinels.py``) lacks the statistics
    derived from Σx, Σ|x| and the zero count, so a parameter's mean recorded every 10th step is drawn as a line
    through those steps, not as points lost between gaps."""
    keep = ~(is_sentinel(rows) & np.isnan(values)) if len(rows) else np.zeros(0, dtype=bool)
    return steps[keep], values[keep]


def node_rows(recording: Recording, node: str, kind: str) -> tuple[np.ndarray, np.ndarray] | None:
    """``(steps, rows)``: the sufficient statistics of every tensor of ``node`` with ``kind``, merged per step;
    None when no tensor of it has ``kind``."""
    steps, rows = [], []
    for info in recording.tensors_of(node):
        if kind in recording.kinds(info.name):
            s, r = recording.summary_rows(info.name, kind)
            steps.append(s)
            rows.append(r)
    if not steps:
        return None
    return merge_groups(np.concatenate(steps), np.concatenate(rows))


def primary_tensor(recording: Recording, node: str, kind: str | None = None, like: str | None = None) -> str | None:
    """The tensor of ``node`` that stands for it: the one named like ``like`` within its node (``weight``
    stays ``weight``), else the largest; only tensors with ``kind`` when given."""
    members = [t for t in recording.tensors_of(node) if kind is None or kind in recording.kinds(t.name)]
    if not members:
        return None
    if like:
        for info in members:
            if info.label == like:
                return info.name
    return max(members, key=lambda t: (int(np.prod(t.shape)), t.name)).name


def timeline_curves(cache: ReaderCache, selection: Selection) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Step type -> ``(steps, values)`` of the timeline statistic of the selected tensor over every step
    where it was summarized (one cached series read, split by step type)."""
    if selection.tensor is None or selection.kind is None:
        return {}
    tensor, kind = selection.tensor, selection.kind

    def compute(recording: Recording) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        steps, values = series_values(cache, selection.trial, tensor, kind, selection.iteration, selection.stat)
        curves = {}
        for step_type in recording.step_types:
            mask = np.isin(steps, cache.steps_of_type(selection.trial, step_type), assume_unique=True)
            if mask.any():
                curves[step_type] = (steps[mask], values[mask])
        return curves
    return cache.memo(selection.trial, ("curves", tensor, kind, selection.iteration, selection.stat), compute)


def trace_curves(cache: ReaderCache, selection: Selection, nodes: tuple[str, ...], trials: tuple[str, ...]
                 ) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], list[str]]:
    """The curves of a timeline that overlays other nodes and other trials: the selected tensor first (by
    step type when nothing is overlaid), then the same statistic and kind of each node in ``nodes`` (its
    tensor named like the selected one, else its largest) and of the selected tensor in each trial of
    ``trials``. Returns the curves by name and a note per overlay that could not be drawn."""
    if not nodes and not trials:
        return timeline_curves(cache, selection), []
    curves: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    notes = []
    if selection.tensor is None or selection.kind is None:
        return curves, notes
    like = selection.tensor.rpartition(".")[2]
    main = series_values(cache, selection.trial, selection.tensor, selection.kind, None, selection.stat)
    curves[f"{selection.trial} · {selection.node}"] = main
    for node in nodes:
        if node == selection.node:
            continue
        tensor = primary_tensor(cache.recording(selection.trial), node, selection.kind, like)
        if tensor is None:
            notes.append(f"{node} has no {selection.kind}")
            continue
        curves[f"{selection.trial} · {node}"] = series_values(cache, selection.trial, tensor, selection.kind, None,
                                                              selection.stat)
    for trial in trials:
        if trial == selection.trial or split_rank_key(trial)[0] not in cache.trials:  # a trial, or a rank of one
            continue
        recording = cache.recording(trial)
        if selection.tensor not in {t.name for t in recording.tensors} or \
                selection.kind not in recording.kinds(selection.tensor):
            notes.append(f"trial {trial} did not record {selection.tensor} ({selection.kind})")
            continue
        curves[f"{trial} · {selection.node}"] = series_values(cache, trial, selection.tensor, selection.kind, None,
                                                              selection.stat)
    return curves, notes


def node_events(cache: ReaderCache, selection: Selection) -> list[Event]:
    """The stored events of the selected node, in step order."""
    stored = cache.readable_diagnosis(selection.trial)
    if stored is None or selection.node is None:
        return []
    return sorted((e for e in stored.diagnosis.events if e.node == selection.node),
                  key=lambda e: (e.onset, e.node, e.family))


def statistics_at(cache: ReaderCache, selection: Selection) -> dict[str, float] | None:
    """Every statistic of the selected tensor at the selected step: of the whole batch from the summary, of
    one sample from the snapshot's per-sample statistics; None when that was not recorded."""
    if selection.tensor is None or selection.kind is None or selection.step is None:
        return None
    if selection.sample is None:
        return statistics_over(cache, selection, [selection.step])[0]
    snapshot = cache.snapshot(selection.trial, selection.tensor, selection.kind, selection.step,
                              selection.iteration)
    row = _sample_row(snapshot, selection.sample)
    if snapshot is None or row is None:
        return None
    return {name: float(values[row]) for name, values in snapshot.sample_stats.items()}


def statistics_over(cache: ReaderCache, selection: Selection, steps: Sequence[int]) -> list[dict[str, float] | None]:
    """:func:`statistics_at` of the whole batch at each of ``steps`` (None where not summarized), with the
    statistics of all of them derived at once."""
    assert selection.tensor is not None and selection.kind is not None
    summarized, rows = cache.series_rows(selection.trial, selection.tensor, selection.kind, selection.iteration)
    wanted = np.asarray(steps, dtype=np.int64)
    if not len(summarized) or not len(wanted):
        return [None] * len(wanted)
    at = np.minimum(np.searchsorted(summarized, wanted), len(summarized) - 1)
    found = summarized[at] == wanted
    chosen = rows[at]
    derived, sentinel = derive(chosen), is_sentinel(chosen)
    return [{name: float(values[i]) for name, values in derived.items()
             if not (sentinel[i] and np.isnan(values[i]))}  # a sentinel row's absent statistics are not listed
            if found[i] else None for i in range(len(wanted))]


@dataclass(frozen=True)
class ElementValues:
    """Stored element values of a snapshot (or of one of its samples), with where they sit.

    ``positions`` are flat indices into an array of ``shape`` (``None``: every element, in C order); for a
    batched snapshot's whole batch, axis 0 of ``shape`` counts the stored samples and ``first_axis`` gives
    each one's position in the batch.
    """

    values: np.ndarray
    positions: np.ndarray | None
    shape: tuple[int, ...]
    first_axis: np.ndarray | None
    dense: np.ndarray


def element_values(snapshot: Snapshot, sample: int | None) -> ElementValues | None:
    """The stored values of the whole snapshot (``sample=None``) or of one batch sample; None when that
    sample was not stored."""
    dense = snapshot.dense()
    batched = bool(snapshot.sample_index.size)
    if sample is None:
        return ElementValues(snapshot.values, snapshot.value_index, tuple(dense.shape),
                             snapshot.sample_index if batched else None, dense)
    row = _sample_row(snapshot, sample)
    if row is None:
        return None
    shape = tuple(snapshot.shape[1:])
    per_row = int(np.prod(shape))
    if snapshot.value_index is None:
        return ElementValues(snapshot.values[row * per_row:(row + 1) * per_row], None, shape, None, dense[row])
    keep = (snapshot.value_index // max(per_row, 1)) == row
    return ElementValues(snapshot.values[keep], snapshot.value_index[keep] - row * per_row, shape, None, dense[row])


def _sample_row(snapshot: Snapshot | None, sample: int | None) -> int | None:
    if snapshot is None or sample is None:
        return None
    hits = np.flatnonzero(snapshot.sample_index == sample)
    return int(hits[0]) if len(hits) else None


def evidence_series(cache: ReaderCache, trial: str, series: str) -> tuple[np.ndarray, np.ndarray] | None:
    """The whole recorded series an :class:`~comgra_ndbg.analysis.events.Evidence` names, at every step:
    ``node/kind/statistic`` (the node's tensors merged), a ratio ``a/kind/stat÷b/kind/stat`` (``b`` may
    name only ``kind/stat``: of the same node) or ``kpi/name``; None for series the summaries cannot give
    (statistics of snapshots, the optimizer's pseudo node).

    Only the steps where both sides of a ratio were recorded are kept.
    """
    recording = cache.recording(trial)
    if series.startswith("kpi/"):
        name = series[4:]
        if name not in recording.kpi_names:
            return None
        return cache.memo(trial, ("kpi", name), lambda r: r.kpi(name))
    if "÷" in series:
        top, bottom = series.split("÷", 1)
        numerator = _plain_series(cache, trial, top)
        parts = bottom.split("/")
        if len(parts) == 2:
            parts = [top.split("/")[0], *parts]
        denominator = _plain_series(cache, trial, "/".join(parts))
        if numerator is None or denominator is None:
            return None
        steps, a, b = np.intersect1d(numerator[0], denominator[0], assume_unique=True, return_indices=True)
        with np.errstate(divide="ignore", invalid="ignore"):
            return steps, numerator[1][a] / denominator[1][b]
    return _plain_series(cache, trial, series)


def _plain_series(cache: ReaderCache, trial: str, series: str) -> tuple[np.ndarray, np.ndarray] | None:
    parts = series.rsplit("/", 2)
    if len(parts) != 3 or parts[2] not in STATISTICS:
        return None
    node, kind, stat = parts
    if node not in cache.recording(trial).nodes:
        return None
    try:
        found = node_series(cache, trial, node, kind, stat)
    except UnknownSeriesError:
        return None
    return found if len(found[0]) else None


def evidence_statistic(series: str) -> tuple[str, str, str] | None:
    """``(node, kind, statistic)`` the timeline can show for an evidence series (the numerator of a ratio);
    None when it names no summary statistic.

    >>> evidence_statistic("h/value/saturated_fraction"), evidence_statistic("a/grad/rms÷out/grad/rms")
    (('h', 'value', 'saturated_fraction'), ('a', 'grad', 'rms'))
    >>> evidence_statistic("kpi/loss") is None, evidence_statistic("h/loop/stale_gradients") is None
    (True, True)
    """
    parts = series.split("÷", 1)[0].rsplit("/", 2)
    if len(parts) != 3 or parts[0] == "kpi" or parts[2] not in STATISTICS:
        return None
    return parts[0], parts[1], parts[2]


def snapshot_steps_of(cache: ReaderCache, selection: Selection) -> np.ndarray:
    """Sorted steps where the selected tensor has a snapshot (empty without a tensor)."""
    if selection.tensor is None or selection.kind is None:
        return np.zeros(0, np.int64)
    return np.sort(cache.snapshot_steps(selection.trial, selection.tensor, selection.kind))


def all_steps(cache: ReaderCache, trial: str) -> np.ndarray:
    """Every recorded step of a trial, sorted."""
    return cache.memo(trial, ("all-steps",), lambda r: np.sort(r.steps))


SUMMARY_KINDS = (schema.KIND_VALUE, schema.KIND_GRAD, schema.KIND_UPDATE)

"""The explorer's server-side state: one cached reader per trial, and the data queries callbacks make.

Callbacks never open files themselves. A :class:`ReaderCache` keeps one :class:`Recording` per trial open
for the life of the server, refreshes them on the live interval (a directory listing when nothing changed)
and memoizes what is expensive to read again — a tensor's whole summary series, a snapshot, a regrouped
graph — under a key that includes the trial's *generation*, which bumps whenever a refresh found new data.
Selecting another step therefore costs a lookup in an array already in memory, never a reload of the file.

Every query takes the cache and a :class:`Selection` and returns numpy arrays or plain values, so the
figure builders stay pure and the callbacks stay thin.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from comgra_ndbg.analysis.events import Diagnosis, Event, diagnosis_from_dict
from comgra_ndbg.errors import CorruptRecordingError, RecordingFormatError, RecordingNotFoundError, UnknownSeriesError
from comgra_ndbg.graph import DependencyGraph
from comgra_ndbg.graph.structure import collapse_modules
from comgra_ndbg.statistics import derive, derive_one
from comgra_ndbg.store.reader import Recording, Snapshot, list_trials, open_recording
from comgra_ndbg.store.results import results_path

__all__ = ["ElementValues", "ReaderCache", "Selection", "StoredDiagnosis", "ViewGraph", "element_values", "node_events",
           "statistics_at", "timeline_curves", "view_graph"]

T = TypeVar("T")
AGGREGATE = "batch"  # the sample selector's value for "statistics over the whole batch"


@dataclass(frozen=True)
class Selection:
    """What the user looks at: a tensor of a node, of one kind, at one step and iteration of one trial.

    ``node`` is a node of the graph as shown (a collapsed module is one node); ``tensor`` is the recorded
    tensor's full name; ``sample`` is a batch position, or ``None`` for the whole batch; ``stat`` is the
    statistic of the timeline; ``collapsed`` the module paths whose parameters are shown as one node;
    ``generation`` changes whenever the live recording grew, so views depending on it are recomputed.
    """

    trial: str
    step_type: str
    step: int | None
    iteration: int
    node: str | None
    tensor: str | None
    kind: str | None
    sample: int | None = None
    stat: str = "mean"
    collapsed: tuple[str, ...] = ()
    generation: int = 0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["collapsed"] = list(self.collapsed)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Selection:
        values = {k: data.get(k) for k in cls.__dataclass_fields__}
        values["collapsed"] = tuple(data.get("collapsed") or ())
        values["iteration"] = int(data.get("iteration") or 0)
        values["stat"] = data.get("stat") or "mean"
        values["generation"] = int(data.get("generation") or 0)
        return cls(**values)


@dataclass(frozen=True)
class ViewGraph:
    """The graph as displayed: the stored graph regrouped by the collapsed modules, with positions for every
    node (a collapsed module sits at the centre of the nodes it replaced)."""

    graph: DependencyGraph
    positions: dict[str, tuple[float, float]] = field(hash=False)

    def ordered_nodes(self) -> list[str]:
        """Node names left to right, then top to bottom, so prev/next walks the graph in reading order."""
        return sorted(self.graph.node_names, key=lambda n: (*self.positions.get(n, (0.0, 0.0)), n))


def view_graph(graph: DependencyGraph, positions: dict[str, tuple[float, float]],
               collapsed: tuple[str, ...]) -> ViewGraph:
    """``graph`` with the parameters of each module in ``collapsed`` grouped into one node.

    Outer modules are applied last, so collapsing ``model`` and ``model.enc`` shows one ``model`` node.
    Module paths that own no parameter of this graph are ignored (the graph of another step type may not
    use them).
    """
    original_node = {info.name: info.node for info in graph.tensors}
    for prefix in sorted(set(collapsed), key=lambda p: (-p.count("."), p)):
        if any(info.role == "parameter" and (info.module == prefix or info.module.startswith(prefix + "."))
               for info in graph.tensors):
            graph = collapse_modules(graph, prefix)
    placed = dict(positions)
    for node in graph.nodes:
        if node.name not in placed:
            points = [positions[original_node[t]] for t in node.tensors if original_node.get(t) in positions]
            if points:
                placed[node.name] = (float(np.mean([p[0] for p in points])), float(np.mean([p[1] for p in points])))
            else:
                placed[node.name] = (0.0, 0.0)
    return ViewGraph(graph, {n: placed[n] for n in graph.node_names})


@dataclass(frozen=True)
class StoredDiagnosis:
    """A diagnosis as stored for a trial: ``stale`` when the recording has grown since (it now holds
    ``num_steps`` steps; the analysis saw ``diagnosis.num_steps``)."""

    diagnosis: Diagnosis
    stale: bool
    num_steps: int


class ReaderCache:
    """One open :class:`Recording` per trial of ``path`` and a bounded memo of what was read from them.

    Thread-safe: the web server answers requests on several threads and h5py files are not meant to be
    used concurrently, so every public method and every ``with cache.lock:`` block is serialized.
    """

    def __init__(self, path: str | Path, *, memo_size: int = 64) -> None:
        self.path = Path(path)
        self.trials: list[str] = list_trials(self.path)
        self.lock = threading.RLock()
        self._recordings: dict[str, Recording] = {}
        self._generation: dict[str, int] = {trial: 0 for trial in self.trials}
        self._memo: OrderedDict[Hashable, Any] = OrderedDict()
        self._memo_size = memo_size
        self.unreadable: dict[str, str] = {}  # trials that cannot be opened at all -> the reader's sentence
        for trial in list(self.trials):
            try:
                self.recording(trial)
            except CorruptRecordingError as error:
                self.unreadable[trial] = str(error)
                self.trials.remove(trial)
        if not self.trials and self.unreadable:
            raise CorruptRecordingError(" ".join(self.unreadable.values()))

    # ---- readers -------------------------------------------------------------------------------------
    def recording(self, trial: str) -> Recording:
        """The open reader of ``trial``, opened on first use."""
        with self.lock:
            if trial not in self._recordings:
                if trial not in self.trials:
                    raise UnknownSeriesError(f"no trial {trial!r} in {self.path}; trials are {self.trials}")
                # damage is read around and shown (Notes tab), never a traceback in the browser
                self._recordings[trial] = open_recording(self.path, trial, damaged="skip")
            return self._recordings[trial]

    def generation(self, trial: str) -> int:
        return self._generation.get(trial, 0)

    def refresh(self) -> dict[str, int]:
        """Pick up trials and segments written since the last call; returns every trial's generation.

        Only trials that were opened are refreshed (a directory listing each); a trial whose files changed
        gets a new generation, which retires its memo entries.
        """
        with self.lock:
            if self.path.is_dir():
                for trial in list_trials(self.path):
                    if trial not in self.trials and trial not in self.unreadable:
                        self.trials.append(trial)
                        self._generation[trial] = 0
            for trial, recording in self._recordings.items():
                try:
                    changed = recording.refresh()
                except (RecordingFormatError, RecordingNotFoundError):
                    continue  # files replaced under a concurrent merge: the next look sees the merged file
                if changed:
                    self._generation[trial] += 1
            return dict(self._generation)

    def close(self) -> None:
        with self.lock:
            for recording in self._recordings.values():
                recording.close()
            self._recordings.clear()
            self._memo.clear()

    # ---- memo ----------------------------------------------------------------------------------------
    def memo(self, trial: str, key: tuple[Hashable, ...], compute: Callable[[Recording], T]) -> T:
        """``compute(recording)``, remembered under ``key`` for the trial's current generation."""
        with self.lock:
            full = (trial, self.generation(trial)) + key
            if full in self._memo:
                self._memo.move_to_end(full)
                return self._memo[full]
            value = compute(self.recording(trial))
            self._memo[full] = value
            while len(self._memo) > self._memo_size:
                self._memo.popitem(last=False)
            return value

    # ---- queries -------------------------------------------------------------------------------------
    def steps_of_type(self, trial: str, step_type: str) -> np.ndarray:
        """Sorted recorded steps of a step type."""
        return self.memo(trial, ("steps", step_type), lambda r: np.sort(r.steps_of_type(step_type)))

    def iterations(self, trial: str) -> dict[int, int]:
        """Step -> number of iterations it ran."""
        def compute(recording: Recording) -> dict[int, int]:
            return {int(s): int(n) for s, n in zip(recording.steps, recording.step_iterations)}
        return self.memo(trial, ("iterations",), compute)

    def analysis_stamp(self, trial: str) -> str | None:
        """What identifies the analysis stored for ``trial`` (its file's time, size and inode), or None when
        there is none; it changes whenever ``comgra_ndbg.analyze`` stores results again."""
        try:
            stat = results_path(self.recording(trial).location).stat()
        except FileNotFoundError:
            return None
        return f"{stat.st_mtime_ns}:{stat.st_size}:{stat.st_ino}"

    def analysis_stamps(self) -> dict[str, str | None]:
        """:meth:`analysis_stamp` of every trial opened so far (a ``stat`` each)."""
        with self.lock:
            return {trial: self.analysis_stamp(trial) for trial in self._recordings}

    def diagnosis(self, trial: str) -> StoredDiagnosis | None:
        """The diagnosis ``comgra_ndbg.analyze`` stored for ``trial`` (``Recording.analysis()``), read once
        per stored file and recording generation; None when none is stored. Raises
        ``RecordingFormatError`` when the stored file cannot be read."""
        stamp = self.analysis_stamp(trial)
        if stamp is None:
            return None

        def compute(recording: Recording) -> StoredDiagnosis | None:
            stored = recording.analysis()
            if stored is None:
                return None
            try:
                diagnosis = diagnosis_from_dict(stored.diagnosis)
            except (KeyError, TypeError, ValueError) as error:
                raise RecordingFormatError(f"{stored.path} holds an analysis this version cannot read ({error!r}); "
                                           f"run comgra_ndbg.analyze() again") from None
            return StoredDiagnosis(diagnosis, stored.stale, len(recording.steps))
        return self.memo(trial, ("diagnosis", stamp), compute)

    def readable_diagnosis(self, trial: str) -> StoredDiagnosis | None:
        """:meth:`diagnosis`, or None when the stored file cannot be read (the Diagnosis tab says why)."""
        try:
            return self.diagnosis(trial)
        except RecordingFormatError:
            return None

    def shown_nodes(self, trial: str, step_type: str, collapsed: tuple[str, ...] = ()) -> dict[str, str]:
        """Recorded node -> the node of the displayed graph that shows its tensors (itself, or the collapsed
        module holding it); nodes the graph of the step type lacks are left out."""
        def compute(recording: Recording) -> dict[str, str]:
            view = self.view_graph(trial, step_type, collapsed)
            if view is None:
                return {}
            holder = {tensor: node.name for node in view.graph.nodes for tensor in node.tensors}
            return {t.node: holder[t.name] for t in recording.tensors if t.name in holder}
        return self.memo(trial, ("shown", step_type, collapsed), compute)

    def view_graph(self, trial: str, step_type: str, collapsed: tuple[str, ...] = ()) -> ViewGraph | None:
        """The displayed graph of a step type, or None when none was discovered for it."""
        def compute(recording: Recording) -> ViewGraph | None:
            stored = recording.graph(step_type) if step_type in recording.step_types else None
            return None if stored is None else view_graph(stored.graph, stored.positions, collapsed)
        return self.memo(trial, ("graph", step_type, collapsed), compute)

    def series_rows(self, trial: str, tensor: str, kind: str, iteration: int) -> tuple[np.ndarray, np.ndarray]:
        """``(steps, rows)``: the tensor's sufficient statistics at every summarized step (one read, cached)."""
        return self.memo(trial, ("rows", tensor, kind, iteration),
                         lambda r: r.summary_rows(tensor, kind, iteration=iteration))

    def snapshot_steps(self, trial: str, tensor: str, kind: str) -> np.ndarray:
        return self.memo(trial, ("snapshot-steps", tensor, kind), lambda r: r.snapshot_steps(tensor, kind))

    def snapshot(self, trial: str, tensor: str, kind: str, step: int, iteration: int) -> Snapshot | None:
        """The snapshot at a step and iteration, or None when none was taken there."""
        def compute(recording: Recording) -> Snapshot | None:
            if step not in self.snapshot_steps(trial, tensor, kind):
                return None
            try:
                return recording.snapshot(step, tensor, kind, iteration=iteration)
            except (UnknownSeriesError, CorruptRecordingError):  # a damaged snapshot is listed in .damage
                return None
        return self.memo(trial, ("snapshot", tensor, kind, step, iteration), compute)


def timeline_curves(cache: ReaderCache, selection: Selection) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Step type -> ``(steps, values)`` of the timeline statistic of the selected tensor over every step
    where it was summarized (one cached series read, split by step type)."""
    if selection.tensor is None or selection.kind is None:
        return {}
    tensor, kind = selection.tensor, selection.kind

    def compute(recording: Recording) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        steps, rows = cache.series_rows(selection.trial, tensor, kind, selection.iteration)
        values = derive_one(rows, selection.stat) if len(rows) else np.zeros(0)
        curves = {}
        for step_type in recording.step_types:
            mask = np.isin(steps, cache.steps_of_type(selection.trial, step_type), assume_unique=True)
            if mask.any():
                curves[step_type] = (steps[mask], values[mask])
        return curves
    return cache.memo(selection.trial, ("curves", tensor, kind, selection.iteration, selection.stat), compute)


def node_events(cache: ReaderCache, selection: Selection) -> list[Event]:
    """The stored events of the recorded nodes that the selected (displayed) node shows, in step order."""
    stored = cache.readable_diagnosis(selection.trial)
    if stored is None or selection.node is None:
        return []
    shown = cache.shown_nodes(selection.trial, selection.step_type, selection.collapsed)
    return sorted((e for e in stored.diagnosis.events if shown.get(e.node, e.node) == selection.node),
                  key=lambda e: (e.onset, e.node, e.family))


def statistics_at(cache: ReaderCache, selection: Selection) -> dict[str, float] | None:
    """Every statistic of the selected tensor at the selected step: of the whole batch from the summary, of
    one sample from the snapshot's per-sample statistics; None when that was not recorded."""
    if selection.tensor is None or selection.kind is None or selection.step is None:
        return None
    if selection.sample is None:
        steps, rows = cache.series_rows(selection.trial, selection.tensor, selection.kind, selection.iteration)
        position = int(np.searchsorted(steps, selection.step))
        if position >= len(steps) or steps[position] != selection.step:
            return None
        return {name: float(value) for name, value in derive(rows[position]).items()}
    snapshot = cache.snapshot(selection.trial, selection.tensor, selection.kind, selection.step,
                              selection.iteration)
    row = _sample_row(snapshot, selection.sample)
    if snapshot is None or row is None:
        return None
    return {name: float(values[row]) for name, values in snapshot.sample_stats.items()}


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

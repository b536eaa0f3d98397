"""The explorer's server-side state: one cached reader per trial, and the data queries callbacks make.

Callbacks never open files themselves. A :class:`ReaderCache` keeps one :class:`Recording` per trial open
for the life of the server, refreshes them on the live interval (a directory listing when nothing changed)
and memoizes what is expensive to read again — a tensor's whole summary series, a snapshot, a regrouped
graph — under a key that includes the trial's *generation*, which bumps whenever a refresh found new data.
Selecting another step therefore costs a lookup in an array already in memory, never a reload of the file.

The data queries callbacks make (:mod:`comgra_ndbg.gui.queries`) take the cache and a :class:`Selection`
and return numpy arrays or plain values, so the figure builders stay pure and the callbacks stay thin.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from comgra_ndbg.analysis.events import Diagnosis, diagnosis_from_dict
from comgra_ndbg.errors import CorruptRecordingError, RecordingFormatError, RecordingNotFoundError, UnknownSeriesError
from comgra_ndbg.graph.compound import ModuleBoxes, VisibleGraph, default_collapsed, module_boxes, visible_graph
from comgra_ndbg.graph.groups import parameter_groups
from comgra_ndbg.graph.nested_layout import nested_layout
from comgra_ndbg.gui.ranks import rank_key, split_rank_key
from comgra_ndbg.store.reader import Recording, Snapshot, StoredGraph, list_trials, open_recording
from comgra_ndbg.store.results import results_path

__all__ = ["AGGREGATE", "DrawnGraph", "ReaderCache", "Selection", "StoredDiagnosis", "ViewOptions", "collapsed_boxes"]

T = TypeVar("T")
AGGREGATE = "batch"  # the sample selector's value for "statistics over the whole batch"


@dataclass(frozen=True)
class Selection:
    """What the user looks at: a tensor of a node, of one kind, at one step and iteration of one trial.

    ``node`` is a node of the dependency graph; ``tensor`` is the recorded tensor's full name; ``sample`` is
    a batch position, or ``None`` for the whole batch; ``stat`` is the statistic of the timeline; ``boxes``
    says which module boxes of the graph differ from the default view (``+path`` opened, ``-path``
    closed, ``*`` first: start from every box open; :func:`collapsed_boxes`); ``generation`` changes
    whenever the live recording grew, so views depending on it are recomputed.
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
    boxes: tuple[str, ...] = ()
    generation: int = 0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["boxes"] = list(self.boxes)
        return data

    @property
    def rank(self) -> int | None:
        """The rank shown, for a distributed trial (``trial`` is then a rank key, ``gui/ranks.py``)."""
        return split_rank_key(self.trial)[1]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Selection:
        values = {k: data.get(k) for k in cls.__dataclass_fields__}
        values["boxes"] = tuple(data.get("boxes") or ())
        values["iteration"] = int(data.get("iteration") or 0)
        values["stat"] = data.get("stat") or "mean"
        values["generation"] = int(data.get("generation") or 0)
        return cls(**values)


@dataclass(frozen=True)
class ViewOptions:
    """How things are shown, beside what is selected: the graph's node colour (``role`` or
    ``<kind>:<statistic>`` at the step) and its options, the timeline's overlays (other nodes, other
    trials), log scale and smoothing (an EMA factor in [0, 1)), the diagnosis item whose evidence is drawn
    (``h0``, ``e3``; ``""`` none), whether to follow a live recording, the theme, the open tab, and the
    controls of the element values and the Compare tab. All of it is part of the page's address."""

    colour: str = "role"
    show_implied: bool = False
    show_unused: bool = False
    overlay_nodes: tuple[str, ...] = ()
    overlay_trials: tuple[str, ...] = ()
    log_y: bool = False
    ema: float = 0.0
    focus: str = ""
    follow: bool = True
    theme: str = "light"
    tab: str = "tensors"
    values_mode: str = "heatmap"
    values_page: int = 1
    compare_mode: str = ""  # "": another trial when there are several, else another step
    compare_trial: str = ""  # "": the first other trial
    compare_step: int | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["overlay_nodes"], data["overlay_trials"] = list(self.overlay_nodes), list(self.overlay_trials)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> ViewOptions:
        data = {k: v for k, v in (data or {}).items() if k in cls.__dataclass_fields__ and v is not None}
        for key in ("overlay_nodes", "overlay_trials"):
            if key in data:
                data[key] = tuple(data[key])
        if "ema" in data:  # the browser writes 0.0 back as 0: the same view, so the same keys
            data["ema"] = float(data["ema"])
        return cls(**data)


def collapsed_boxes(boxes: ModuleBoxes, default: tuple[str, ...], entries: tuple[str, ...]) -> tuple[str, ...]:
    """The collapsed boxes: ``default`` (or none, after ``*``) changed by ``+path`` (open) and ``-path`` (close)
    entries in order; paths that are no box are ignored.

    >>> from comgra_ndbg.graph.compound import module_boxes
    >>> boxes = module_boxes(["m.a.x", "m.a.y", "m.b.x", "m.b.y"])
    >>> collapsed_boxes(boxes, ("m.a", "m.b"), ("+m.a",)), collapsed_boxes(boxes, ("m.a",), ("*", "-m.b"))
    (('m.b',), ('m.b',))
    """
    closed = set() if "*" in entries else set(default)
    for entry in entries:
        if entry[:1] == "+":
            closed.discard(entry[1:])
        elif entry[:1] == "-":
            closed.add(entry[1:])
    return tuple(p for p in boxes.paths if p in closed)


@dataclass(frozen=True)
class DrawnGraph:
    """The graph of a step type as drawn: what is visible (:func:`~comgra_ndbg.graph.compound.visible_graph`),
    where each item sits, the collapsed boxes, and every node of the graph in reading order (by the stored
    layered layout: left to right, then top to bottom)."""

    view: VisibleGraph
    positions: dict[str, tuple[float, float]] = field(hash=False)
    collapsed: tuple[str, ...]
    order: tuple[str, ...]


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

    def __init__(self, path: str | Path, *, memo_size: int = 256, memo_bytes: int = 256 * 2**20) -> None:
        self.path = Path(path)
        self.trials: list[str] = list_trials(self.path)
        self.lock = threading.RLock()
        self._recordings: dict[str, Recording] = {}
        self._generation: dict[str, int] = {trial: 0 for trial in self.trials}
        self._memo: OrderedDict[Hashable, Any] = OrderedDict()
        self._memo_size = memo_size
        self._memo_bytes = memo_bytes
        self._bytes = 0
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
        """The open reader of ``trial``, a trial name or a rank key (``gui/ranks.py``), opened on first use."""
        with self.lock:
            if trial not in self._recordings:
                name, rank = split_rank_key(trial)
                if name not in self.trials:
                    raise UnknownSeriesError(f"no trial {name!r} in {self.path}; trials are {self.trials}")
                # damage is read around and shown (Notes tab), never a traceback in the browser
                self._recordings[trial] = open_recording(self.path, name, rank=rank, damaged="skip")
            return self._recordings[trial]

    def ranks(self, trial: str) -> list[int]:
        """The ranks of a distributed trial (empty for a single process)."""
        return self.recording(split_rank_key(trial)[0]).ranks

    def trial_keys(self) -> list[str]:
        """Every trial, and every rank of the distributed ones as a rank key: what timelines can overlay."""
        return [key for trial in self.trials for key in [rank_key(trial, r) for r in self.ranks(trial)] or [trial]]

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
                    self._generation[trial] = self._generation.get(trial, 0) + 1
            return dict(self._generation)

    def close(self) -> None:
        with self.lock:
            for recording in self._recordings.values():
                recording.close()
            self._recordings.clear()
            self._memo.clear()
            self._bytes = 0

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
            self._bytes += _nbytes(value)
            while len(self._memo) > 1 and (len(self._memo) > self._memo_size or self._bytes > self._memo_bytes):
                self._bytes -= _nbytes(self._memo.popitem(last=False)[1])
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

    def stored_graph(self, trial: str, step_type: str) -> StoredGraph | None:
        """The dependency graph of a step type as stored, or None when none was discovered for it."""
        def compute(recording: Recording) -> StoredGraph | None:
            return recording.graph(step_type) if step_type in recording.step_types else None
        return self.memo(trial, ("stored-graph", step_type), compute)

    def boxes(self, trial: str, step_type: str) -> tuple[ModuleBoxes, tuple[str, ...]] | None:
        """The module boxes of a step type's graph, with the boxes of the recording's ``parameter_groups``, and
        the boxes collapsed by default; None without a graph."""
        def compute(recording: Recording) -> tuple[ModuleBoxes, tuple[str, ...]] | None:
            stored = self.stored_graph(trial, step_type)
            if stored is None:
                return None
            prefixes = recording.config.get("parameter_groups")
            groups = parameter_groups(stored.graph, [p for p in prefixes if isinstance(p, str)]
                                      ) if isinstance(prefixes, list) else None
            boxes = module_boxes(stored.graph.node_names, groups)
            return boxes, default_collapsed(boxes)
        return self.memo(trial, ("boxes", step_type), compute)

    def drawn(self, trial: str, step_type: str, entries: tuple[str, ...] = (), *, show_implied: bool = False,
              show_unused: bool = False) -> DrawnGraph | None:
        """The graph of a step type as drawn with the box ``entries`` of :class:`Selection` (None without a
        graph): what is visible, laid out."""
        def compute(recording: Recording) -> DrawnGraph | None:
            stored, boxes = self.stored_graph(trial, step_type), self.boxes(trial, step_type)
            if stored is None or boxes is None:
                return None
            collapsed = collapsed_boxes(boxes[0], boxes[1], entries)
            view = visible_graph(stored.graph, collapsed, show_implied=show_implied, show_unused=show_unused,
                                 boxes=boxes[0])
            order = sorted(stored.graph.node_names, key=lambda n: (*stored.positions.get(n, (0.0, 0.0)), n))
            return DrawnGraph(view, nested_layout(view), collapsed, tuple(order))
        return self.memo(trial, ("drawn", step_type, entries, show_implied, show_unused), compute)

    def shown_nodes(self, trial: str, step_type: str, entries: tuple[str, ...] = ()) -> dict[str, str]:
        """Recorded node -> the id of the drawn item that shows it (itself, or the collapsed box holding it);
        nodes the graph of the step type lacks, or leaves out, are left out."""
        drawn = self.drawn(trial, step_type, entries)
        return dict(drawn.view.shown_as) if drawn is not None else {}

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




def _nbytes(value: Any) -> int:
    """The bytes of the arrays a memo entry holds (arrays, tuples, lists and dicts of them)."""
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, (tuple, list)):
        return sum(_nbytes(v) for v in value)
    if isinstance(value, dict):
        return sum(_nbytes(v) for v in value.values())
    return 0

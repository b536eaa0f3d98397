"""Reading recordings: a trial directory (live or finished), a group folder of trials, or one ``.h5`` file.

The reader keeps its files open and caches their small index arrays; timelines are read as one hyperslab
per file (``summary/data[series]``), so a 10k-step timeline is a single chunked read of the consolidated
file. ``refresh()`` picks up segments written since the last look, which is how the GUI follows a run.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import h5py
import numpy as np

from comgra_ndbg.errors import RecordingFormatError, RecordingNotFoundError, UnknownSeriesError
from comgra_ndbg.graph import DependencyGraph, graph_from_dict
from comgra_ndbg.graph.modules import ModuleInfo as ModuleTreeEntry
from comgra_ndbg.graph.modules import module_tree
from comgra_ndbg.statistics import STATISTICS, derive, derive_one, merge_groups
from comgra_ndbg.store import schema
from comgra_ndbg.store.catalog import Catalog, ModuleInfo, TensorInfo
from comgra_ndbg.store.results import StoredAnalysis, read_results
from comgra_ndbg.store.writer import list_live_segments

__all__ = ["open_recording", "list_trials", "Recording", "Snapshot", "Note", "StoredGraph", "TriggerMark"]


@dataclass(frozen=True)
class Note:
    """A free-text note; ``step`` is -1 for notes written before the first step."""

    step: int
    time: float
    text: str


@dataclass(frozen=True)
class TriggerMark:
    """A flight-recorder trigger: the step it fired at and why."""

    step: int
    reason: str


@dataclass(frozen=True)
class StoredGraph:
    """A dependency graph as recorded: its structure hash, the graph and the node positions of its layout."""

    structure_hash: str
    graph: DependencyGraph
    positions: dict[str, tuple[float, float]]
    step_types: tuple[str, ...]


@dataclass(frozen=True)
class Snapshot:
    """The stored arrays of one snapshot.

    ``values`` are element values (float32); ``value_index`` gives their flat positions in a tensor of
    ``shape`` (``None`` when every element is stored, in C order). For batched tensors ``sample_index`` are
    the batch positions whose per-sample statistics are in ``sample_stats`` (name -> array over samples).
    """

    step: int
    iteration: int
    tensor: str
    kind: str
    shape: tuple[int, ...]
    values: np.ndarray
    value_index: np.ndarray | None
    sample_index: np.ndarray
    sample_rows: np.ndarray
    sample_categories: tuple[str, ...] = ()

    @property
    def sample_stats(self) -> dict[str, np.ndarray]:
        return derive(self.sample_rows) if len(self.sample_rows) else {k: np.zeros(0) for k in STATISTICS}

    def dense(self) -> np.ndarray:
        """Element values laid out in the tensor's shape (batched tensors: the recorded samples only);
        positions that were not kept are NaN."""
        if self.value_index is None:
            if self.sample_index.size:
                return self.values.reshape((len(self.sample_index),) + self.shape[1:])
            return self.values.reshape(self.shape)
        rows = len(self.sample_index) if self.sample_index.size else 1
        per_row = int(np.prod(self.shape[1:] if self.sample_index.size else self.shape))
        out = np.full(rows * per_row, np.nan, dtype=np.float32)
        out[self.value_index] = self.values
        return out.reshape(((rows,) + self.shape[1:]) if self.sample_index.size else self.shape)


def list_trials(path: str | Path) -> list[str]:
    """Trial names under a group folder (or the one trial a trial directory / file holds)."""
    return [name for name, _ in _resolve(Path(path))]


def open_recording(path: str | Path, trial: str | None = None) -> Recording:
    """Open a recording for reading.

    ``path`` is a group folder (pass ``trial``, or the first trial in sorted order is opened; ``.trials``
    lists them all), a trial directory, or a single recording file.
    """
    entries = _resolve(Path(path))
    names = [n for n, _ in entries]
    if trial is None:
        trial, location = entries[0]
    else:
        matches = [loc for n, loc in entries if n == trial]
        if not matches:
            raise UnknownSeriesError(f"no trial {trial!r} in {path}; trials are {names}")
        location = matches[0]
    return Recording(location, trial=trial, trials=names, group=Path(path) if len(entries) > 1 or
                     Path(path) != location else None)


def _is_trial_dir(path: Path) -> bool:
    return path.is_dir() and (any(path.glob(f"{schema.SEGMENT_PREFIX}*{schema.SEGMENT_SUFFIX}"))
                              or (path / schema.FINAL_NAME).exists())


def _resolve(path: Path) -> list[tuple[str, Path]]:
    if not path.exists():
        raise RecordingNotFoundError(f"{path} does not exist; pass the folder given to Recorder(...) or a trial "
                                     f"folder inside it")
    if path.is_file():
        with _open_h5(path) as f:
            return [(str(f.attrs.get(schema.ATTR_TRIAL, path.stem)), path)]
    if _is_trial_dir(path):
        return [(path.name, path)]
    trials = sorted((p.name, p) for p in path.iterdir() if _is_trial_dir(p))
    if not trials:
        raise RecordingNotFoundError(f"{path} holds no recording (no trial folder with {schema.FINAL_NAME} or "
                                     f"segment files); record one with Recorder({str(path)!r}, trial=...)")
    return trials


def _open_h5(path: Path) -> h5py.File:
    try:
        f = h5py.File(path, "r")
    except OSError as error:
        raise RecordingFormatError(f"{path} is not a readable HDF5 recording: {error}") from None
    if f.attrs.get(schema.ATTR_FORMAT) != schema.FORMAT_NAME:
        f.close()
        raise RecordingFormatError(f"{path} is an HDF5 file but not a comgra_ndbg recording")
    version = int(f.attrs.get(schema.ATTR_FORMAT_VERSION, -1))
    if version > schema.FORMAT_VERSION:
        f.close()
        raise RecordingFormatError(f"{path} has format version {version}, newer than this library's "
                                   f"{schema.FORMAT_VERSION}; upgrade comgra_ndbg to read it")
    return f


_LIST_ATTEMPTS = 20  # listings tried when files vanish under a concurrent merge


class _FileView:
    """One open segment file with its small index arrays cached."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file = _open_h5(path)
        self.sequence = int(self.file.attrs[schema.ATTR_SEQUENCE])
        self.complete = bool(self.file.attrs.get(schema.ATTR_COMPLETE, False))

    def array(self, name: str) -> np.ndarray:
        cache = self.__dict__.setdefault("_cache", {})
        if name not in cache:
            cache[name] = self.file[name][()] if name in self.file else np.zeros(0)
        return cache[name]

    @cached_property
    def num_series(self) -> int:
        return int(self.file[schema.SUMMARY_DATA].shape[0])

    def summary_block(self, series: int) -> np.ndarray:
        """``[rows, NUM_FIELDS]`` of one series (the merge identity where this file predates it)."""
        rows = len(self.array(schema.SUMMARY_STEP))
        if series >= self.num_series or rows == 0:
            block = np.zeros((rows, schema.NUM_FIELDS))
            block[:, schema.FIELD["min"]], block[:, schema.FIELD["max"]] = np.inf, -np.inf
            return block
        return schema.pad_fields(self.file[schema.SUMMARY_DATA][series], axis=0).T

    def close(self) -> None:
        self.file.close()


class Recording:
    """Read access to one trial. Use as a context manager or call ``close()``."""

    def __init__(self, location: Path, *, trial: str, trials: list[str], group: Path | None) -> None:
        self.location = Path(location)
        self.trial = trial
        self.trials = trials
        self.group = group
        self._views: dict[Path, _FileView] = {}
        self._catalog: Catalog | None = None
        self.refresh()

    # ---- lifecycle -------------------------------------------------------------------------------------
    def refresh(self) -> bool:
        """Look for segments written since the last call; True when something changed."""
        opened = self._open_live()
        if opened is None:
            return False
        for path, view in self._views.items():
            if path not in opened:
                view.close()
        self._views = dict(sorted(opened.items(), key=lambda kv: kv[1].sequence))
        self._catalog = None
        self.__dict__.pop("_index", None)
        return True

    def _open_live(self) -> dict[Path, _FileView] | None:
        """Views of the files that hold the trial now; None when they are exactly the open ones.

        A writer's merge deletes segments once the merged file covering them is in place, which can happen
        between listing the directory and opening a listed file: the listing is then simply taken again.
        """
        attempt = 0
        while True:
            attempt += 1
            if self.location.is_file():
                live = [self.location]
            else:
                live = [path for _, _, path in list_live_segments(self.location)]
            if not live:
                raise RecordingNotFoundError(f"{self.location} holds no flushed segment yet")
            if list(self._views) == live:
                return None
            opened: dict[Path, _FileView] = {}
            try:
                for path in live:
                    opened[path] = self._views.get(path) or _FileView(path)
                return opened
            except RecordingFormatError:
                for path, view in opened.items():
                    if path not in self._views:
                        view.close()
                if attempt >= _LIST_ATTEMPTS or all(path.exists() for path in live):
                    raise

    def close(self) -> None:
        for view in self._views.values():
            view.close()
        self._views.clear()

    def __enter__(self) -> Recording:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def with_trial(self, trial: str) -> Recording:
        """Open another trial of the same group."""
        if self.group is None:
            raise UnknownSeriesError(f"{self.location} is a single trial; there is no other trial to open")
        return open_recording(self.group, trial)

    # ---- catalog -------------------------------------------------------------------------------------------
    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            newest = list(self._views.values())[-1]
            self._catalog = Catalog.read(newest.file)
        return self._catalog

    @property
    def is_complete(self) -> bool:
        """True once the recorder was closed and everything was consolidated into one file."""
        return any(view.complete for view in self._views.values())

    @property
    def files(self) -> list[Path]:
        return list(self._views)

    @property
    def tensors(self) -> list[TensorInfo]:
        return list(self.catalog.tensors)

    @property
    def nodes(self) -> list[str]:
        return list(dict.fromkeys(t.node for t in self.catalog.tensors))

    @property
    def roles(self) -> dict[str, str]:
        """Tensor name -> role (input, target, output, loss, parameter, intermediate)."""
        return {t.name: t.role for t in self.catalog.tensors}

    @property
    def modules(self) -> list[ModuleInfo]:
        return list(self.catalog.modules)

    @property
    def step_types(self) -> list[str]:
        return list(self.catalog.step_types)

    @property
    def kpi_names(self) -> list[str]:
        return list(self.catalog.kpi_names)

    def tensors_of(self, node: str) -> list[TensorInfo]:
        return [t for t in self.catalog.tensors if t.node == node]

    def kinds(self, name: str | None = None) -> list[str]:
        """Kinds recorded for a tensor or node (all kinds when ``name`` is None)."""
        if name is None:
            return list(dict.fromkeys(k for _, k in self.catalog.series))
        ids = {self.catalog.tensor_id(t.name) for t in self._tensors_for(name)}
        return list(dict.fromkeys(k for t, k in self.catalog.series if t in ids))

    def module_tree(self) -> list[ModuleTreeEntry]:
        """Tracked modules as a tree with parameter counts (own and total), from the recorded parameters."""
        counts = {t.name: int(np.prod(t.shape)) for t in self.catalog.tensors if t.role == "parameter"}
        return module_tree(counts)

    # ---- dependency graph ----------------------------------------------------------------------------------
    @property
    def graph_hashes(self) -> list[str]:
        return sorted(self.catalog.graphs)

    def graph(self, step_type: str | None = None) -> StoredGraph | None:
        """The dependency graph of a step type (default: of the first step type that has one), or None
        when nothing was discovered (no registered tensor reached a recorded step)."""
        index = self.catalog.graph_of_type
        if step_type is None:
            step_type = next((t for t in self.catalog.step_types if t in index), None)
            if step_type is None:
                return None
        elif step_type not in index:
            if step_type not in self.catalog.step_types:
                raise UnknownSeriesError(f"no step type {step_type!r}; step types are {self.step_types}")
            return None
        key = index[step_type]
        data = json.loads(self.catalog.graphs[key])
        positions = {name: (float(x), float(y)) for name, (x, y) in data["positions"].items()}
        return StoredGraph(key, graph_from_dict(data["graph"]), positions,
                           tuple(t for t, h in index.items() if h == key))

    # ---- steps -------------------------------------------------------------------------------------------
    def _concat(self, name: str) -> np.ndarray:
        arrays = [view.array(name) for view in self._views.values()]
        return np.concatenate(arrays) if arrays else np.zeros(0)

    @cached_property
    def _index(self) -> dict[str, np.ndarray]:
        return {name: self._concat(name) for name in (schema.STEPS_STEP, schema.STEPS_TYPE, schema.STEPS_FLAGS)}

    @property
    def steps(self) -> np.ndarray:
        """Every recorded step number, in recording order."""
        return self._index[schema.STEPS_STEP]

    @property
    def step_iterations(self) -> np.ndarray:
        """How many iterations each step ran (int64), parallel to :attr:`steps`."""
        return self._concat(schema.STEPS_ITERATIONS).astype(np.int64)

    def steps_of_type(self, step_type: str) -> np.ndarray:
        if step_type not in self.catalog.step_types:
            raise UnknownSeriesError(f"no step type {step_type!r}; step types are {self.step_types}")
        tid = self.catalog.step_types.index(step_type)
        return self.steps[self._index[schema.STEPS_TYPE] == tid]

    def step_type_of(self, step: int) -> str:
        hits = np.flatnonzero(self.steps == step)
        if not len(hits):
            raise UnknownSeriesError(f"step {step} was not recorded; recorded steps run from "
                                     f"{self.steps.min() if len(self.steps) else '-'} to "
                                     f"{self.steps.max() if len(self.steps) else '-'}")
        return self.catalog.step_types[int(self._index[schema.STEPS_TYPE][hits[0]])]

    def step_reasons(self) -> dict[int, str]:
        """Why each step was recorded, as the recorder's policy said."""
        reasons = self._concat(schema.STEPS_REASON)
        return {int(s): (r.decode() if isinstance(r, bytes) else str(r)) for s, r in zip(self.steps, reasons)}

    # ---- summaries ---------------------------------------------------------------------------------------
    def _tensors_for(self, name: str, tensor: str | None = None) -> list[TensorInfo]:
        tid = self.catalog.tensor_id(name)
        if tid is not None and tensor is None:
            return [self.catalog.tensors[tid]]
        members = self.tensors_of(name)
        if not members:
            raise UnknownSeriesError(f"no node or tensor named {name!r}; nodes are {self.nodes}")
        if tensor is not None:
            members = [t for t in members if tensor in (t.name, t.label)]
            if not members:
                raise UnknownSeriesError(f"node {name!r} has no tensor {tensor!r}; it holds "
                                         f"{[t.label for t in self.tensors_of(name)]}")
        return members

    def _series(self, name: str, kind: str, tensor: str | None) -> tuple[TensorInfo, int]:
        members = self._tensors_for(name, tensor)
        if len(members) > 1:
            raise UnknownSeriesError(f"node {name!r} holds several tensors {[t.label for t in members]}; pass "
                                     f"tensor=<one of them>")
        info = members[0]
        sid = self.catalog.find_series(self.catalog.tensor_id(info.name), kind)
        if sid is None:
            raise UnknownSeriesError(f"tensor {info.name!r} has no kind {kind!r}; it has "
                                     f"{self.kinds(info.name)}")
        return info, sid

    def summary_rows(self, node: str, kind: str = schema.KIND_VALUE, *, tensor: str | None = None,
                     iteration: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(steps, rows)``: sufficient statistics ``[n, NUM_FIELDS]`` per step where the series was recorded.

        ``iteration=None`` merges the iterations of each step; an int selects one iteration.
        """
        _, sid = self._series(node, kind, tensor)
        steps, iterations, blocks = [], [], []
        for view in self._views.values():
            if not len(view.array(schema.SUMMARY_STEP)):
                continue
            steps.append(view.array(schema.SUMMARY_STEP))
            iterations.append(view.array(schema.SUMMARY_ITERATION))
            blocks.append(view.summary_block(sid))
        if not blocks:
            return np.zeros(0, np.int64), np.zeros((0, schema.NUM_FIELDS))
        step, it, rows = np.concatenate(steps), np.concatenate(iterations), np.concatenate(blocks)
        present = rows[:, schema.FIELD["count"]] > 0
        if iteration is not None:
            present &= it == iteration
        step, rows = step[present], rows[present]
        if iteration is None:
            step, rows = merge_groups(step, rows)
        return step, rows

    def summary(self, node: str, kind: str = schema.KIND_VALUE, stat: str = "mean", *, tensor: str | None = None,
                iteration: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(steps, values)`` of one statistic of one tensor over all steps where it was summarized.

        ``node`` is a node or tensor name; ``kind`` is ``value``, ``grad``, ``update`` or ``grad:<set>``;
        ``stat`` is one of ``comgra_ndbg.statistics.STATISTICS``.
        """
        if stat not in STATISTICS:
            raise UnknownSeriesError(f"unknown statistic {stat!r}; choose one of {sorted(STATISTICS)}")
        steps, rows = self.summary_rows(node, kind, tensor=tensor, iteration=iteration)
        return steps, derive_one(rows, stat)

    # ---- snapshots ---------------------------------------------------------------------------------------
    def snapshot_steps(self, node: str, kind: str = schema.KIND_VALUE, *, tensor: str | None = None) -> np.ndarray:
        _, sid = self._series(node, kind, tensor)
        found = [view.array(schema.SNAP_STEP)[view.array(schema.SNAP_SERIES) == sid] for view in self._views.values()]
        return np.unique(np.concatenate(found)) if found else np.zeros(0, np.int64)

    def snapshot(self, step: int, node: str, kind: str = schema.KIND_VALUE, *, tensor: str | None = None,
                 iteration: int = 0) -> Snapshot:
        """The stored arrays of one tensor at one step (and iteration)."""
        info, sid = self._series(node, kind, tensor)
        for view in self._views.values():
            hits = np.flatnonzero((view.array(schema.SNAP_STEP) == step) & (view.array(schema.SNAP_SERIES) == sid)
                                  & (view.array(schema.SNAP_ITERATION) == iteration))
            if len(hits):
                return self._read_snapshot(view, int(hits[0]), info, kind)
        available = self.snapshot_steps(node, kind, tensor=tensor)
        raise UnknownSeriesError(f"no snapshot of {info.name!r} ({kind}) at step {step}, iteration {iteration}; "
                                 f"snapshots exist at steps {available[:20].tolist()}"
                                 f"{' …' if len(available) > 20 else ''}")

    def _read_snapshot(self, view: _FileView, i: int, info: TensorInfo, kind: str) -> Snapshot:
        f = view.file
        shape = tuple(int(d) for d in view.array(schema.SNAP_SHAPE)[i] if d >= 0)
        s0, sn = int(view.array(schema.SNAP_SAMPLES_OFFSET)[i]), int(view.array(schema.SNAP_SAMPLES_COUNT)[i])
        v0, vn = int(view.array(schema.SNAP_VALUES_OFFSET)[i]), int(view.array(schema.SNAP_VALUES_COUNT)[i])
        x0 = int(view.array(schema.SNAP_INDEX_OFFSET)[i])
        return Snapshot(
            step=int(view.array(schema.SNAP_STEP)[i]),
            iteration=int(view.array(schema.SNAP_ITERATION)[i]),
            tensor=info.name,
            kind=kind,
            shape=shape,
            values=f[schema.VALUE_POOL][v0:v0 + vn],
            value_index=f[schema.VALUE_INDEX_POOL][x0:x0 + vn] if x0 >= 0 else None,
            sample_index=f[schema.SAMPLE_INDEX][s0:s0 + sn],
            sample_rows=schema.pad_fields(f[schema.SAMPLE_STATS][s0:s0 + sn]),
            sample_categories=tuple(_text(c) for c in f[schema.SAMPLE_CATEGORY][s0:s0 + sn])
            if schema.SAMPLE_CATEGORY in f else (),
        )

    # ---- KPIs and notes ------------------------------------------------------------------------------------
    def kpi(self, name: str, step_type: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(steps, values)`` of a KPI, optionally restricted to one step type."""
        if name not in self.catalog.kpi_names:
            raise UnknownSeriesError(f"no KPI {name!r}; KPIs are {self.kpi_names}")
        ids, steps, values = (self._concat(schema.KPI_ID), self._concat(schema.KPI_STEP),
                              self._concat(schema.KPI_VALUE))
        mask = ids == self.catalog.kpi_names.index(name)
        if step_type is not None:
            types = self._concat(schema.KPI_STEP_TYPE)
            if step_type not in self.catalog.step_types:
                raise UnknownSeriesError(f"no step type {step_type!r}; step types are {self.step_types}")
            mask &= types == self.catalog.step_types.index(step_type)
        return steps[mask].astype(np.int64), values[mask].astype(np.float64)

    @property
    def triggers(self) -> list[TriggerMark]:
        """Flight-recorder triggers that fired, in order."""
        return [TriggerMark(int(s), _text(r)) for s, r in zip(self._concat(schema.TRIGGER_STEP),
                                                              self._concat(schema.TRIGGER_REASON))]

    @property
    def notes(self) -> list[Note]:
        steps, times, texts = (self._concat(schema.NOTE_STEP), self._concat(schema.NOTE_TIME),
                               self._concat(schema.NOTE_TEXT))
        return [Note(int(s), float(t), x.decode() if isinstance(x, bytes) else str(x))
                for s, t, x in zip(steps, times, texts)]

    # ---- stored analysis results -----------------------------------------------------------------------------
    def analysis(self) -> StoredAnalysis | None:
        """Results stored by ``comgra_ndbg.analyze`` for this trial, or None; ``.stale`` is True when the
        recording holds a different number of steps than the analysis saw (see ``store/results.py``)."""
        return read_results(self.location, num_steps=len(self.steps))

    def __repr__(self) -> str:
        return (f"Recording(trial={self.trial!r}, steps={len(self.steps)}, nodes={len(self.nodes)}, "
                f"files={len(self._views)}, complete={self.is_complete})")


def _text(value: object) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)

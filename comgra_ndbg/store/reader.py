"""Reading recordings: a trial directory (live or finished), a group folder of trials, or one ``.h5`` file.

The reader keeps its files open and caches their small index arrays; timelines are read as one hyperslab
per file (``summary/data[series]``), so a 10k-step timeline is a single chunked read of the consolidated
file. ``refresh()`` picks up segments written since the last look, which is how the GUI follows a run.

Damage is never passed over in silence: by default a damaged, foreign or missing file, or a read that fails
its checksum, raises one ``CorruptRecordingError`` naming the file, the steps and what to run. Opened with
``damaged="skip"`` (the GUI, ``comgra-ndbg info``), the reader reads around it instead and lists each
finding in ``Recording.damage``.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path

import numpy as np

from comgra_ndbg.errors import (InvalidArgumentError, RecorderStateError, RecordingFormatError, RecordingNotFoundError,
                                UnknownSeriesError)
from comgra_ndbg.graph import graph_from_dict
from comgra_ndbg.graph.modules import ModuleInfo as ModuleTreeEntry
from comgra_ndbg.graph.modules import module_tree
from comgra_ndbg.stats.statistics import STATISTICS, derive_one, merge_groups
from comgra_ndbg.store import schema
from comgra_ndbg.store.catalog import Catalog, ModuleInfo, TensorInfo
from comgra_ndbg.store.config_reading import ConfigReading
from comgra_ndbg.store.damage import Damage, DamagedData, corrupt_error
from comgra_ndbg.store.fileview import FileView, open_h5
from comgra_ndbg.store.live import consolidated
from comgra_ndbg.store.lock import trial_state
from comgra_ndbg.store.ranks import RankAccess, holds_recording, locate_rank, rank_folders, rank_of_folder
from comgra_ndbg.store.records import LogEntry, Note, Snapshot, StoredGraph, TriggerMark
from comgra_ndbg.store.profile_reading import ProfileReading
from comgra_ndbg.store.snapshot_reading import SnapshotReading
from comgra_ndbg.store.step_tables import StepTables
from comgra_ndbg.store.results import StoredAnalysis, read_results
from comgra_ndbg.store.segment import parse_segment_name
from comgra_ndbg.store.views import between, file_steps, open_views

__all__ = ["open_recording", "list_trials", "Recording", "Snapshot", "Note", "StoredGraph", "TriggerMark", "LogEntry",
           "DAMAGE_MODES"]

DAMAGE_MODES = ("raise", "skip")


def list_trials(path: str | Path) -> list[str]:
    """Trial names under a group folder (or the one trial a trial directory / file holds)."""
    return [name for name, _ in _resolve(Path(path))]


def open_recording(path: str | Path, trial: str | None = None, *, rank: int | None = None,
                   damaged: str = "raise") -> Recording:
    """Open a recording for reading.

    ``path`` is a group folder (pass ``trial``, or the first trial in sorted order is opened; ``.trials``
    lists them all), a trial directory, or a single recording file. ``damaged="raise"`` (the default)
    raises ``CorruptRecordingError`` for damage; ``"skip"`` reads around it and lists it in ``.damage``.
    A distributed trial (one folder per rank, ``store/ranks.py``) opens rank ``rank``, by default its lowest
    (or the rank folder ``path`` names); ``.ranks`` lists them and ``.with_rank(r)`` opens another.
    """
    if damaged not in DAMAGE_MODES:
        raise InvalidArgumentError(f"damaged must be 'raise' or 'skip', got {damaged!r}")
    if not isinstance(path, (str, Path)) or not str(path):
        raise InvalidArgumentError(f"path must be a folder or file name (str or Path), got {path!r}")
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, (int, np.integer))):
        raise InvalidArgumentError(f"rank must be an int (a rank of a distributed trial) or None, got {rank!r}")
    named = rank_of_folder(Path(path))
    if named is not None:  # a rank folder: its trial, that rank unless another is asked for
        path, rank = named[0], named[1] if rank is None else rank
    entries = _resolve(Path(path))
    names = [n for n, _ in entries]
    if trial is None:
        trial, location = entries[0]
    else:
        matches = [loc for n, loc in entries if n == trial]
        if not matches:
            raise UnknownSeriesError(f"no trial {trial!r} in {path}; trials are {names}")
        location = matches[0]
    group = Path(path) if len(entries) > 1 or (Path(path) != location and not Path(path).is_file()) else None
    folder, ranked = locate_rank(location, trial, rank)
    return Recording(folder, trial=trial, trials=names, group=group, damaged=damaged, **ranked)


def _is_trial_dir(path: Path) -> bool:
    """A folder with one recording, or the trial folder of a distributed run (one recording per rank)."""
    return holds_recording(path) or bool(rank_folders(path))


def _resolve(path: Path) -> list[tuple[str, Path]]:
    if not path.exists():
        raise RecordingNotFoundError(f"{path} does not exist; pass the folder given to Recorder(...) or a trial "
                                     f"folder inside it")
    if path.is_file():
        try:
            with open_h5(path) as f:
                trial = str(f.attrs.get(schema.ATTR_TRIAL, path.stem))
                parts = f.attrs.get(schema.ATTR_PARTS, ())
            # the complete file of a recording in several files stands for its folder, which holds them all
            return [(trial, path.parent if len(parts) > 1 else path)]
        except RecordingFormatError as error:
            if path.name != schema.FINAL_NAME and parse_segment_name(path.name) is None:
                raise
            raise corrupt_error(path, [Damage("unreadable", path, "the file cannot be read", str(error))]) from None
    if _is_trial_dir(path):
        return [(path.name, path)]
    trials = sorted((p.name, p) for p in path.iterdir() if _is_trial_dir(p))
    if not trials:
        raise RecordingNotFoundError(f"{path} holds no recording (no trial folder with {schema.FINAL_NAME} or "
                                     f"segment files); record one with Recorder({str(path)!r}, trial=...)")
    return trials


class Recording(SnapshotReading, StepTables, RankAccess, ConfigReading, ProfileReading):
    """Read access to one trial (of one rank, for a distributed trial). Use as a context manager or call
    ``close()``."""

    def __init__(self, location: Path, *, trial: str, trials: list[str], group: Path | None,
                 damaged: str = "raise", rank: int | None = None, ranks: Sequence[int] = (),
                 ranks_root: Path | None = None) -> None:
        self._init_ranks(rank, list(ranks), ranks_root)
        self.location = Path(location)
        self.trial = trial
        self.trials = trials
        self.group = group
        self.skip_damage = damaged == "skip"
        self.damage: list[Damage] = []  # with damaged="skip": every finding read around so far
        self._closed = False
        self._open_views: dict[Path, FileView] = {}
        self._catalog: Catalog | None = None
        self.refresh()

    @property
    def _views(self) -> dict[Path, FileView]:
        """The open files; after ``close()`` a typed error (reading them there returned no data, silently)."""
        if self._closed:
            raise RecorderStateError(f"the recording of trial {self.trial!r} at {self.location} was closed (its "
                                     f"'with open_recording(...)' block ended, or close() was called); read it "
                                     f"inside the block, or open it again with open_recording(...)")
        return self._open_views

    @_views.setter
    def _views(self, views: dict[Path, FileView]) -> None:
        self._open_views = views

    # ---- lifecycle -------------------------------------------------------------------------------------
    def refresh(self) -> bool:
        """Look for segments written since the last call; True when something changed."""
        found = open_views(self.location, self._views, skip=self.skip_damage)
        if found is None:
            return False
        opened, damage = found
        if damage and (not self.skip_damage or not opened):
            for path, view in opened.items():
                if path not in self._views:
                    view.close()
            raise corrupt_error(self.location, damage)
        for path, view in self._views.items():
            if path not in opened:
                view.close()
        self._views = opened
        self.damage = [d for d in self.damage if d.kind == "checksum" and d.file in opened] + damage
        self._catalog = None
        self.__dict__.pop("_index", None)
        return True

    def _damaged(self, error: DamagedData, what: str, *, tensors: tuple[str, ...] = (),
                 steps: tuple[int, ...] | None = None) -> Damage:
        """The record of a failed read of ``error.file``: the steps it affects where known, else the file's
        steps, else the gap it leaves between its neighbours. Recorded in ``damage`` with ``skip``, else
        raised."""
        view = self._views.get(error.file)
        reason = error.reason.lower()
        kind = "checksum" if "checksum" in reason or "filter" in reason else "unreadable"
        if steps is None:
            steps = file_steps(view) if view is not None else ()
        record = Damage(kind, error.file, what, error.reason, tuple(steps), tensors,
                        None if steps or view is None else between(self._views, view.sequence))
        if not self.skip_damage:
            raise corrupt_error(self.location, [record])
        if record not in self.damage:
            self.damage.append(record)
        return record

    def close(self) -> None:
        """Close the files; later reads of data raise ``RecorderStateError``. Idempotent."""
        for view in self._open_views.values():
            view.close()
        self._open_views.clear()
        self._closed = True

    def __enter__(self) -> Recording:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def with_trial(self, trial: str) -> Recording:
        """Open another trial of the same group, read the same way (``damaged``; the same rank where it has
        that rank)."""
        if self.group is None:
            raise UnknownSeriesError(f"{self.location} is a single trial; there is no other trial to open")
        require(trial, str, "trial", f"a trial name (str); trials are {self.trials}")
        damaged = "skip" if self.skip_damage else "raise"
        rank = getattr(self, "rank", None)
        if rank is not None:
            try:
                return open_recording(self.group, trial, rank=rank, damaged=damaged)
            except UnknownSeriesError:  # that trial has no such rank (or none): its own default rank
                rank = None
        return open_recording(self.group, trial, damaged=damaged)

    # ---- catalog -------------------------------------------------------------------------------------------
    @property
    def catalog(self) -> Catalog:
        """The newest file's name tables (with ``damaged="skip"``, the newest that reads intact)."""
        if self._catalog is None:
            for view in reversed(list(self._views.values())):
                try:
                    self._catalog = view.catalog()
                    break
                except DamagedData as error:
                    self._damaged(error, "its catalog (names of tensors, step types, KPIs) was unreadable; an "
                                         "older file's was used", steps=())
            else:
                raise corrupt_error(self.location, self.damage)
        return self._catalog

    @property
    def is_complete(self) -> bool:
        """True once the recorder was closed and everything was consolidated: into one file, or into the
        files the complete one names (``parts``: a recording larger than the writer's ``max_file_bytes``)."""
        views = list(self._views.values())
        return (bool(views) and not self.damage
                and consolidated([view.sequence for view in views], views[-1].complete, views[-1].parts))

    @property
    def state(self) -> str:
        """``finished`` (closed and consolidated), ``live`` (its writer runs), ``killed`` (its writer ended
        without closing) or ``incomplete`` (not consolidated, and no lock says why)."""
        if not self.location.is_dir():
            return "finished" if self.is_complete else "incomplete"
        return trial_state(self.location, self.is_complete)[0]

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
        require(step_type, (str, type(None)), "step_type", f"a step type (str) or None; step types are "
                                                            f"{self.step_types}")
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
        arrays = []
        for view in self._views.values():
            try:
                arrays.append(view.array(name))
            except DamagedData as error:
                self._damaged(error, f"its table {name} was unreadable and is left out")
                arrays.append(_blank(view, name))
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
        require(step_type, str, "step_type", f"a step type (str); step types are {self.step_types}")
        if step_type not in self.catalog.step_types:
            raise UnknownSeriesError(f"no step type {step_type!r}; step types are {self.step_types}")
        tid = self.catalog.step_types.index(step_type)
        return self.steps[self._index[schema.STEPS_TYPE] == tid]

    def step_type_of(self, step: int) -> str:
        require(step, (int, np.integer), "step", "an int")
        hits = np.flatnonzero(self.steps == step)
        if not len(hits):
            raise UnknownSeriesError(f"step {step} was not recorded; recorded steps run from "
                                     f"{self.steps.min() if len(self.steps) else '-'} to "
                                     f"{self.steps.max() if len(self.steps) else '-'}")
        return self.catalog.step_types[int(self._index[schema.STEPS_TYPE][hits[0]])]

    def step_reasons(self) -> dict[int, str]:
        """Why each step was recorded, as the recorder's policy said."""
        return {int(s): str(r) for s, r in zip(self.steps, self._concat(schema.STEPS_REASON))}

    # ---- summaries ---------------------------------------------------------------------------------------
    def _tensors_for(self, name: str, tensor: str | None = None) -> list[TensorInfo]:
        require(name, str, "a node or tensor name", f"a str; nodes are {self.nodes[:8]}")
        require(tensor, (str, type(None)), "tensor=", "a tensor name of the node (str) or None")
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
        require(kind, str, "kind", "'value', 'grad', 'update' or 'grad:<set>'")
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
        require(iteration, (int, np.integer, type(None)), "iteration", "an int or None (every iteration merged)")
        info, sid = self._series(node, kind, tensor)
        steps, iterations, blocks = [], [], []
        for view in self._views.values():
            try:
                if not len(view.array(schema.SUMMARY_STEP)):
                    continue
                block, bad = view.summary_block(sid, skip=self.skip_damage)
                iterations.append(view.array(schema.SUMMARY_ITERATION))
            except DamagedData as error:
                rows = error.rows if error.rows is not None else np.zeros(0, np.int64)
                self._damaged(error, f"summaries ({kind})", tensors=(info.name,),
                              steps=_unique(view, schema.SUMMARY_STEP, rows) or None)
                continue
            if len(bad):
                self._damaged(DamagedData(view.path, schema.SUMMARY_DATA, "data fails its checksum"),
                              f"summaries ({kind}) read around", tensors=(info.name,),
                              steps=_unique(view, schema.SUMMARY_STEP, bad))
            steps.append(view.array(schema.SUMMARY_STEP))
            blocks.append(block)
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
        ``stat`` is one of ``comgra_ndbg.stats.statistics.STATISTICS``.
        """
        if not isinstance(stat, str) or stat not in STATISTICS:
            raise UnknownSeriesError(f"unknown statistic {stat!r}; choose one of {sorted(STATISTICS)}")
        steps, rows = self.summary_rows(node, kind, tensor=tensor, iteration=iteration)
        return steps, derive_one(rows, stat)

    # ---- stored analysis results -----------------------------------------------------------------------------
    def analysis(self) -> StoredAnalysis | None:
        """Results stored by ``comgra_ndbg.analyze`` for this trial, or None; ``.stale`` is True when the
        recording holds a different number of steps than the analysis saw (see ``store/results.py``)."""
        return read_results(self.location, num_steps=len(self.steps))

    def __repr__(self) -> str:
        if self._closed:
            return f"Recording(trial={self.trial!r}, closed)"
        return (f"Recording(trial={self.trial!r}, " + (f"rank={self.rank}, " if self.ranks else "") + f"steps={len(self.steps)}, nodes={len(self.nodes)}, "
                f"files={len(self._views)}, complete={self.is_complete}"
                + (f", damage={len(self.damage)}" if self.damage else "") + ")")


def require(value: object, types: type | tuple[type, ...], what: str, hint: str) -> None:
    """A query argument of the wrong type is a typed error that says what to pass (``hint``)."""
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        value_ok = False
    else:
        value_ok = isinstance(value, types)
    if not value_ok:
        raise UnknownSeriesError(f"{what} must be {hint}, got {type(value).__name__} ({value!r:.40})")


def _blank(view: FileView, name: str) -> np.ndarray:
    """What stands in for a damaged table whose rows must stay parallel to the steps: empty strings."""
    rows = len(view.array(schema.STEPS_STEP)) if name == schema.STEPS_REASON else 0
    return np.full(rows, "", dtype=object)


def _unique(view: FileView, name: str, rows: np.ndarray) -> tuple[int, ...]:
    """The distinct values of table ``name`` at ``rows`` (the steps of damaged summary rows); () when that
    table cannot be read either."""
    try:
        return tuple(np.unique(view.array(name)[rows]).tolist())
    except DamagedData:
        return ()

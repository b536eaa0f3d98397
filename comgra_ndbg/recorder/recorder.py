"""The Recorder: explicit registration of tensors inside a training loop, written to an HDF5 recording.

This is the only code that runs inside the user's loop. It validates calls at the boundary, asks its
policies whether the step is recorded (a skipped step costs a few attribute checks), summarises tensors
(``reduce.Reducer``: compiled kernels on the host, fused reductions on other devices) and their gradients
(``gradients``: kept by autograd hooks, summarised when the backward pass ends), and hands plain numpy rows
to the store writer. Problems of its own (a full disk, an odd tensor type) are reported
as warnings and never stop the training run; wrong calls raise typed errors that say what to do.

A step's type may be left open (``start_step(i, step_type=None)``) and decided at its end with
``decide_step(type, sample_categories=...)``; and a ``FlightRecorder`` keeps the last steps in RAM and
writes them only when a trigger fires. See ``policy`` and ``flight``.
"""
from __future__ import annotations

import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from comgra_ndbg.errors import (ComgraError, DuplicateTensorError, InvalidArgumentError, InvalidTensorError,
                                RecorderStateError)
from comgra_ndbg.graph import TensorEdge
from comgra_ndbg.recorder.dispatch import StepDispatcher
from comgra_ndbg.recorder.flight import FlightRecorder
from comgra_ndbg.recorder.grad_hook import on_gradient
from comgra_ndbg.recorder.gradient_batch import GradientBatch
from comgra_ndbg.recorder.gradients import GradientRecording
from comgra_ndbg.recorder.parameters import ParameterTracker
from comgra_ndbg.recorder.policy import Decision, Policy, PolicySpec, as_policy
from comgra_ndbg.recorder.reduce import DEFAULT_SATURATION_MARGIN, Reducer, saturation_bounds
from comgra_ndbg.recorder.snapshot import DeferredSnapshot, balanced_samples, take_snapshot, take_update_snapshot
from comgra_ndbg.recorder.step_record import StepRecord, SummaryRows
from comgra_ndbg.recorder.structure import StructureTracker
from comgra_ndbg.store import schema
from comgra_ndbg.store.catalog import Catalog, TensorInfo
from comgra_ndbg.store.writer import RecordingWriter, check_trial_name

__all__ = ["Recorder", "RecorderWarning"]

AUTO = "auto"
_SKIP = Decision(False, "", "never")


class RecorderWarning(UserWarning):
    """The recorder hit a problem of its own and carried on without it; training is unaffected."""


class Recorder(GradientRecording):
    """Records registered tensors, their gradients, tracked parameters and their updates, per step.

    ``path`` is a group folder; the trial's recording goes to ``path/trial``. ``summaries`` and
    ``snapshots`` are policies or their shorthands: an int k (every k steps), a list of steps, True/False,
    or a ``Policy``. ``enabled=False`` turns every method into an immediate return. ``flight_recorder``
    keeps the last steps in RAM and writes them when a trigger fires.

    >>> import tempfile, torch
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     with Recorder(folder, trial="demo") as rec:
    ...         for step in range(3):
    ...             with rec.step(step):
    ...                 _ = rec.register_tensor("x", torch.full((4, 2), float(step)), role="input")
    ...     from comgra_ndbg import open_recording
    ...     open_recording(folder).summary("x", "value", "mean")[1].tolist()
    [0.0, 1.0, 2.0]
    """

    def __init__(
        self,
        path: str | Path,
        trial: str | None = None,
        *,
        enabled: bool = True,
        mode: str = "w-",
        summaries: PolicySpec = 1,
        snapshots: PolicySpec = 10,
        num_samples: int = 8,
        max_elements: int = 4096,
        record_updates: bool = True,
        saturation_margin: float = DEFAULT_SATURATION_MARGIN,
        flush_every_seconds: float = 5.0,
        flush_every_steps: int | None = None,
        flight_recorder: FlightRecorder | None = None,
    ) -> None:
        self.enabled = bool(enabled)
        self._closed = False
        if not self.enabled:
            return
        _check_int("num_samples", num_samples, minimum=0)
        _check_int("max_elements", max_elements, minimum=1)
        if not 0 <= saturation_margin < 0.5:
            raise InvalidArgumentError(f"saturation_margin must be in [0, 0.5), got {saturation_margin}")
        if flight_recorder is not None and not isinstance(flight_recorder, FlightRecorder):
            raise InvalidArgumentError(f"flight_recorder must be a FlightRecorder, got {type(flight_recorder).__name__}")
        if trial is not None and trial != "":
            check_trial_name(trial)
        self.trial = trial or time.strftime("trial-%Y%m%d-%H%M%S-") + f"{time.time_ns() // 1000 % 1000000:06d}"
        self.path = Path(path) / self.trial
        self.summary_policy: Policy = as_policy(summaries, name="summaries")
        self.snapshot_policy: Policy = as_policy(snapshots, name="snapshots")
        self.num_samples = num_samples
        self.max_elements = max_elements
        self.record_updates = record_updates
        self.flush_every_seconds = flush_every_seconds
        self.flush_every_steps = flush_every_steps
        self.flight_recorder = flight_recorder
        self.catalog = Catalog()
        config = dict(summaries=repr(self.summary_policy), snapshots=repr(self.snapshot_policy),
                      num_samples=num_samples, max_elements=max_elements, record_updates=record_updates,
                      saturation_margin=saturation_margin, flight_recorder=repr(flight_recorder))
        self._writer = RecordingWriter(self.path, self.trial, mode=mode, config=config)
        self._saturation_margin = saturation_margin
        self._values = Reducer(saturation_margin)
        self._grads = Reducer(saturation_margin)
        self._updates = Reducer(saturation_margin)
        self._parameters = ParameterTracker(self.catalog)
        self._structure = StructureTracker(self.catalog)
        self._seen_steps: set[int] = set()
        self._last_step: int | None = None
        self._last_step_type = "default"
        self._last_flush = time.monotonic()
        self._steps_since_flush = 0
        self._warned: set[tuple[str, str]] = set()
        self._token = 0
        self._hooks: list[Any] = []
        self._dispatcher = StepDispatcher(self._writer, self.catalog, flight_recorder)
        self._grad_batch = GradientBatch(self._flush_gradients)
        self._series_of_parameters: dict[tuple[str, int], np.ndarray] = {}
        self._known_tensors: dict[str, tuple[str, str, int, int]] = {}  # name -> (role, node, tensor, value series)
        self._reset_step_state()

    # ---- lifecycle -------------------------------------------------------------------------------------
    def _reset_step_state(self) -> None:
        self._grad_batch.clear()
        for handle in self._hooks:  # a leaf, or a graph node kept across steps, would otherwise keep it for good
            handle.remove()
        self._hooks = []
        if len(self._values) or len(self._grads) or len(self._updates):  # left by a step that failed midway
            self._values = Reducer(self._saturation_margin)
            self._grads = Reducer(self._saturation_margin)
            self._updates = Reducer(self._saturation_margin)
        self._structure.clear()
        self._step_open = False
        self._step = -1
        self._step_type: str | None = None
        self._iteration = 0
        self._iterations_started = 0
        self._iteration_open = False
        self._names: set[str] = set()
        self._batch_size: int | None = None
        self._summary_decision = _SKIP
        self._snapshot_decision = _SKIP
        self._forced = False
        self._summarize = False  # compute summaries this step (policy, forced, or flight recorder)
        self._snapshot = False  # compute snapshots this step
        self._deferring = False  # snapshots wait for decide_step's sample choice
        self._sample_positions: np.ndarray | None = None
        self._sample_categories: np.ndarray | None = None
        self._value_keys: list[tuple[int, int, int]] = []  # (series, iteration, row in the reducer)
        self._value_blocks: list[tuple[np.ndarray, list[int]]] = []  # (series, rows in the reducer), iteration 0
        self._grad_keys: dict[tuple[int, int], int] = {}  # (tensor, iteration) -> row in the reducer
        self._grad_snaps: dict[tuple[int, int], Any] = {}  # (tensor, iteration) -> snapshot
        self._set_grads: dict[tuple[int, int], tuple[torch.Tensor | None, int]] = {}  # (gradient, version) so far
        self._set_grad_bytes = 0
        self._parameter_grads: dict[int, int] = {}  # tensor id -> row in the reducer (gradients_in_hook)
        self._parameter_grad_snaps: dict[int, Any] = {}
        self._deferred_values: list[DeferredSnapshot] = []
        self._deferred_grads: list[DeferredSnapshot] = []
        self._rows: list[SummaryRows] = []
        self._snaps: list[tuple[int, int, Any]] = []
        self._kpis: list[tuple[int, Any]] = []
        self._grad_kinds: list[str] = []

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.close()

    def close(self) -> None:
        """Finish an open step, write everything buffered, consolidate the trial into one file, and remove
        every hook the recorder added. Idempotent. The file is ``<path>/<trial>/recording.h5``."""
        if not self.enabled or self._closed:
            return
        if self._step_open:
            if self._step_type is None:
                self._guard("deciding the open step", partial(self.decide_step, self._last_step_type))
            self.finish_step()
        self._closed = True
        self._guard("closing the recording", lambda: self._writer.close(self.catalog))
        self._parameters.close()

    def flush(self) -> None:
        """Write everything buffered as a new segment now: when it returns, those steps are on disk and
        readable by other processes."""
        if not self.enabled or self._closed:
            return
        self._flush(wait=True)

    def _flush(self, *, wait: bool) -> None:
        self._guard("flushing", lambda: self._writer.flush(self.catalog, wait=wait))
        self._last_flush = time.monotonic()
        self._steps_since_flush = 0

    # ---- setup -----------------------------------------------------------------------------------------
    def track_module(self, name: str, module: torch.nn.Module, *, node_suffix: str = "",
                     gradients_in_hook: bool = False, node_prefixes: Sequence[str] = ()) -> None:
        """Record every parameter of ``module`` (value, gradient, update), named ``name.<parameter path>``.

        Each parameter belongs to the node named by its owning module's path (plus ``node_suffix``), so a
        ``Linear`` is one node holding ``weight`` and ``bias``; a parameter whose name starts with one of
        ``node_prefixes`` (the first that matches) belongs to the node named by that prefix instead, so
        ``node_prefixes=["model.encoder"]`` makes all of the encoder's parameters one node.
        ``gradients_in_hook=True`` reduces each gradient in its post-accumulate-grad hook as soon as it is
        accumulated (the last accumulation of a step wins), for loops that clear ``.grad`` before
        ``record_gradients()`` or ``finish_step()`` runs.
        """
        if not self.enabled:
            return
        self._check_open_recorder("track_module")
        if not isinstance(module, torch.nn.Module):
            raise InvalidTensorError(f"track_module({name!r}, ...) needs a torch.nn.Module, got "
                                     f"{type(module).__name__}")
        _check_name(name)
        if name in self._parameters.modules:
            raise InvalidArgumentError(f"a module is already tracked as {name!r}; give each module its own name")
        if self._step_open:
            raise RecorderStateError(f"track_module({name!r}) was called inside step {self._step}; call it before "
                                     f"the first start_step()")
        if not isinstance(node_suffix, str):
            raise InvalidArgumentError(f"node_suffix must be a str, got {type(node_suffix).__name__}")
        if isinstance(node_prefixes, str) or any(not isinstance(p, str) or not p for p in node_prefixes):
            raise InvalidArgumentError(f"node_prefixes must be a list of non-empty str, got {node_prefixes!r}")
        self._parameters.track(name, module, node_suffix=node_suffix,
                               on_gradient=self._on_parameter_grad if gradients_in_hook else None,
                               node_prefixes=tuple(node_prefixes))

    # ---- steps -----------------------------------------------------------------------------------------
    @contextmanager
    def step(self, step: int, step_type: str | None = "default") -> Iterator[Recorder]:
        """``with rec.step(i):`` — start_step on entry, finish_step on exit (also after an exception, so
        what was recorded before the failure, e.g. the first NaN, is kept)."""
        self.start_step(step, step_type)
        try:
            yield self
        finally:
            if self.enabled and self._step_open:
                if self._step_type is None:
                    self.decide_step(self._last_step_type)
                self.finish_step()

    def start_step(self, step: int, step_type: str | None = "default") -> None:
        """Begin training step ``step`` (an int, unique within the trial) of type ``step_type``.

        ``step_type=None`` leaves the type open: the step is recorded tentatively if any type could be
        recorded now, and ``decide_step(type)`` settles it before ``finish_step()``.
        """
        if not self.enabled:
            return
        self._check_open_recorder("start_step")
        if self._step_open:
            raise RecorderStateError(f"start_step({step}) while step {self._step} is still open; call finish_step() "
                                     f"at the end of each step")
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise InvalidArgumentError(f"step must be a non-negative int, got {step!r}")
        step = int(step)
        if step in self._seen_steps:
            raise RecorderStateError(f"step {step} was already started once in this trial; step numbers must be "
                                     f"unique (use a global step counter, not the batch index of an epoch)")
        if step_type is not None and (not isinstance(step_type, str) or not step_type):
            raise InvalidArgumentError(f"step_type must be a non-empty str (or None to decide it at the end of the "
                                       f"step), got {step_type!r}")
        self._seen_steps.add(step)
        self._step_open = True
        self._before_step = (self._last_step, self._last_step_type)  # what discard_step() puts back
        self._step = self._last_step = step
        self._step_type = step_type
        if step_type is not None:
            self._last_step_type = step_type
        self._token += 1
        self._summary_decision = self.summary_policy.decide(step, step_type)
        self._snapshot_decision = self.snapshot_policy.decide(step, step_type)
        self._forced = self._dispatcher.is_forced(step)
        flight = self.flight_recorder is not None
        self._summarize = self._summary_decision.record or self._forced or flight
        self._snapshot = self._snapshot_decision.record or self._forced or flight
        self._deferring = self._snapshot and step_type is None
        if self._summarize or self._snapshot:
            self._guard("recording parameters", self._start_parameters)
        else:
            self._parameters.unwatch()  # a skipped step's backward pass pays nothing for them

    def decide_step(self, step_type: str, *, sample_categories: Sequence | torch.Tensor | np.ndarray | None = None
                    ) -> bool:
        """Settle the type of a step started with ``step_type=None``; returns whether it is recorded.

        ``sample_categories`` (one label per sample of the batch, e.g. the class or the sequence length)
        makes the snapshot keep a category-balanced choice of samples instead of the first ones.
        """
        if not self.enabled:
            return False
        self._check_step_open("decide_step()")
        if self._step_type is not None:
            raise RecorderStateError(f"step {self._step} already has the type {self._step_type!r}; decide_step() is "
                                     f"for steps started with start_step({self._step}, step_type=None)")
        if not isinstance(step_type, str) or not step_type:
            raise InvalidArgumentError(f"step_type must be a non-empty str, got {step_type!r}")
        categories = None
        if sample_categories is not None and (self._summarize or self._snapshot):  # else nothing can be kept
            categories = np.asarray(sample_categories.detach().cpu() if isinstance(sample_categories, torch.Tensor)
                                    else sample_categories).reshape(-1)
            if self._batch_size is not None and len(categories) != self._batch_size:
                raise InvalidArgumentError(f"sample_categories has {len(categories)} entries but the batch of step "
                                           f"{self._step} has {self._batch_size} samples; give one category per sample")
        self._step_type = self._last_step_type = step_type
        summary = self.summary_policy.decide(self._step, step_type)
        snapshot = self.snapshot_policy.decide(self._step, step_type)
        self._summary_decision = Decision(summary.record, f"retroactive decision: {summary.reason}", summary.rule)
        self._snapshot_decision = Decision(snapshot.record, f"retroactive decision: {snapshot.reason}", snapshot.rule)
        keep_snapshots = snapshot.record or self._forced or self.flight_recorder is not None
        if categories is not None and keep_snapshots:
            self._sample_categories = categories
            self._sample_positions = balanced_samples(categories.tolist(), self.num_samples)
        if keep_snapshots:
            self._guard("taking deferred snapshots", self._take_deferred)
        self._deferring = False
        self._deferred_values, self._deferred_grads = [], []
        self._snapshot = keep_snapshots
        if not (summary.record or self._forced or self.flight_recorder is not None):
            self._summarize = False
        return summary.record or snapshot.record or self._forced

    def start_iteration(self) -> int:
        """Begin the next iteration (forward pass) of a multi-iteration step; returns its index.

        Tensors registered before the first call belong to iteration 0, those after ``finish_iteration`` to
        the last iteration.
        """
        if not self.enabled:
            return 0
        self._check_step_open("start_iteration")
        if self._iteration_open:
            raise RecorderStateError(f"start_iteration() while iteration {self._iteration} of step {self._step} is "
                                     f"open; call finish_iteration() first")
        if self._iterations_started:
            self._iteration += 1
            self._names = set()
        self._iterations_started += 1
        self._iteration_open = True
        return self._iteration

    def finish_iteration(self) -> None:
        """End the current iteration."""
        if not self.enabled:
            return
        self._check_step_open("finish_iteration")
        if not self._iteration_open:
            raise RecorderStateError(f"finish_iteration() without start_iteration() in step {self._step}")
        self._iteration_open = False

    @property
    def current_step(self) -> int | None:
        """The open step, or None between steps."""
        return self._step if self.enabled and self._step_open else None

    @property
    def is_recording(self) -> bool:
        """Whether the open step computes summaries or snapshots (False on skipped steps)."""
        return self.enabled and self._step_open and (self._summarize or self._snapshot)

    # ---- tensors ---------------------------------------------------------------------------------------
    def register_tensor(
        self,
        name: str,
        tensor: torch.Tensor,
        *,
        role: str = "intermediate",
        node: str | None = None,
        batched: bool | None = None,
        bounds: tuple[float, float] | None | str = AUTO,
        module: str = "",
    ) -> torch.Tensor:
        """Record ``tensor`` under ``name`` in the current iteration; returns ``tensor`` unchanged.

        ``role`` is one of input, target, output, loss, parameter, intermediate. ``node`` groups several
        tensors into one graph node (default: the name). ``batched`` says whether dim 0 is the batch
        (default: yes if dim 0 matches the step's batch size, set by the first batched tensor). ``bounds``
        is the activation's output range for saturation statistics (default: known for tanh, sigmoid and
        softmax outputs; None for no saturation statistics). ``module`` is the path of the module that
        produced the tensor, if any. Its gradient is recorded, through a hook, when it requires one.
        """
        if not self.enabled:
            return tensor
        if not self._step_open:
            self._check_step_open(f"register_tensor({name!r})")
        if not isinstance(tensor, torch.Tensor):
            raise InvalidTensorError(f"register_tensor({name!r}, ...) needs a torch.Tensor, got "
                                     f"{type(tensor).__name__}; convert it with torch.as_tensor(...) first")
        if not isinstance(name, str) or not name:
            _check_name(name)
        if name in self._names:
            raise DuplicateTensorError(
                f"tensor {name!r} was already registered in iteration {self._iteration} of step {self._step}; "
                f"give each tensor its own name, or call start_iteration() between forward passes")
        if role not in schema.ROLES:
            raise InvalidArgumentError(f"role of {name!r} must be one of {list(schema.ROLES)}, got {role!r}")
        if not (self._summarize or self._snapshot):
            self._names.add(name)
            return tensor
        self._names.add(name)
        try:
            self._record_tensor(name, tensor, role, node, batched, bounds, module)
        except ComgraError:
            self._names.discard(name)
            raise
        except Exception as error:  # a recorder problem must not break the training run
            self._warn(f"recording tensor {name!r}", error, name)
        return tensor

    def _record_tensor(self, name: str, tensor: torch.Tensor, role: str, node: str | None, batched: bool | None,
                       bounds: Any, module: str = "") -> None:
        if tensor.layout != torch.strided:
            tensor = tensor.to_dense()
        if batched is None:
            batched = (role != "parameter" and tensor.dim() >= 1
                       and (self._batch_size is None or tensor.shape[0] == self._batch_size))
        if batched and self._batch_size is None and tensor.dim() >= 1:
            self._batch_size = int(tensor.shape[0])
        if isinstance(bounds, str):
            bounds = saturation_bounds(tensor)
        node = node or name
        known = self._known_tensors.get(name)
        if known is None or known[0] != role or known[1] != node:
            tid = self._tensor_id(name, tensor, role, node, bool(batched), bounds, module)
            known = self._known_tensors[name] = (role, node, tid, self.catalog.series_id(tid, schema.KIND_VALUE))
        tid, sid = known[2], known[3]
        iteration = self._iteration
        if self._summarize:
            self._value_keys.append((sid, iteration, self._values.add(tensor, batched=bool(batched), bounds=bounds)))
        if self._snapshot:
            if self._deferring and batched:
                self._deferred_values.append(DeferredSnapshot(sid, iteration, tensor.detach().clone(), True, bounds))
            else:
                self._snaps.append((sid, iteration, self._take(tensor, bool(batched), bounds)))
        self._structure.add(name, iteration, tensor)
        if tensor.requires_grad:
            self._hooks.append(on_gradient(tensor, partial(self._on_grad, self._token, tid, iteration, bool(batched),
                                                           not _compiled_region(tensor))))

    def add_dependency(self, source: str, target: str, *, source_iteration: int | None = None,
                       target_iteration: int | None = None, discovered: bool = False) -> None:
        """Declare that ``target`` depends on ``source`` where autograd cannot see it (a detach, integer
        indices, a non-differentiable step). Both are tensor names; iterations default to the current one.
        ``discovered=True`` marks an edge that autograd did show, elsewhere (an eager pass over a compiled
        model): it counts as a forward edge, not a manual one.
        """
        if not self.enabled:
            return
        self._check_step_open(f"add_dependency({source!r}, {target!r})")
        _check_name(source)
        _check_name(target)
        iterations = [self._iteration if i is None else i for i in (source_iteration, target_iteration)]
        if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in iterations):
            raise InvalidArgumentError(f"iterations of add_dependency({source!r}, {target!r}) must be ints >= 0")
        if source == target and iterations[0] == iterations[1]:
            raise InvalidArgumentError(f"add_dependency({source!r}, {target!r}) connects a tensor to itself")
        self._structure.add_edge(TensorEdge(source, target, iterations[0], iterations[1]), discovered=discovered)

    def _declare_all_edges(self) -> None:
        """This step's edges all come through ``add_dependency`` (NeuralDbg's eager pass over a partly
        compiled model): walking autograd would add shortcuts across the compiled region, whose backward is
        one opaque node."""
        self._structure.autograd = False

    def _tensor_id(self, name: str, tensor: torch.Tensor, role: str, node: str, batched: bool,
                   bounds: tuple[float, float] | None, module: str = "") -> int:
        tid = self.catalog.tensor_id(name)
        if tid is None:
            return self.catalog.add_tensor(TensorInfo(
                name=name, node=node, role=role, module=module, dtype=str(tensor.dtype).replace("torch.", ""),
                shape=tuple(tensor.shape), batched=batched, bounds=bounds))
        info = self.catalog.tensors[tid]
        if info.role != role or info.node != node:
            raise InvalidArgumentError(
                f"tensor {name!r} was first registered with role {info.role!r} in node {info.node!r}, now with role "
                f"{role!r} in node {node!r}; keep one role and node per name (or use a new name)")
        return tid

    def _take(self, tensor: torch.Tensor, batched: bool, bounds: tuple[float, float] | None = None) -> Any:
        data = take_snapshot(tensor, batched=batched, num_samples=self.num_samples, max_elements=self.max_elements,
                             bounds=bounds, saturation_margin=self._saturation_margin,
                             sample_positions=self._sample_positions if batched else None)
        if batched and self._sample_categories is not None and len(data.sample_index):
            labels = np.array([str(c) for c in self._sample_categories[data.sample_index]], dtype=object)
            data = type(data)(data.shape, data.sample_index, data.sample_stats, data.values, data.value_index, labels)
        return data

    def _take_deferred(self) -> None:
        for item in self._deferred_values:
            self._snaps.append((item.key, item.iteration, self._take(item.tensor, True, item.bounds)))
        for item in self._deferred_grads:
            if item.kind is None:  # not collected yet: the next _collect_gradients maps tensor to series
                self._grad_snaps[(item.key, item.iteration)] = self._take(item.tensor, True)
            else:
                self._snaps.append((self.catalog.series_id(item.key, item.kind), item.iteration,
                                    self._take(item.tensor, True)))

    # ---- parameters ------------------------------------------------------------------------------------
    def _start_parameters(self) -> None:
        tracker = self._parameters
        tracker.watch()
        tracker.forget_gradients()  # accumulated between steps: not this step's
        series = self._parameter_series(schema.KIND_VALUE)
        if self._summarize:
            if self.record_updates:
                indices = tracker.capture(self._values)
            else:
                indices = self._values.add_many([value for _, value in tracker.values()])
            self._value_blocks.append((series, indices))
        elif self.record_updates:
            tracker.capture()
        if self._snapshot:
            for sid, (_, value) in zip(series.tolist(), tracker.values()):
                self._snaps.append((sid, 0, self._take(value, False)))

    def _parameter_series(self, kind: str) -> np.ndarray:
        """Series ids of every tracked parameter's ``kind``, in ``ParameterTracker.tensor_ids()`` order."""
        tids = self._parameters.tensor_ids()
        key = (kind, len(tids))
        cached = self._series_of_parameters.get(key)
        if cached is None:
            cached = self._series_of_parameters[key] = np.array([self.catalog.series_id(tid, kind) for tid in tids],
                                                                dtype=np.int64)
        return cached

    def _finish_parameters(self) -> None:
        if not self._parameters.captured:
            return
        keep = self._parameters.update_mask()  # a frozen parameter that did not move has no update
        everything = bool(keep.all())
        if everything:
            series = self._parameter_series(schema.KIND_UPDATE)
        else:
            series = np.array([self.catalog.series_id(tid, schema.KIND_UPDATE) for tid, kept
                               in zip(self._parameters.tensor_ids(), keep.tolist()) if kept], dtype=np.int64)
        if self._summarize:
            indices = self._parameters.summarize_updates(self._updates)
            rows = self._updates.collect()[indices]
            self._rows.append(SummaryRows(series, np.zeros(len(series), np.int64), rows if everything else rows[keep]))
        if self._snapshot:
            for (tid, value, start), kept in zip(self._parameters.update_pairs(), keep.tolist()):
                if kept:
                    self._snaps.append((self.catalog.series_id(tid, schema.KIND_UPDATE), 0,
                                        take_update_snapshot(value, start, max_elements=self.max_elements)))
        self._parameters.release()

    # ---- KPIs and notes ----------------------------------------------------------------------------------
    def record_kpi(self, name: str, value: float | torch.Tensor) -> None:
        """Record a scalar KPI (e.g. the loss) for the current step — or, between steps, the last one.

        KPIs are kept for every step, recorded or skipped by the policies. Tensors are read at the end of
        the step, in one copy with everything else, not with ``.item()``.
        """
        if not self.enabled:
            return
        self._check_open_recorder("record_kpi")
        _check_name(name)
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise InvalidTensorError(f"KPI {name!r} must be a scalar, got a tensor of shape "
                                         f"{tuple(value.shape)}; reduce it first (e.g. .mean())")
            value = value.detach().reshape(())
        elif isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise InvalidTensorError(f"KPI {name!r} must be a number or a one-element tensor, got "
                                     f"{type(value).__name__}")
        if self._last_step is None:
            raise RecorderStateError(f"record_kpi({name!r}) before any step; call start_step() first")
        kpi = self.catalog.kpi_id(name)
        if self._step_open:
            self._kpis.append((kpi, value))
        else:
            type_id = self.catalog.step_type_id(self._last_step_type)
            self._writer.add_kpi(self._last_step, kpi, float(value), type_id)

    def add_note(self, text: str) -> None:
        """Attach a free-text note to the current (or last) step, e.g. "lr lowered to 1e-4"."""
        if not self.enabled:
            return
        self._check_open_recorder("add_note")
        if not isinstance(text, str):
            raise InvalidArgumentError(f"a note must be a str, got {type(text).__name__}")
        self._writer.add_note(-1 if self._last_step is None else self._last_step, text)

    # ---- finishing a step --------------------------------------------------------------------------------
    def finish_step(self) -> None:
        """End the step: derive parameter updates, collect every statistic in one host copy, and write."""
        if not self.enabled:
            return
        self._check_open_recorder("finish_step")
        if not self._step_open:
            raise RecorderStateError("finish_step() without start_step(); call start_step(step) at the beginning of "
                                     "each training step")
        if self._step_type is None:
            raise RecorderStateError(f"step {self._step} was started without a step type; call "
                                     f"decide_step(step_type) before finish_step()")
        type_id = self.catalog.step_type_id(self._step_type)
        record = None
        urgent = False
        if self._summarize or self._snapshot:
            record = self._guard("finishing the step", partial(self._build_record, type_id))
        kpis = self._guard("recording KPIs", partial(self._write_kpis, type_id)) or {}
        write_summary = self._summary_decision.record or self._forced
        write_snapshot = self._snapshot_decision.record or self._forced
        if record is not None:
            written = self._guard("writing the step", partial(self._dispatcher.dispatch, record, kpis, write_summary,
                                                              write_snapshot))
            self._steps_since_flush += 1 if written else 0
            if self._dispatcher.flush_now:  # a trigger fired: its steps go to disk before the next step
                self._dispatcher.flush_now = False
                urgent = True
        elif not (write_summary or write_snapshot):
            self._parameters.forget_gradients()
        self.summary_policy.commit(self._step, self._step_type, write_summary and record is not None)
        self.snapshot_policy.commit(self._step, self._step_type, write_snapshot and record is not None)
        self._token += 1
        self._reset_step_state()
        if urgent:
            self._flush(wait=True)
        elif self._flush_due():  # periodic: written on a worker thread while training goes on
            self._flush(wait=False)

    def discard_step(self) -> None:
        """Drop the open step without writing any of it (values, gradients, updates, KPIs); its step number
        may be started again. For a step that turned out not to be one: ``NeuralDbg`` discards the passes of
        a model run inside another model's update (a GAN's discriminator during the generator's step)."""
        if not self.enabled:
            return
        self._check_step_open("discard_step()")
        self._structure.rollback()
        self._seen_steps.discard(self._step)
        self._last_step, self._last_step_type = self._before_step
        self._parameters.release()
        self._parameters.forget_gradients()
        self._token += 1
        self._reset_step_state()

    def _build_record(self, type_id: int) -> StepRecord:
        if len(self._grad_batch):
            self._flush_gradients()
        pending = (self._grad_keys or self._grad_snaps or self._deferred_grads or self._parameter_grads
                   or self._parameter_grad_snaps)
        if pending or (not self._grad_kinds and self._parameters.has_fresh_gradients()):
            kind = schema.KIND_GRAD if not self._grad_kinds else self._grad_kinds[-1]
            self._collect_gradients(kind)
        self._guard("discovering the dependency graph", self._discover_graph)
        self._finish_parameters()
        self._collect_values()
        reasons = [d.reason for d in (self._summary_decision, self._snapshot_decision) if d.record]
        if self._forced:
            reasons.insert(0, self._dispatcher.forced_reason(self._step))
        return StepRecord(self._step, type_id, self._iteration + 1, "; ".join(dict.fromkeys(reasons)), time.time(),
                          SummaryRows.join(self._rows), self._snaps)

    def _write_kpis(self, type_id: int) -> dict[str, float]:
        if not self._kpis:
            return {}
        # Device tensors are read in one copy; a CPU tensor is read directly (no device to wait for).
        tensors = [v for _, v in self._kpis if isinstance(v, torch.Tensor) and not v.is_cpu]
        host = iter(torch.stack([t.to(torch.float64) for t in tensors]).cpu().tolist()) if tensors else iter(())
        values = {}
        for kpi, value in self._kpis:
            if isinstance(value, torch.Tensor):
                number = float(value.item()) if value.is_cpu else next(host)
            else:
                number = float(value)
            self._writer.add_kpi(self._step, kpi, number, type_id)
            values[self.catalog.kpi_names[kpi]] = number
        return values

    def _flush_due(self) -> bool:
        if self.flush_every_steps is not None and self._steps_since_flush >= self.flush_every_steps:
            return True
        return time.monotonic() - self._last_flush >= self.flush_every_seconds

    # ---- checks and fault isolation ----------------------------------------------------------------------
    def _check_open_recorder(self, call: str) -> None:
        if self._closed:
            raise RecorderStateError(f"{call} on a closed recorder; create a new Recorder (with another trial name) "
                                     f"to record more")

    def _check_step_open(self, call: str) -> None:
        self._check_open_recorder(call)
        if not self._step_open:
            raise RecorderStateError(f"{call} outside a step; call start_step(step) first (or use `with "
                                     f"rec.step(step):`)")

    def _guard(self, what: str, fn: Any, key: str = "") -> Any:
        try:
            return fn()
        except ComgraError:
            raise
        except Exception as error:  # a recorder problem must not break the training run
            self._warn(what, error, key)
            return None

    def _note_once(self, key: str, message: str) -> None:
        """Warn about a recording choice (not a failure) once per run and ``key``."""
        if (key, "") not in self._warned:
            self._warned.add((key, ""))
            warnings.warn(f"comgra_ndbg: {message}", RecorderWarning, stacklevel=3)

    def _warn(self, what: str, error: BaseException, key: str = "") -> None:
        tag = (what + key, type(error).__name__)
        if tag in self._warned:
            return
        self._warned.add(tag)
        step = self._step if self._step_open else self._last_step  # a flush runs after its step closed
        warnings.warn(f"comgra_ndbg: {what} failed at step {step} ({type(error).__name__}: {error}); "
                      f"training continues and this part is not recorded", RecorderWarning, stacklevel=3)


def _compiled_region(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` comes out of a ``torch.compile`` region, whose backward may write into the buffer
    of the gradient it receives (so that gradient must be summarised inside its hook)."""
    return tensor.grad_fn is not None and "CompiledFunction" in type(tensor.grad_fn).__name__


def _check_name(name: object) -> None:
    if not isinstance(name, str) or not name:
        raise InvalidArgumentError(f"names must be non-empty strings, got {name!r}")


def _check_int(what: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidArgumentError(f"{what} must be an int >= {minimum}, got {value!r}")

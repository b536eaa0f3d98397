"""The Recorder: explicit registration of tensors inside a training loop, written to an HDF5 recording.

This is the only code that runs inside the user's loop. It validates calls at the boundary, asks its
policies whether the step is recorded (a skipped step costs a few attribute checks), reduces tensors on
their device (``reduce.Reducer``), reduces gradients inside autograd hooks as they are produced, and hands
plain numpy rows to the store writer. Problems of its own (a full disk, an odd tensor type) are reported
as warnings and never stop the training run; wrong calls raise typed errors that say what to do.
"""
from __future__ import annotations

import json
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from comgra_ndbg.errors import (ComgraError, DuplicateTensorError, InvalidArgumentError, InvalidTensorError,
                                RecorderStateError)
from comgra_ndbg.graph import (GraphCache, TensorEdge, build_graph, discover_edges, graph_to_dict, layered_layout,
                               merge_manual_edges, structure_signature)
from comgra_ndbg.recorder.policy import Policy, PolicySpec, as_policy
from comgra_ndbg.recorder.reduce import DEFAULT_SATURATION_MARGIN, Reducer, saturation_bounds
from comgra_ndbg.recorder.snapshot import take_snapshot
from comgra_ndbg.store import schema
from comgra_ndbg.store.catalog import Catalog, ModuleInfo, TensorInfo
from comgra_ndbg.store.writer import RecordingWriter

__all__ = ["Recorder", "RecorderWarning"]

AUTO = "auto"


class RecorderWarning(UserWarning):
    """The recorder hit a problem of its own and carried on without it; training is unaffected."""


@dataclass
class _Tracked:
    name: str
    parameter: torch.nn.Parameter
    tensor_id: int


class Recorder:
    """Records registered tensors, their gradients, tracked parameters and their updates, per step.

    ``path`` is a group folder; the trial's recording goes to ``path/trial``. ``summaries`` and
    ``snapshots`` are policies or their shorthands: an int k (every k steps), a list of steps, True/False,
    or a ``Policy``. ``enabled=False`` turns every method into an immediate return.

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
    ) -> None:
        self.enabled = bool(enabled)
        self._closed = False
        if not self.enabled:
            return
        _check_positive("num_samples", num_samples, minimum=0)
        _check_positive("max_elements", max_elements, minimum=1)
        if not 0 <= saturation_margin < 0.5:
            raise InvalidArgumentError(f"saturation_margin must be in [0, 0.5), got {saturation_margin}")
        self.trial = trial or time.strftime("trial-%Y%m%d-%H%M%S")
        self.path = Path(path) / self.trial
        self.summary_policy: Policy = as_policy(summaries, name="summaries")
        self.snapshot_policy: Policy = as_policy(snapshots, name="snapshots")
        self.num_samples = num_samples
        self.max_elements = max_elements
        self.record_updates = record_updates
        self.flush_every_seconds = flush_every_seconds
        self.flush_every_steps = flush_every_steps
        self.catalog = Catalog()
        config = dict(summaries=repr(self.summary_policy), snapshots=repr(self.snapshot_policy),
                      num_samples=num_samples, max_elements=max_elements, record_updates=record_updates,
                      saturation_margin=saturation_margin)
        self._writer = RecordingWriter(self.path, self.trial, mode=mode, config=config)
        self._saturation_margin = saturation_margin
        self._values = Reducer(saturation_margin)
        self._grads = Reducer(saturation_margin)
        self._tracked: list[_Tracked] = []
        self._tracked_modules: set[str] = set()
        self._buffers: list[torch.Tensor] | None = None
        self._seen_steps: set[int] = set()
        self._last_step: int | None = None
        self._last_flush = time.monotonic()
        self._steps_since_flush = 0
        self._warned: set[tuple[str, str]] = set()
        self._token = 0
        self._graph_cache = GraphCache()
        self._last_step_type = ""
        self._hooks: list[Any] = []
        self._reset_step_state()

    # ---- lifecycle -------------------------------------------------------------------------------------
    def _reset_step_state(self) -> None:
        for handle in self._hooks:  # a hook on a leaf (parameter, input) would otherwise stay for good
            handle.remove()
        self._hooks = []
        if len(self._values) or len(self._grads):  # rows left by a step whose recording failed midway
            self._values = Reducer(self._saturation_margin)
            self._grads = Reducer(self._saturation_margin)
        self._step_open = False
        self._step = -1
        self._step_type = ""
        self._iteration = 0
        self._iterations_started = 0
        self._iteration_open = False
        self._names: set[str] = set()
        self._batch_size: int | None = None
        self._summarize = False
        self._snapshot = False
        self._reason = ""
        self._value_keys: list[tuple[int, int, int]] = []  # (series, iteration, row in the reducer)
        self._grad_keys: list[tuple[int, int, int]] = []  # (tensor, iteration, row in the reducer)
        self._grad_snaps: list[tuple[int, int, Any]] = []
        self._rows: list[tuple[int, int, np.ndarray]] = []
        self._snaps: list[tuple[int, int, Any]] = []
        self._kpis: list[tuple[int, Any]] = []
        self._grad_kinds: list[str] = []
        self._updates_ready = False
        self._registered: list[tuple[str, int, torch.Tensor]] = []
        self._manual_edges: list[TensorEdge] = []

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.close()

    def close(self) -> None:
        """Finish an open step, write everything buffered and consolidate the trial into one file.

        Idempotent. The consolidated file is ``<path>/<trial>/recording.h5``.
        """
        if not self.enabled or self._closed:
            return
        if self._step_open:
            self.finish_step()
        self._closed = True
        self._guard("closing the recording", lambda: self._writer.close(self.catalog))
        self._buffers = None
        self._tracked.clear()

    def flush(self) -> None:
        """Write everything buffered as a new segment now (it is readable by other processes at once)."""
        if not self.enabled or self._closed:
            return
        self._guard("flushing", lambda: self._writer.flush(self.catalog))
        self._last_flush = time.monotonic()
        self._steps_since_flush = 0

    # ---- setup -----------------------------------------------------------------------------------------
    def track_module(self, name: str, module: torch.nn.Module) -> None:
        """Record every parameter of ``module`` (value, gradient, update), named ``name.<parameter path>``.

        Each parameter belongs to the node named by its owning module's path, so a ``Linear`` is one node
        holding ``weight`` and ``bias``.
        """
        if not self.enabled:
            return
        self._check_open_recorder("track_module")
        if not isinstance(module, torch.nn.Module):
            raise InvalidTensorError(f"track_module({name!r}, ...) needs a torch.nn.Module, got "
                                     f"{type(module).__name__}")
        _check_name(name)
        if name in self._tracked_modules:
            raise InvalidArgumentError(f"a module is already tracked as {name!r}; give each module its own name")
        if self._step_open:
            raise RecorderStateError(f"track_module({name!r}) was called inside step {self._step}; call it before "
                                     f"the first start_step()")
        self._tracked_modules.add(name)
        for path, sub in module.named_modules():
            own = sum(p.numel() for p in sub.parameters(recurse=False))
            self.catalog.add_module(ModuleInfo(_join(name, path), type(sub).__name__, own))
        for path, parameter in module.named_parameters():
            owner = path.rpartition(".")[0]
            full = _join(name, path)
            info = TensorInfo(name=full, node=_join(name, owner), role="parameter", module=_join(name, owner),
                              dtype=str(parameter.dtype).replace("torch.", ""),
                              shape=tuple(parameter.shape), batched=False)
            existing = self.catalog.tensor_id(full)
            tid = existing if existing is not None else self.catalog.add_tensor(info)
            self._tracked.append(_Tracked(full, parameter, tid))
        self._buffers = None

    # ---- steps -----------------------------------------------------------------------------------------
    @contextmanager
    def step(self, step: int, step_type: str = "default") -> Iterator[Recorder]:
        """``with rec.step(i):`` — start_step on entry, finish_step on exit (also after an exception, so
        what was recorded before the failure, e.g. the first NaN, is kept)."""
        self.start_step(step, step_type)
        try:
            yield self
        finally:
            if self.enabled and self._step_open:
                self.finish_step()

    def start_step(self, step: int, step_type: str = "default") -> None:
        """Begin training step ``step`` (an int, unique within the trial) of type ``step_type``."""
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
        if not isinstance(step_type, str) or not step_type:
            raise InvalidArgumentError(f"step_type must be a non-empty str, got {step_type!r}")
        self._seen_steps.add(step)
        self._step_open = True
        self._step = self._last_step = step
        self._step_type = self._last_step_type = step_type
        self._token += 1
        summary = self.summary_policy.decide(step, step_type)
        snapshot = self.snapshot_policy.decide(step, step_type)
        self._summarize, self._snapshot = summary.record, snapshot.record
        self._reason = "; ".join(d.reason for d in (summary, snapshot) if d.record)
        if self._summarize or self._snapshot:
            self._guard("recording parameters", self._start_parameters)

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
        """Whether the open step takes summaries or snapshots (False on skipped steps)."""
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
    ) -> torch.Tensor:
        """Record ``tensor`` under ``name`` in the current iteration; returns ``tensor`` unchanged.

        ``role`` is one of input, target, output, loss, parameter, intermediate. ``node`` groups several
        tensors into one graph node (default: the name). ``batched`` says whether dim 0 is the batch
        (default: yes if dim 0 matches the step's batch size, set by the first batched tensor). ``bounds``
        is the activation's output range for saturation statistics (default: known for tanh, sigmoid and
        softmax outputs; None for no saturation statistics). Its gradient is recorded, through a hook, when
        it requires one.
        """
        if not self.enabled:
            return tensor
        self._check_step_open(f"register_tensor({name!r})")
        if not isinstance(tensor, torch.Tensor):
            raise InvalidTensorError(f"register_tensor({name!r}, ...) needs a torch.Tensor, got "
                                     f"{type(tensor).__name__}; convert it with torch.as_tensor(...) first")
        _check_name(name)
        if name in self._names:
            raise DuplicateTensorError(
                f"tensor {name!r} was already registered in iteration {self._iteration} of step {self._step}; "
                f"give each tensor its own name, or call start_iteration() between forward passes")
        if role not in schema.ROLES:
            raise InvalidArgumentError(f"role of {name!r} must be one of {list(schema.ROLES)}, got {role!r}")
        self._names.add(name)
        if not (self._summarize or self._snapshot):
            return tensor
        self._guard(f"recording tensor {name!r}", partial(self._record_tensor, name, tensor, role, node,
                                                           batched, bounds), key=name)
        return tensor

    def _record_tensor(self, name: str, tensor: torch.Tensor, role: str, node: str | None, batched: bool | None,
                       bounds: Any) -> None:
        if tensor.is_sparse or tensor.layout != torch.strided:
            tensor = tensor.to_dense()
        if batched is None:
            batched = (role != "parameter" and tensor.dim() >= 1
                       and (self._batch_size is None or tensor.shape[0] == self._batch_size))
        if batched and self._batch_size is None and tensor.dim() >= 1:
            self._batch_size = int(tensor.shape[0])
        if isinstance(bounds, str):
            bounds = saturation_bounds(tensor)
        tid = self._tensor_id(name, tensor, role, node or name, bool(batched), bounds)
        iteration = self._iteration
        if self._summarize:
            row = self._values.add(tensor, batched=bool(batched), bounds=bounds)
            self._value_keys.append((self.catalog.series_id(tid, schema.KIND_VALUE), iteration, row))
        if self._snapshot:
            self._snaps.append((self.catalog.series_id(tid, schema.KIND_VALUE), iteration,
                                self._take(tensor, bool(batched), bounds)))
        self._registered.append((name, iteration, tensor))
        if tensor.requires_grad:
            self._hooks.append(tensor.register_hook(partial(self._on_grad, self._token, tid, iteration,
                                                            bool(batched))))

    def add_dependency(self, source: str, target: str, *, source_iteration: int | None = None,
                       target_iteration: int | None = None) -> None:
        """Declare that ``target`` depends on ``source`` where autograd cannot see it (a detach, integer
        indices, a non-differentiable step). Both are tensor names; iterations default to the current one.
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
        self._manual_edges.append(TensorEdge(source, target, iterations[0], iterations[1]))

    def _tensor_id(self, name: str, tensor: torch.Tensor, role: str, node: str, batched: bool,
                   bounds: tuple[float, float] | None) -> int:
        tid = self.catalog.tensor_id(name)
        if tid is None:
            return self.catalog.add_tensor(TensorInfo(
                name=name, node=node, role=role, dtype=str(tensor.dtype).replace("torch.", ""),
                shape=tuple(tensor.shape), batched=batched, bounds=bounds))
        info = self.catalog.tensors[tid]
        if info.role != role or info.node != node:
            raise InvalidArgumentError(
                f"tensor {name!r} was first registered with role {info.role!r} in node {info.node!r}, now with role "
                f"{role!r} in node {node!r}; keep one role and node per name (or use a new name)")
        return tid

    def _take(self, tensor: torch.Tensor, batched: bool, bounds: tuple[float, float] | None = None) -> Any:
        return take_snapshot(tensor, batched=batched, num_samples=self.num_samples, max_elements=self.max_elements,
                             bounds=bounds, saturation_margin=self._saturation_margin)

    def _on_grad(self, token: int, tid: int, iteration: int, batched: bool, grad: torch.Tensor) -> None:
        """Autograd hook: reduce the gradient as it is produced; never alters it, never raises."""
        if token != self._token or not self._step_open:
            return
        try:
            if self._summarize:
                row = self._grads.add(grad, batched=batched)
                self._grad_keys.append((tid, iteration, row))
            if self._snapshot:
                self._grad_snaps.append((tid, iteration, self._take(grad, batched)))
        except Exception as error:  # a recorder problem must not break the user's backward pass
            self._warn("recording a gradient", error, key=str(tid))

    def record_gradients(self, gradient_set: str | None = None) -> None:
        """Record the gradients produced since the last call, and the tracked parameters' ``.grad``.

        Call it after ``loss.backward()``. With several losses, call ``record_gradients("name")`` after each
        backward pass to keep one gradient set per loss (kind ``grad:name``).
        """
        if not self.enabled:
            return
        self._check_step_open("record_gradients()")
        kind = schema.grad_kind(gradient_set)
        if kind in self._grad_kinds:
            raise DuplicateTensorError(f"gradient set {kind!r} was already recorded in step {self._step}; give each "
                                       f"backward pass its own gradient_set name")
        self._grad_kinds.append(kind)
        if not (self._summarize or self._snapshot):
            return
        self._guard("recording gradients", partial(self._collect_gradients, kind))

    def _discover_graph(self) -> None:
        """Find the dependency graph once per distinct structure and step type; free the tensor references."""
        registered, manual = self._registered, self._manual_edges
        self._registered, self._manual_edges = [], []
        if not registered:
            return
        parameters = {t.name: t.parameter for t in self._tracked}
        signature = structure_signature(registered, parameters) + repr(sorted(manual))
        cached = self._graph_cache.get_or_build(signature, self._step_type,
                                                partial(self._build_graph, registered, parameters, manual))
        if cached.new_structure:
            positions = layered_layout(cached.graph)
            self.catalog.add_graph(cached.structure_hash, json.dumps(
                {"graph": graph_to_dict(cached.graph), "positions": {k: list(v) for k, v in positions.items()}},
                sort_keys=True))
        self.catalog.set_graph_of_type(self._step_type, cached.structure_hash)

    def _build_graph(self, registered: list, parameters: dict, manual: list[TensorEdge]) -> Any:
        edges = merge_manual_edges(discover_edges(registered, parameters), manual)
        names = {name for name, _, _ in registered} | set(parameters)
        metadata = {info.name: (info.node, info.role, info.module) for info in self.catalog.tensors
                    if info.name in names}
        return build_graph(edges, metadata, manual_edges=manual)

    def _collect_gradients(self, kind: str) -> None:
        self._guard("discovering the dependency graph", self._discover_graph)
        params = [t for t in self._tracked if t.parameter.grad is not None]
        for t in params:
            grad = t.parameter.grad
            if self._summarize:
                self._grad_keys.append((t.tensor_id, 0, self._grads.add(grad)))
            if self._snapshot:
                self._grad_snaps.append((t.tensor_id, 0, self._take(grad, False)))
        rows = self._grads.collect()
        for tid, iteration, index in self._grad_keys:
            self._rows.append((self.catalog.series_id(tid, kind), iteration, rows[index]))
        for tid, iteration, data in self._grad_snaps:
            self._snaps.append((self.catalog.series_id(tid, kind), iteration, data))
        self._grad_keys, self._grad_snaps = [], []
        self._collect_values()

    def _collect_values(self) -> None:
        rows = self._values.collect()
        for sid, iteration, index in self._value_keys:
            self._rows.append((sid, iteration, rows[index]))
        self._value_keys = []

    # ---- parameters ------------------------------------------------------------------------------------
    def _start_parameters(self) -> None:
        if not self._tracked:
            return
        params = [t.parameter.detach() for t in self._tracked]
        for t, p in zip(self._tracked, params):
            sid = self.catalog.series_id(t.tensor_id, schema.KIND_VALUE)
            if self._summarize:
                self._value_keys.append((sid, 0, self._values.add(p)))
            if self._snapshot:
                self._snaps.append((sid, 0, self._take(p, False)))
        if self.record_updates:
            if self._buffers is None or any(b.shape != p.shape or b.dtype != p.dtype or b.device != p.device
                                            for b, p in zip(self._buffers, params)):
                self._buffers = [torch.empty_like(p) for p in params]
            torch._foreach_copy_(self._buffers, params)
            self._updates_ready = True

    def _finish_parameters(self) -> None:
        if not (self._updates_ready and self._buffers is not None):
            return
        params = [t.parameter.detach() for t in self._tracked]
        deltas = torch._foreach_sub(params, self._buffers)
        reducer = Reducer(self._saturation_margin)
        for t, delta in zip(self._tracked, deltas):
            sid = self.catalog.series_id(t.tensor_id, schema.KIND_UPDATE)
            if self._summarize:
                reducer.add(delta)
            if self._snapshot:
                self._snaps.append((sid, 0, self._take(delta, False)))
        if self._summarize:
            for t, row in zip(self._tracked, reducer.collect()):
                self._rows.append((self.catalog.series_id(t.tensor_id, schema.KIND_UPDATE), 0, row))

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
        recorded = self._summarize or self._snapshot
        type_id = self.catalog.step_type_id(self._step_type)
        if recorded:
            self._guard("finishing the step", self._finish_recorded_step)
        self._guard("recording KPIs", partial(self._write_kpis, type_id))
        for policy, taken in ((self.summary_policy, self._summarize), (self.snapshot_policy, self._snapshot)):
            policy.commit(self._step, self._step_type, taken)
        if recorded:
            flags = (schema.FLAG_SUMMARY if self._summarize else 0) | (schema.FLAG_SNAPSHOT if self._snapshot else 0)
            self._writer.add_step(self._step, type_id, self._iteration + 1, flags, self._reason)
            self._steps_since_flush += 1
        self._token += 1
        self._reset_step_state()
        if self._flush_due():
            self.flush()

    def _finish_recorded_step(self) -> None:
        if self._grad_keys or self._grad_snaps or (not self._grad_kinds and any(
                t.parameter.grad is not None for t in self._tracked)):
            kind = schema.KIND_GRAD if not self._grad_kinds else self._grad_kinds[-1]
            if kind not in self._grad_kinds:
                self._grad_kinds.append(kind)
            self._collect_gradients(kind)
        self._guard("discovering the dependency graph", self._discover_graph)
        self._finish_parameters()
        self._collect_values()
        by_iteration: dict[int, list[tuple[int, np.ndarray]]] = {}
        for sid, iteration, row in self._rows:
            by_iteration.setdefault(iteration, []).append((sid, row))
        for iteration, items in sorted(by_iteration.items()):
            self._writer.add_summaries(self._step, iteration, np.array([s for s, _ in items]),
                                       np.stack([r for _, r in items]))
        for sid, iteration, data in self._snaps:
            self._writer.add_snapshot(self._step, iteration, sid, data)

    def _write_kpis(self, type_id: int) -> None:
        if not self._kpis:
            return
        tensors = [v for _, v in self._kpis if isinstance(v, torch.Tensor)]
        host = iter(torch.stack([t.to(torch.float64) for t in tensors]).cpu().tolist()) if tensors else iter(())
        for kpi, value in self._kpis:
            self._writer.add_kpi(self._step, kpi, next(host) if isinstance(value, torch.Tensor) else float(value),
                                 type_id)

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

    def _warn(self, what: str, error: BaseException, key: str = "") -> None:
        tag = (what + key, type(error).__name__)
        if tag in self._warned:
            return
        self._warned.add(tag)
        warnings.warn(f"comgra_ndbg: {what} failed at step {self._step} ({type(error).__name__}: {error}); "
                      f"training continues and this part is not recorded", RecorderWarning, stacklevel=3)


def _check_name(name: object) -> None:
    if not isinstance(name, str) or not name:
        raise InvalidArgumentError(f"names must be non-empty strings, got {name!r}")


def _check_positive(what: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidArgumentError(f"{what} must be an int >= {minimum}, got {value!r}")


def _join(prefix: str, path: str) -> str:
    return f"{prefix}.{path}" if path else prefix

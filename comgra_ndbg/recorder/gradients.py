"""The Recorder's gradient side: hooks on registered tensors and tracked parameters, gradient sets, and
the collection of a step's gradient rows.

``GradientRecording`` is a mixin of ``Recorder`` and works on its step state. Gradients that hooks receive
during a backward pass are kept (``gradient_batch``) and summarised together when the pass ends, except
those entering a ``torch.compile`` region, whose backward may reuse the buffer: they are reduced in the hook.
Where the C++ module is loaded, most of those hooks are taps (``taps``), which hand their gradients over to
``_on_grad`` and the batch at the pass's end, as the hooks would have.
``record_gradients()`` turns what was collected into rows of one gradient set (kind ``grad`` or
``grad:<name>``), together with the tracked parameters' fresh ``.grad``.

Several backward passes of one set can reach the same registered tensor (two losses of one output, each
with its own ``backward()``): its gradient in the set is their sum, as ``.grad`` would hold it. For that
the gradients of the set's passes are kept until the set is collected, up to ``SET_MEMORY`` bytes; beyond
that, or for a ``torch.compile`` region's gradient, a later pass replaces the earlier (with a warning).
"""
from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from operator import attrgetter

import numpy as np
import torch

from comgra_ndbg.errors import ComgraError, DuplicateTensorError, InvalidArgumentError, InvalidTensorError
from comgra_ndbg.recorder.grad_hook import in_compiled_autograd
from comgra_ndbg.recorder.snapshot import DeferredSnapshot
from comgra_ndbg.recorder.validation import check_name, summarizable
from comgra_ndbg.recorder.step_record import zeros
from comgra_ndbg.recorder.step_rows import Failure
from comgra_ndbg.store import schema

__all__ = ["GradientRecording", "SET_MEMORY"]

LAYOUTS_KEPT = 64
"""Distinct sets of gradient keys whose row layout is kept (``_gradient_layout``)."""

SET_MEMORY = 64 * 2 ** 20
"""Bytes of registered tensors' gradients a gradient set keeps to add up later backward passes into them."""

_STRIDED = torch.strided
_LAYOUT, _META = attrgetter("layout"), attrgetter("is_meta")  # (a parameter's gradient is never nested)
_graph_task = torch._C._current_graph_task_id


class GradientRecording:
    """Gradient recording of ``Recorder`` (see the module docstring); not used on its own."""

    def _on_grad(self, slot: int | None, token: int, tid: int, iteration: int, batched: bool, deferred: bool,
                 grad: torch.Tensor | tuple[torch.Tensor | None, ...]) -> None:
        """Autograd hook (``grad_hook.on_gradient_at``): keep the gradient for the summaries at the end of the
        backward pass (``deferred``) or reduce it now; never alters it, never raises. ``grad`` is the gradient,
        or with a ``slot`` the gradients reaching the tensor's ``grad_fn``, of which it is ``grad[slot]``."""
        if slot is not None:
            grad = grad[slot]
            if grad is None:
                return
        if token != self._token or not self._step_open:
            return
        if deferred and in_compiled_autograd():  # no engine callback, and its buffers may be reused: now
            deferred = False
        try:
            if self._tap_keys:  # what the taps kept before this hook fired goes first, as the hooks' order has it
                self._drain_taps()
            if self.gradient_scale is not None:  # a GradScaler's scaled loss: in the parameters' units
                grad = grad.detach() / self.gradient_scale
            if self._structure.pending:
                self._discover_graph()
            if grad.layout is not _STRIDED or grad.is_meta or grad.is_nested or grad.is_quantized:
                grad = summarizable(grad)  # (its own test, inline: the usual gradient needs nothing)
            key = (tid, iteration)
            earlier = self._set_grads.get(key)
            if earlier is None:  # the usual case: the set's first backward pass to reach the tensor
                grad = grad.detach()
                size = grad.numel() * grad.element_size()
                if deferred and self._set_grad_bytes + size <= SET_MEMORY:
                    self._set_grad_bytes += size
                    self._set_grads[key] = (grad, grad._version)
                else:
                    self._set_grads[key] = (None, 0)
            else:
                grad = self._add_earlier_passes(key, grad, earlier, keep=deferred)
            if self._summarize:
                if deferred:
                    self._grad_batch.add(key, grad, batched)
                else:
                    self._grad_keys[key] = self._reducer.add(grad, batched=batched)
            if self._snapshot:
                if self._deferring and batched:
                    if earlier is not None:
                        self._deferred_grads = [d for d in self._deferred_grads
                                                if d.kind is not None or (d.key, d.iteration) != key]
                    kept = grad.detach() if deferred else grad.detach().clone()  # (a buffer reused later)
                    self._deferred_grads.append(DeferredSnapshot(tid, iteration, kept, True, None))
                else:
                    self._grad_snaps[key] = self._take(grad, batched)
        except Exception as error:  # a recorder problem must not break the user's backward pass
            self._skipped(self.catalog.tensors[tid].name, "grad", error)

    def _add_earlier_passes(self, key: tuple[int, int], grad: torch.Tensor, earlier: tuple[torch.Tensor | None, int],
                            *, keep: bool) -> torch.Tensor:
        """The gradient of ``key`` in the current set so far: ``grad`` plus what earlier backward passes of
        the set brought (``earlier``: the sum they kept and its version), when those were kept; keeps the
        result for later passes."""
        grad = grad.detach()
        kept, version = earlier
        keep = keep and kept is not None
        if kept is not None and kept._version == version:
            grad = kept + grad
        else:
            name = self.catalog.tensors[key[0]].name
            self._note_once(f"passes of {name}", f"tensor {name!r} received gradients from several backward passes "
                            f"of one gradient set; only the last is recorded (the earlier were not kept: a "
                            f"torch.compile region's gradient, or more than SET_MEMORY bytes of gradients in "
                            f"the set). Call record_gradients('<name>') after each backward pass to keep each")
        self._set_grads[key] = (grad, grad._version) if keep else (None, 0)
        return grad

    def record_gradient(self, name: str, grad: torch.Tensor, *, iteration: int | None = None,
                        deferred: bool = False) -> None:
        """Record ``grad`` as the gradient of the tensor registered as ``name`` (in ``iteration``, default
        the current one), for gradients that reach you through a hook of your own rather than through
        autograd on the registered tensor (e.g. a detached copy of a compiled region's output).

        It is summarised at once. ``deferred=True``, from inside a backward pass, keeps a reference and
        summarises it with the pass's other gradients when the pass ends, which is cheaper; only for
        gradients nothing writes to afterwards (not the incoming gradient of a ``torch.compile`` region,
        whose backward may reuse that buffer).
        """
        if not self.enabled:
            return
        self._check_step_open(f"record_gradient({name!r})")
        if not isinstance(grad, torch.Tensor):
            raise InvalidTensorError(f"record_gradient({name!r}, ...) needs a torch.Tensor, got {type(grad).__name__}")
        if not (self._summarize or self._snapshot):
            return
        tid = self.catalog.tensor_id(name)
        if tid is None:
            raise InvalidArgumentError(f"record_gradient({name!r}): no tensor of that name was registered; call "
                                       f"register_tensor({name!r}, ...) first")
        self._on_grad(None, self._token, tid, self._iteration if iteration is None else iteration,
                      self.catalog.tensors[tid].batched, deferred, grad)

    def _on_parameter_grad(self, tid: int, grad: torch.Tensor) -> None:
        """Post-accumulate-grad hook of ``gradients_in_hook``: reduce now, replacing an earlier accumulation."""
        if not self._step_open or not (self._summarize or self._snapshot):
            return
        try:
            if self._tap_keys:
                self._drain_taps()
            if grad.layout is not _STRIDED or grad.is_meta or grad.is_nested or grad.is_quantized:
                grad = summarizable(grad)  # (its own test, inline: the usual gradient needs nothing)
            if self._summarize:
                self._grad_batch.add(tid, grad, False)
            if self._snapshot:
                self._parameter_grad_snaps[tid] = self._take(grad, False)
        except Exception as error:  # a recorder problem must not break the user's backward pass
            self._skipped(self.catalog.tensors[tid].name, "grad", error)

    def poll_parameter_gradients(self) -> None:
        """Read the gradients of parameters tracked with ``gradients_in_hook`` without a hook per parameter:
        the caller calls ``take_parameter_gradients()`` where each backward pass ends, and the recorder reads
        them again right before an optimizer step (``refresh_parameter_gradients``) and when the step's
        gradients are collected. Call it before the first step."""
        self._parameters.polled = True

    def take_parameter_gradients(self) -> None:
        """Hand over the tracked parameters' gradients that changed since they were last read, when the
        tracker is ``polled`` (``ParameterTracker``): ``NeuralDbg`` calls it where each backward pass ends,
        where the gradient flush (``_flush_gradients``) reads them too; whichever of the two runs first in a
        backward pass reads them, the other reads nothing again."""
        if not self.enabled or not self._step_open or not (self._summarize or self._snapshot):
            return
        try:
            self._take_polled(queue=True)
        except Exception as error:  # a recorder problem must not break the user's backward pass
            self._warn("recording a parameter gradient", error)

    def _take_polled(self, *, queue: bool, unread: bool = False) -> None:
        task = _graph_task()
        if task != -1 and task == self._polled_task:  # read already at the end of this backward pass
            return
        self._polled_task = task
        tids, grads, packed = self._parameters.changed_gradients_packed(unread=unread)
        if not grads:
            return
        if self._tap_keys:
            self._drain_taps()
        if self._snapshot or not self._summarize or (packed is None and (set(map(_LAYOUT, grads)) != {_STRIDED}
                                                                         or any(map(_META, grads)))):
            for tid, grad in zip(tids, grads):
                self._on_parameter_grad(tid, grad)
        elif packed is not None and not queue and not len(self._grad_batch):  # summarised next: at once
            self._parameter_grads.update(zip(tids, self._reducer.add_addressed(*packed, grads)))
        else:
            self._grad_batch.extend(list(zip(tids, grads)), queue=queue)

    def refresh_parameter_gradients(self, *, force: bool = False) -> None:
        """Take again the gradients of parameters tracked with ``gradients_in_hook`` whose ``.grad`` changed
        since a backward pass of this step handed it over — clipped (``clip_grad_norm_``), unscaled by a
        ``GradScaler`` — so the step records the gradient the optimizer uses. ``NeuralDbg`` calls it right
        before an optimizer that holds the model's parameters steps; ``force`` takes every one again, for a
        step whose backward pass a ``GradScaler`` scaled (its ``unscale_`` changes ``.grad`` in place without
        moving the version counter)."""
        if not self.enabled or not self._step_open or not (self._summarize or self._snapshot):
            return
        try:
            for tid, grad in self._parameters.changed_gradients(force=force):
                self._on_parameter_grad(tid, grad)
            if len(self._grad_batch):
                self._flush_gradients()
        except Exception as error:  # a recorder problem must not break the user's optimizer step
            self._warn("recording a parameter gradient", error)

    def _flush_gradients(self) -> None:
        """Summarise the gradients kept by the hooks and taps of a backward pass (the engine calls this at its
        end), with those of the parameters when the tracker is ``polled``."""
        if self._tap_keys:
            try:
                self._take_taps(flush=True)
            except Exception as error:  # a recorder problem must not break the user's backward pass
                self._warn("recording gradients", error)
        if not self._step_open or not self._summarize:
            self._grad_batch.clear()
            return
        try:
            if self._parameters.polled and _graph_task() != -1:  # (outside a backward pass its callers read them)
                self._take_polled(queue=False)
            keyed, dropped = self._grad_batch.flush(self._reducer)
        except Exception as error:  # a recorder problem must not break the user's backward pass
            self._grad_batch.clear()
            self._warn("recording gradients", error)
            return
        for key, index in keyed:
            if isinstance(key, tuple):  # a registered tensor's gradient: (tensor id, iteration)
                self._grad_keys[key] = index
            else:  # a parameter's accumulated gradient replaces an earlier accumulation
                self._parameter_grads[key] = index
        for key in dropped:
            tid = key[0] if isinstance(key, tuple) else key
            self._skipped(self.catalog.tensors[tid].name, "grad", RuntimeError(
                "it was changed in place before the backward pass ended; that gradient is not recorded"))

    def record_gradients(self, gradient_set: str | None = None) -> None:
        """Record the gradients produced since the last call, and the tracked parameters' ``.grad``.

        Call it after ``loss.backward()``. With several losses, call ``record_gradients("name")`` after each
        backward pass to keep one gradient set per loss (kind ``grad:name``).
        """
        if not self.enabled:
            return
        if self._closed or not self._step_open:
            self._check_step_open("record_gradients()")
        if gradient_set is not None:
            check_name(gradient_set, "gradient set names")
        kind = schema.grad_kind(gradient_set)
        if kind in self._grad_kinds:
            raise DuplicateTensorError(f"gradient set {kind!r} was already recorded in step {self._step}; give each "
                                       f"backward pass its own gradient_set name")
        self._grad_kinds.append(kind)
        if not (self._summarize or self._snapshot):
            self._parameters.forget_gradients()
            return
        try:  # (``_guard``, inline: every step)
            self._collect_gradients(kind)
        except ComgraError:
            raise
        except Exception as error:  # a recorder problem must not break the training run
            self._warn("recording gradients", error)

    def _collect_gradients(self, kind: str) -> None:
        if self._parameters.polled:  # gradients that no backward pass's end read (a loss apart from the model)
            self._take_polled(queue=False, unread=True)
        if self._unflushed():  # the engine's callback did not run (a backward pass that failed midway)
            self._flush_gradients()
        if self._structure.pending:
            self._guard("discovering the dependency graph", self._discover_graph)
        if self._parameter_grads or self._parameter_grad_snaps:  # summarised in their hooks (gradients_in_hook)
            for by_tensor, keyed in ((self._parameter_grads, self._grad_keys),
                                     (self._parameter_grad_snaps, self._grad_snaps)):
                keyed.update(zip(zip(by_tensor, repeat(0)), by_tensor.values()))  # tensor id -> (id, iteration 0)
            self._parameter_grads, self._parameter_grad_snaps = {}, {}
        tids, grads, packed = self._parameters.take_gradients_packed()
        parameter_rows: Sequence[int] = []
        if self._summarize and grads:
            if packed is not None:
                parameter_rows = self._reducer.add_addressed(*packed, grads)
            else:
                parameter_rows = self._reducer.add_many(grads)
        if self._snapshot:
            self._grad_snaps.update(((tid, 0), self._take(grad, False)) for tid, grad in zip(tids, grads))
        for original, alias in self._grad_aliases:  # a tensor registered under two names: one row, twice
            row = self._grad_keys.get(original)
            if row is not None:
                self._grad_keys[alias] = row
        if self._grad_keys:
            self._step_rows.add(*self._gradient_layout(kind))
        if parameter_rows:
            if len(grads) == len(self._parameters.tracked):  # every parameter got one: the cached series
                series = self._parameter_series(kind)
            else:
                series = np.array([self.catalog.series_id(tid, kind) for tid in tids], dtype=np.int64)
            self._step_rows.add(series, zeros(len(series)), parameter_rows)
        if not self._deferring:
            for (tid, iteration), data in self._grad_snaps.items():
                self._snaps.append((self.catalog.series_id(tid, kind), iteration, data))
            self._grad_snaps = {}
        else:
            for item in self._deferred_grads:
                if item.kind is None:
                    item.kind = kind
        self._grad_keys = {}
        self._set_grads, self._set_grad_bytes = {}, 0
        self._collect_values()

    def _gradient_layout(self, kind: str) -> tuple[np.ndarray, np.ndarray, slice | np.ndarray]:
        """Series ids and iterations of the gradient rows of ``kind`` for the keys in ``_grad_keys``, in their
        order, and their rows in the reducer as an index (a slice when consecutive): the same keys come back at
        every step, usually at the same rows, so they are built once per key set and rows (read-only, shared
        by the steps' records)."""
        key = (kind, tuple(self._grad_keys))
        rows = list(self._grad_keys.values())
        layout = self._gradient_layouts.get(key)
        if layout is None or layout[0] != rows:  # (a key set's rows may settle after its first step)
            series = np.array([self.catalog.series_id(tid, kind) for tid, _ in key[1]], dtype=np.int64)
            iterations = np.array([iteration for _, iteration in key[1]], dtype=np.int64)
            first = rows[0]
            at = slice(first, first + len(rows)) if rows == list(range(first, first + len(rows))) else np.array(
                rows, dtype=np.int64)
            for array in (series, iterations, at):
                if type(array) is np.ndarray:
                    array.flags.writeable = False
            layout = (rows, (series, iterations, at))
            if len(self._gradient_layouts) >= LAYOUTS_KEPT:  # a loop whose key sets never repeat
                self._gradient_layouts.clear()
            self._gradient_layouts[key] = layout
        return layout[1]

    def _collect_values(self, *, take: bool = True) -> None:
        """The step's value rows registered so far join its rows; ``take`` starts them on their way to the host
        (the end of a gradient set), the tiers' parameter values read at once."""
        self._last_viewed = None  # its row is collected: a later registration of its tensor is summarised anew
        add = self._step_rows.add
        if self._value_keys:
            add(*self._value_layout())
        tier_rows, self._tier_rows = self._tier_rows, None
        tier_at = None
        for series, indices in self._value_blocks:
            at = add(series, zeros(len(series)), indices)
            if indices is tier_rows:
                tier_at = at
        self._value_keys, self._value_blocks = [], []
        if take or tier_at is not None:
            self._step_rows.take(self._reducer, wait=tier_at is not None)
        if tier_at is not None:
            self._observe_tier_values(self._step_rows.read(tier_at, self._report_failed))

    def _value_layout(self) -> tuple[np.ndarray, np.ndarray, slice | np.ndarray]:
        """Series ids, iterations and rows in the collected block of the registrations in ``_value_keys``: a
        loop registers the same names in the same order at every step, so they are built once per list of
        keys (read-only, shared by the steps' records), the rows as a slice when they are consecutive."""
        cached = self._value_layouts
        if cached is not None and cached[0] == self._value_keys:
            return cached[1]
        keys = np.array(self._value_keys, dtype=np.int64)
        series, iterations, rows = keys[:, 0].copy(), keys[:, 1].copy(), keys[:, 2].copy()
        series.flags.writeable = iterations.flags.writeable = rows.flags.writeable = False
        first = int(rows[0])
        consecutive = bool((rows == np.arange(first, first + len(rows))).all())
        layout = (series, iterations, slice(first, first + len(rows)) if consecutive else rows)
        self._value_layouts = (list(self._value_keys), layout)
        return layout

    def _report_failed(self, failures: list[Failure]) -> None:
        """Log each row of the step that could not be computed as a skipped tensor (it stays absent)."""
        for sid, row, reason in failures:
            if sid is None:
                name, kind = f"row {row}", "summary"
            else:
                tid, kind = self.catalog.series[sid]
                name = self.catalog.tensors[tid].name
            self._skipped(name, kind, RuntimeError(f"its summary could not be computed ({reason})"))

    def _discover_graph(self) -> None:
        if self._structure.pending:
            self._structure.discover(self._step_type or self._last_step_type, self._parameters.names())


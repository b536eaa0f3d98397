"""The recorder's side of the C++ gradient taps (``native``): arming them at registration, taking what they
kept when a backward pass ends, and ending them with the step.

A tap stands in for the Python hook of a registered tensor that autograd produced; what it keeps is handed
to the same code the hook would have called (``GradientRecording._on_grad``, or straight into the gradient
batch when only a summary is asked of it), in the order the hooks would have fired, so a recording is the
same with or without the taps. ``GradientTaps`` is a mixin of ``Recorder`` and works on its step state.
"""
from __future__ import annotations

import weakref
from collections.abc import Callable

import numpy as np
import torch

from comgra_ndbg.recorder import native
from comgra_ndbg.recorder.grad_hook import hook_method, on_gradient_at
from comgra_ndbg.recorder.gradients import SET_MEMORY

__all__ = ["GradientTaps"]

_STRIDED = torch.strided


class GradientTaps:
    """Gradient taps of ``Recorder`` (see the module docstring); not used on its own."""

    def _hook_gradient(self, tensor: torch.Tensor, tid: int, iteration: int, batched: bool, deferred: bool) -> None:
        """Have the gradient of a registered tensor reach ``_on_grad``: through a C++ tap (``native``) that keeps
        it until the backward pass ends, or through a Python hook where no tap can stand in for one (a leaf, a
        ``torch.compile`` region's output whose gradient is summarised in its hook, no module)."""
        taps = self._taps
        if taps is None:
            module = native.taps_module()
            if module is not None:
                taps = self._taps = module.Taps(*_tap_callbacks(self))
        if taps is not None and deferred and not self._taps_compiled and taps.tap(tensor, len(self._tap_keys), batched):
            self._tap_keys.append(((tid, iteration), batched))
            return
        hook = hook_method(self, self._on_grad)  # (untraced where dynamo is loaded: compiled autograd may run it)
        self._hooks.append(on_gradient_at(tensor, hook, self._token, tid, iteration, batched, deferred))

    def _unflushed(self) -> bool:
        """Whether hooks or taps hold gradients that no end of a backward pass summarised yet."""
        return bool(len(self._grad_batch) or (self._tap_keys and self._taps.pending()))

    def _drain_taps(self) -> None:
        """``_take_taps`` when the taps hold something (before a Python hook's gradient joins the batch)."""
        if self._taps.pending():
            self._take_taps()
            self._grad_batch.queue_flush()  # the taps' own call at the pass's end finds nothing left to hand over

    def _take_taps(self, *, flush: bool = False) -> None:
        """Hand the gradients the taps kept over as their Python hooks would have: straight into the batch
        when nothing but summaries is asked of them, through ``_on_grad`` otherwise (snapshots, a gradient
        scale, a second pass of the set, a gradient that is not a dense tensor). A gradient changed in place
        since its tap is dropped, as the batch drops one. ``flush``: at the pass's end, where the batch is
        summarised next; when it holds nothing yet, the gradients are summarised at once instead, in one
        kernel call on the addresses the C++ side packed (``_add_tapped``), which are the same rows."""
        plain = self.gradient_scale is None and self._summarize and not self._snapshot and not self._structure.pending
        if flush and plain and not self._set_grads and not len(self._grad_batch):
            arrays = self._tap_arrays
            if len(arrays[0]) < len(self._tap_keys):
                arrays = self._tap_arrays = tuple(np.zeros(2 * len(self._tap_keys), np.int64) for _ in range(3))
            indices, grads, versions, code = self._taps.take_packed(*arrays)
            if not indices or not self._step_open:
                return
            if code >= 0:
                self._add_tapped(indices, grads, versions, native.KERNEL_DTYPES[code], arrays)
                return
        else:
            indices, grads, versions = self._taps.take()
            if not indices or not self._step_open:
                return
        keys, token = self._tap_keys, self._token
        kept, pending, room = self._set_grads, [], SET_MEMORY - self._set_grad_bytes
        for index, grad, version in zip(indices, grads, versions):
            key, batched = keys[index]
            tid, iteration = key
            if grad._version != version:
                self._skipped(self.catalog.tensors[tid].name, "grad", RuntimeError(
                    "it was changed in place before the backward pass ended; that gradient is not recorded"))
                continue
            if not plain or key in kept or grad.layout is not _STRIDED or grad.is_meta or grad.is_nested:
                self._on_grad(None, token, tid, iteration, batched, True, grad)
                continue
            room = self._keep_in_set(key, grad, version, room)
            pending.append((key, grad, batched, version))
        self._set_grad_bytes = SET_MEMORY - room
        self._grad_batch.extend_kept(pending)

    def _add_tapped(self, indices: list[int], grads: list[torch.Tensor], versions: list[int], dtype: np.dtype,
                    arrays: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
        """``_take_taps``'s gradients, each unchanged and a lean host array of ``dtype`` (checked in C++), the
        first of the set to reach their tensors: summarised now into the gradient rows, kept for later passes
        of the set as the batch would keep them."""
        count, keys = len(grads), self._tap_keys
        pairs = [keys[i][0] for i in indices]
        sizes = arrays[1][:count]
        rows = self._reducer.add_addressed(dtype, arrays[0][:count], sizes, grads, batches=arrays[2][:count])
        room = SET_MEMORY - self._set_grad_bytes
        need = sum(sizes.tolist()) * dtype.itemsize
        if need <= room:  # the usual case: all of them, in one update
            self._set_grads.update(zip(pairs, zip(grads, versions)))
            self._set_grad_bytes += need
        else:
            for key, grad, version in zip(pairs, grads, versions):
                room = self._keep_in_set(key, grad, version, room)
            self._set_grad_bytes = SET_MEMORY - room
        self._grad_keys.update(zip(pairs, rows))

    def _keep_in_set(self, key: tuple[int, int], grad: torch.Tensor, version: int, room: int) -> int:
        """Keep ``grad`` for later backward passes of the gradient set when it fits in ``room`` bytes (else
        note it as not kept: a later pass then replaces it, with a warning); returns the room left."""
        size = grad.numel() * grad.element_size()
        if size <= room:
            self._set_grads[key] = (grad, version)
            return room - size
        self._set_grads[key] = (None, 0)
        return room

    def _end_taps(self) -> None:
        """The step's end: its taps leave the nodes; after a backward pass that compiled autograd ran over them
        (which calls no hook of theirs), the Python hooks take over, which compiled autograd calls."""
        taps = self._taps
        taps.reset()
        self._tap_keys = []
        if not self._taps_compiled and taps.compiled():
            self._taps_compiled = True
            self._note_once("compiled autograd", "a backward pass ran under compiled autograd, which calls no C++ "
                            "hook: the gradients of that step's registered tensors are not recorded; the recorder "
                            "uses Python hooks from the next step on")

    def _drop_taps(self) -> None:
        """Remove the taps and let their module go (``close``)."""
        if self._taps is not None:
            self._taps.reset()
            self._taps, self._tap_keys = None, []


def _tap_callbacks(recorder: GradientTaps) -> tuple[Callable[[], None], Callable[[], None]]:
    """What the taps call when a backward pass reaches the first of them (the graph's discovery, as the first
    Python hook does it) and when it ends (the flush), through a weak reference: the taps outlive a step on
    the nodes of a graph the user keeps, and must not keep the recorder."""
    owner = weakref.ref(recorder)

    def started() -> None:
        recorder = owner()
        if recorder is not None and recorder._step_open and recorder._structure.pending:
            try:
                recorder._discover_graph()
            except Exception as error:  # a recorder problem must not break the user's backward pass
                recorder._warn("discovering the dependency graph", error)

    def ended() -> None:
        recorder = owner()
        if recorder is not None:
            recorder._flush_gradients()

    return started, ended

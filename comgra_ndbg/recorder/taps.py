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

import torch

from comgra_ndbg.recorder import native
from comgra_ndbg.recorder.grad_hook import on_gradient_at
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
        if taps is not None and deferred and not self._taps_compiled and taps.tap(tensor, len(self._tap_keys)):
            self._tap_keys.append((tid, iteration, batched))
            return
        self._hooks.append(on_gradient_at(tensor, self._on_grad, self._token, tid, iteration, batched, deferred))

    def _unflushed(self) -> bool:
        """Whether hooks or taps hold gradients that no end of a backward pass summarised yet."""
        return bool(len(self._grad_batch) or (self._tap_keys and self._taps.pending()))

    def _drain_taps(self) -> None:
        """``_take_taps`` when the taps hold something (before a Python hook's gradient joins the batch)."""
        if self._taps.pending():
            self._take_taps()
            self._grad_batch.queue_flush()  # the taps' own call at the pass's end finds nothing left to hand over

    def _take_taps(self) -> None:
        """Hand the gradients the taps kept over as their Python hooks would have: straight into the batch
        when nothing but summaries is asked of them, through ``_on_grad`` otherwise (snapshots, a gradient
        scale, a second pass of the set, a gradient that is not a dense tensor). A gradient changed in place
        since its tap is dropped, as the batch drops one."""
        indices, grads, versions = self._taps.take()
        if not indices or not self._step_open:
            return
        keys, token = self._tap_keys, self._token
        plain = self.gradient_scale is None and self._summarize and not self._snapshot and not self._structure.pending
        kept, pending, room = self._set_grads, [], SET_MEMORY - self._set_grad_bytes
        for index, grad, version in zip(indices, grads, versions):
            tid, iteration, batched = keys[index]
            if grad._version != version:
                self._skipped(self.catalog.tensors[tid].name, "grad", RuntimeError(
                    "it was changed in place before the backward pass ended; that gradient is not recorded"))
                continue
            key = (tid, iteration)
            if not plain or key in kept or grad.layout is not _STRIDED or grad.is_meta or grad.is_nested:
                self._on_grad(None, token, tid, iteration, batched, True, grad)
                continue
            size = grad.numel() * grad.element_size()
            if size <= room:
                room -= size
                kept[key] = (grad, version)
            else:
                kept[key] = (None, 0)
            pending.append((key, grad, batched, version))
        self._set_grad_bytes = SET_MEMORY - room
        self._grad_batch.extend_kept(pending)

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

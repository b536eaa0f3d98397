"""Gradients handed over by autograd hooks, summarised together when the backward pass ends.

Reducing each gradient inside its hook paid the reducer's per-call cost once per tensor, in the middle of
the backward pass. Here a hook only keeps a reference to the gradient (and its version counter) and asks
the autograd engine to call back once the whole backward pass is over (``queue_callback``, the hook DDP
uses to synchronise gradients); one ``Reducer.add_many`` then summarises every gradient of the pass.

The reference also stops autograd from accumulating another gradient into that tensor in place (it only
does so for tensors nobody else holds). A gradient that is still changed in place before the callback,
which its version counter shows, is dropped with a warning instead of being recorded wrong.
"""
from __future__ import annotations

from collections.abc import Callable, Hashable
from operator import attrgetter

import torch
from torch.autograd import Variable

from comgra_ndbg.recorder.grad_hook import in_compiled_autograd
from comgra_ndbg.stats.reducer import Reducer

__all__ = ["GradientBatch"]

_VERSION = attrgetter("_version")


class GradientBatch:
    """Pending gradients of the running backward pass and the callback that summarises them.

    ``on_end`` is what the engine calls when the backward pass ends (the owner flushes there); outside a
    backward pass (a gradient handed over by hand) the owner is told to flush at once.
    """

    def __init__(self, on_end: Callable[[], None]) -> None:
        self._on_end = on_end
        self._pending: list[tuple[Hashable, torch.Tensor, bool, int]] = []  # (key, gradient, batched, version)
        self._queued = False

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, key: Hashable, grad: torch.Tensor, batched: bool) -> None:
        """Keep ``grad`` under ``key`` until the backward pass ends."""
        self._pending.append((key, grad.detach() if grad.requires_grad else grad, batched, grad._version))
        if not self._queued:
            self._queue()

    def extend(self, gradients: list[tuple[Hashable, torch.Tensor]], *, queue: bool = True) -> None:
        """``add`` of many detached gradients without a batch dimension (the parameters'); ``queue=False``
        from the owner's flush, which summarises them next."""
        self._pending += [(key, grad, False, grad._version) for key, grad in gradients]
        if queue and not self._queued:
            self._queue()

    def extend_kept(self, gradients: list[tuple[Hashable, torch.Tensor, bool, int]]) -> None:
        """Take (key, detached gradient, batched, version at its hook) entries kept by the C++ taps at the end
        of the pass; the owner flushes next."""
        self._pending += gradients

    def queue_flush(self) -> None:
        """Have the owner flush when the running backward pass ends (at once outside one), if anything is pending
        and no flush is queued yet."""
        if self._pending and not self._queued:
            self._queue()

    def _queue(self) -> None:
        if in_compiled_autograd():  # which takes no callback (and may reuse the buffers): summarised now
            self._on_end()
            return
        try:
            Variable._execution_engine.queue_callback(self._end_of_backward)
        except RuntimeError:  # not inside a backward pass
            self._on_end()
        else:
            self._queued = True

    def _end_of_backward(self) -> None:
        self._queued = False
        self._on_end()

    def flush(self, reducer: Reducer) -> tuple[list[tuple[Hashable, int]], list[Hashable]]:
        """Summarise every pending gradient into ``reducer``: returns (key, row index) pairs and the keys of
        gradients dropped because they changed in place after their hook."""
        pending, self._pending = self._pending, []
        if not pending:
            return [], []
        keys, grads, batched, versions = zip(*pending)
        if list(map(_VERSION, grads)) == list(versions):  # the usual case: none changed since its hook
            return list(zip(keys, reducer.add_many(grads, batched=batched))), []
        kept = [p for p in pending if p[1]._version == p[3]]
        dropped = [p[0] for p in pending if p[1]._version != p[3]]
        indices = reducer.add_many([p[1] for p in kept], batched=[p[2] for p in kept])
        return [(p[0], index) for p, index in zip(kept, indices)], dropped

    def clear(self) -> None:
        """Forget what is pending (the step ended without it)."""
        self._pending = []

"""The gradient each parameter's last optimizer step consumed: what the loop invariants' stale-gradient check
compares the next step's gradients with (a gradient that is the very tensor consumed last time, changed in
place since, was accumulated onto: the loop does not clear it).

Every optimizer step of a recorded loop notes every parameter's gradient; the C++ part (``recorder/native``)
does it in one call, :class:`ConsumedGradients` in Python where that part is not loaded. Both hold the
gradients weakly (a gradient the loop lets go of is not kept alive for this) and answer alike.

>>> p = torch.nn.Parameter(torch.ones(2)); p.grad = torch.ones(2)
>>> table = consumed_gradients(1, None)
>>> table.consume([p], [0]), table.version_if(0, p.grad)
((1, []), 0)
>>> p.grad.add_(1.0)  # accumulated onto, uncleared
tensor([2., 2.])
>>> table.consume([p], [0]), table.version_if(0, torch.ones(2))
((1, [0]), None)
"""
from __future__ import annotations

import weakref
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import torch

__all__ = ["ConsumedGradients", "consumed_gradients"]


class ConsumedGradients:
    """The Python table: per parameter, a weak reference to the gradient last consumed and its version then."""

    def __init__(self, count: int) -> None:
        self._entries: list[tuple[Any, int] | None] = [None] * count

    def consume(self, parameters: Sequence[torch.Tensor], held: Sequence[int]) -> tuple[int, list[int]]:
        """Note the gradients of ``parameters[i]`` for ``i`` in ``held``, which an optimizer step is about to
        consume; returns how many have one, and the indices whose gradient is the tensor the last step
        consumed, changed in place since."""
        entries, ref, with_grad, grown = self._entries, weakref.ref, 0, []
        for i in held:
            grad = parameters[i].grad
            if grad is None:
                continue
            with_grad += 1
            previous = entries[i]
            version = grad._version
            if previous is not None and previous[1] != version and previous[0]() is grad:
                grown.append(i)
            entries[i] = (ref(grad), version)
        return with_grad, grown

    def version_if(self, index: int, grad: torch.Tensor | None) -> int | None:
        """The version ``grad`` had when the last step consumed it, if it is the gradient consumed then."""
        entry = self._entries[index]
        if grad is None or entry is None or entry[0]() is not grad:
            return None
        return entry[1]

    def forget(self) -> None:
        """Forget every gradient (light steps came between: the last consumption is long past)."""
        self._entries = [None] * len(self._entries)


def consumed_gradients(count: int, native: ModuleType | None) -> Any:
    """A table for ``count`` parameters: the C++ part's (``native``, the loaded module) or the Python one."""
    return native.Consumed(count) if native is not None else ConsumedGradients(count)

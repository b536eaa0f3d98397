"""Gradients of module outputs inside a reentrant ``torch.utils.checkpoint`` segment.

``RecomputedGradients`` is a mixin of ``NeuralDbg`` and works on its state. A reentrant checkpoint
(``use_reentrant=True``) runs its segment under ``no_grad`` in the forward pass: the module outputs
registered there get no gradient. In the backward pass the segment runs again, with gradients, inside the
``CheckpointFunctionBackward`` node, and its module hooks fire on the recomputed outputs, which do receive
the gradients. So while the open step has such hidden calls, the module hooks hand every call they see
outside a captured pass to :meth:`RecomputedGradients._on_replay`; a call made inside a
``CheckpointFunctionBackward`` node belongs to that node's recompute (a *burst*), and a burst is matched,
when its first gradient arrives (the recompute is complete then), to the latest run of hidden calls of the
step with the same module paths in the same order (backward recomputes the last segment first). The
gradient of each recomputed output is recorded under the name of the forward call it stands for.

The non-reentrant checkpoint keeps the forward pass's outputs in the graph (they get their gradients as
usual) and recomputes inside other nodes: its calls are not bursts and are ignored.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

from comgra_ndbg.instrument.hooks import tensor_leaves
from comgra_ndbg.recorder.grad_hook import on_gradient

__all__ = ["RecomputedGradients"]

_RECOMPUTING_NODE = "CheckpointFunctionBackward"


@dataclass
class HiddenCall:
    """A module call of a training pass whose output autograd did not see: its path, the names of its
    output tensors (``tensor_leaves`` order), its iteration, and whether a recompute claimed it."""

    path: str
    names: list[str]
    iteration: int
    claimed: bool = False


@dataclass
class Burst:
    """The module calls of one checkpoint recompute, and the hidden calls they were matched to."""

    paths: list[str] = field(default_factory=list)
    matched: list[HiddenCall] | None = None


class RecomputedGradients:
    """Gradients of reentrant checkpoint segments for ``NeuralDbg`` (see the module docstring)."""

    def _note_hidden_call(self, path: str, names: list[str]) -> None:
        """A chosen module's output of this recorded pass does not require grad: await its recompute."""
        self._hidden_calls.append(HiddenCall(path, names, self._iteration))
        self._hooks.replay = self._on_replay

    def _on_replay(self, path: str, output: Any) -> None:
        """``ModuleHooks.replay``: a chosen module ran outside a captured pass (a recompute, or anything else)."""
        node = torch._C._current_autograd_node()
        if (self._closed or node is None or type(node).__name__ != _RECOMPUTING_NODE
                or self.recorder.current_step is None):
            return
        burst = self._bursts.setdefault(node, Burst())
        call = len(burst.paths)
        burst.paths.append(path)
        for leaf, (_, tensor) in enumerate(tensor_leaves(output)):
            if tensor.requires_grad and tensor.grad_fn is not None:
                self._tensor_handles.append(on_gradient(tensor, partial(self._on_recomputed_grad, burst, call, leaf)))

    def _on_recomputed_grad(self, burst: Burst, call: int, leaf: int, grad: torch.Tensor) -> None:
        if burst.matched is None:
            burst.matched = self._match(burst.paths)
        if call < len(burst.matched) and leaf < len(burst.matched[call].names):
            hidden = burst.matched[call]
            self._on_grad(hidden.names[leaf], hidden.iteration, False, grad)

    def _match(self, paths: list[str]) -> list[HiddenCall]:
        """The latest unclaimed run of hidden calls with these paths in this order (claimed now), or []."""
        calls = self._hidden_calls
        for start in range(len(calls) - len(paths), -1, -1):
            window = calls[start:start + len(paths)]
            if all(not c.claimed and c.path == path for c, path in zip(window, paths)):
                for c in window:
                    c.claimed = True
                return window
        return []

    def _forget_hidden_calls(self) -> None:
        self._hidden_calls, self._bursts = [], {}
        self._hooks.replay = None

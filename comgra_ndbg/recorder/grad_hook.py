"""A backward hook for the gradient of one tensor, at a sixth of ``Tensor.register_hook``'s cost.

``Tensor.register_hook`` is Python code that builds an ordered dict, a removable handle and a weak
reference per call: about 20 µs, paid for every registered tensor of every recorded step. For a tensor
that autograd produced, the same gradient reaches a pre-hook on its ``grad_fn`` (the node that consumes
that gradient) at slot ``output_nr``; registering one is a single C++ call. It sees the gradient after the
tensor's own hooks ran (what flows on), skips outputs of a multi-output node that got no gradient, and
keeps the tensor-hook semantics under in-place changes (a hook registered before ``x.mul_(2)`` sees the
gradient of the value before it). Leaves have no ``grad_fn`` and keep the tensor hook.

>>> seen = []
>>> x = torch.ones(3, requires_grad=True)
>>> y = x * 2
>>> handle = on_gradient(y, lambda g: seen.append(g.tolist()))
>>> (y * 5).sum().backward()
>>> seen
[[5.0, 5.0, 5.0]]
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

import torch

__all__ = ["dynamo_loaded", "hook_method", "in_compiled_autograd", "on_gradient", "on_gradient_at", "untraced"]

_F = TypeVar("_F", bound=Callable[..., Any])


def on_gradient(tensor: torch.Tensor, fn: Callable[[torch.Tensor], None]) -> Any:
    """Call ``fn(grad)`` with the gradient with respect to ``tensor`` during backward passes; returns a
    handle whose ``remove()`` detaches the hook."""
    node = tensor.grad_fn
    if node is None:
        return tensor.register_hook(fn)
    slot = tensor.output_nr

    def hook(grad_outputs: tuple[torch.Tensor | None, ...]) -> None:
        grad = grad_outputs[slot]
        if grad is not None:
            fn(grad)

    return node.register_prehook(hook)


def on_gradient_at(tensor: torch.Tensor, fn: Callable[..., None], *args: Any) -> Any:
    """``on_gradient`` with no closure between autograd and ``fn`` (the recorder's hook for every registered
    tensor of every step): registers ``partial(fn, slot, *args)``, so ``fn(slot, *args, grads)`` receives
    the gradient itself (``slot`` None: a leaf's tensor hook) or the gradients reaching the ``grad_fn``, of
    which the tensor's is ``grads[slot]`` (None when it got none). Returns the handle.

    >>> seen = []
    >>> def hook(slot, tag, grads):
    ...     seen.append((tag, (grads if slot is None else grads[slot]).tolist()))
    >>> x = torch.ones(2, requires_grad=True)
    >>> y = x * 3
    >>> handles = on_gradient_at(x, hook, "x"), on_gradient_at(y, hook, "y")
    >>> (y * 5).sum().backward()
    >>> seen
    [('y', [5.0, 5.0]), ('x', [15.0, 15.0])]
    """
    node = tensor.grad_fn
    if node is None:
        return tensor.register_hook(partial(fn, None, *args))
    return node.register_prehook(partial(fn, tensor.output_nr, *args))


def in_compiled_autograd() -> bool:
    """Whether compiled autograd is running the backward pass (its module is imported only where it is used).
    Its engine takes no callback for the pass's end, and its compiled code may write a later result into the
    buffer of a gradient a hook received: a hook that runs under it keeps nothing for later."""
    compiled = sys.modules.get("torch._dynamo.compiled_autograd")
    return compiled is not None and bool(compiled.in_compiled_autograd_region)


def untraced(fn: _F) -> _F:
    """``fn`` as a hook that compiled autograd may call: compiled autograd traces a backward pass's hooks with
    dynamo, which cannot trace the recorder's (side effects on its state, the host kernels); this one dynamo
    runs as it is, with what it calls, between the parts of the compiled graph, with the real gradients. The
    wrapper costs about ten plain calls per gradient: for processes where dynamo is loaded (``dynamo_loaded``)."""
    return torch.compiler.disable(fn)


def dynamo_loaded() -> bool:
    """Whether dynamo (``torch.compile``, compiled autograd) is imported in this process."""
    return "torch._dynamo" in sys.modules


def hook_method(owner: Any, method: Callable[..., None]) -> Callable[..., None]:
    """``method``, a bound method of ``owner``, as its gradient hooks call it: ``untraced`` where dynamo is loaded
    (the wrapper made once per method and kept on ``owner``), the method itself elsewhere."""
    if not dynamo_loaded():
        return method
    kept = owner.__dict__.setdefault("_untraced_hooks", {})
    hook = kept.get(method.__name__)
    if hook is None:
        hook = kept[method.__name__] = untraced(method)
    return hook

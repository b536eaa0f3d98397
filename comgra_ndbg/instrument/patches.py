"""Process-wide instrumentation shared by every open ``NeuralDbg``: installed once, removed with the last.

Some things a training loop does are not visible from the model's hooks: which tensor ``backward()`` is
called on (the loss, however it was computed), the unscaled loss behind ``scaler.scale(loss)``, and which
optimizer steps (a GAN's generator update runs the discriminator without being its step). While at least
one ``NeuralDbg`` is open, this module replaces

- ``torch.autograd.backward`` (which ``Tensor.backward`` calls) by a wrapper that hands the roots of each
  outermost backward call to every open listener, calls the original, then tells the listeners that have
  ``_after_backward_call()`` that it returned: two Python calls per ``backward()``; a backward call made
  from inside a backward pass (a reentrant checkpoint's recompute) is not a loss and is passed on untouched;
- ``torch.amp.GradScaler.scale`` by a wrapper that remembers, weakly, which loss each scaled tensor came
  from, so that ``scaler.scale(loss).backward()`` reports ``loss`` and not ``loss × scale``, and by which
  scale (``scale_of``): the registered tensors' gradients of that backward call are divided by it, into
  the units of the parameters' gradients, which the step reads after ``scaler.unscale_``;

and registers a global optimizer step pre-hook and post-hook (``torch.optim.optimizer``'s, which every
optimizer runs), so each listener sees every optimizer's step: right before it (the gradients the optimizer
uses, after clipping and unscaling) and right after it.

All of it is put back exactly as it was when the last listener detaches (``NeuralDbg.close()``), also when
the training loop raised. Listeners are objects with ``_on_backward_call(roots)``, ``roots`` being a list of
``(tensor backward was called on, the loss it stands for)``, ``_before_optimizer_step(optimizer)`` and
``_after_optimizer_step_anywhere(optimizer)``; an exception in a listener is reported as a
``RecorderWarning`` and never reaches the training loop.

>>> import torch
>>> original = torch.autograd.backward
>>> class Spy:
...     def __init__(self): self.seen = []
...     def _on_backward_call(self, roots): self.seen += [loss.item() for _, loss in roots]
...     def _before_optimizer_step(self, optimizer): pass
...     def _after_optimizer_step_anywhere(self, optimizer): pass
>>> spy = Spy()
>>> attach(spy)
>>> x = torch.ones(2, requires_grad=True)
>>> (x * 3).sum().backward()
>>> detach(spy)
>>> spy.seen, torch.autograd.backward is original
([6.0], True)
"""
from __future__ import annotations

import functools
import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.amp import grad_scaler
from torch.optim import optimizer as optim_module
from torch.utils.weak import WeakIdKeyDictionary

from comgra_ndbg.recorder.recorder import RecorderWarning

__all__ = ["attach", "detach", "installed", "scale_calls", "scale_of"]

_lock = threading.Lock()
_listeners: list[Any] = []
_optimizer_hooks: list[Any] = []  # the handles of the global optimizer step hooks
_unscaled = WeakIdKeyDictionary()  # scaled tensor -> the loss it was scaled from (weak on both ends' owner)
_scales = WeakIdKeyDictionary()  # scaled tensor -> the scaler's scale tensor it was multiplied by
_scale_calls = [0]  # GradScaler.scale calls while patched: a step that used a scaler may skip optimizer.step()


class _Patch:
    """One attribute of one object replaced by a wrapper of the original, and put back."""

    def __init__(self, owner: Any, name: str, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        self.owner, self.name, self.wrap = owner, name, wrap
        self.original: Any = None
        self.wrapper: Any = None
        self.had_own = False

    def install(self) -> None:
        self.had_own = self.name in vars(self.owner)
        self.original = getattr(self.owner, self.name)
        self.wrapper = functools.wraps(self.original)(self.wrap(self.original))
        setattr(self.owner, self.name, self.wrapper)

    def remove(self) -> None:
        """Put the original back, unless someone replaced the wrapper since: then the wrapper stays in their
        chain and does nothing more than call the original (no listener is left)."""
        if getattr(self.owner, self.name, None) is self.wrapper:
            if self.had_own:
                setattr(self.owner, self.name, self.original)
            else:
                delattr(self.owner, self.name)
        self.original = self.wrapper = None


def _wrap_backward(original: Callable[..., Any]) -> Callable[..., Any]:
    def backward(*args: Any, **kwargs: Any) -> Any:
        if _listeners and torch._C._current_graph_task_id() == -1:  # outermost: not a recompute inside backward
            _dispatch(args[0] if args else kwargs.get("tensors"))
            result = original(*args, **kwargs)
            _notify_after_backward()
            return result
        return original(*args, **kwargs)

    return backward


def _wrap_scale(original: Callable[..., Any]) -> Callable[..., Any]:
    def scale(self: Any, outputs: Any) -> Any:
        scaled = original(self, outputs)
        _scale_calls[0] += 1
        if isinstance(outputs, torch.Tensor) and isinstance(scaled, torch.Tensor) and scaled is not outputs:
            _unscaled[scaled] = outputs
            scale_tensor = getattr(self, "_scale", None)
            if isinstance(scale_tensor, torch.Tensor):
                _scales[scaled] = scale_tensor
        return scaled

    return scale


_PATCHES = (_Patch(torch.autograd, "backward", _wrap_backward),
            _Patch(grad_scaler.GradScaler, "scale", _wrap_scale))


def _dispatch(tensors: Any) -> None:
    """Hand ``(root, loss)`` of each tensor root of a backward call to every listener."""
    items = tensors if isinstance(tensors, (tuple, list)) else (tensors,)
    scaled = _scale_calls[0] > 0  # (no scaler ran: no weak-dictionary lookup, three calls each, at every step)
    roots = [(root, _unscaled.get(root, root) if scaled else root) for root in items if isinstance(root, torch.Tensor)]
    if roots:
        _notify("_on_backward_call", "taking the loss of a backward call", roots)


def _notify_after_backward() -> None:
    """An outermost backward call returned (the gradients are accumulated): tell the listeners that ask."""
    for listener in list(_listeners):
        after = getattr(listener, "_after_backward_call", None)
        if after is not None:
            try:
                after()
            except Exception as error:  # a recorder problem must never break the user's training loop
                warnings.warn(f"comgra_ndbg: looking at a backward call failed ({type(error).__name__}: {error}); "
                              f"training continues and this part is not recorded", RecorderWarning, stacklevel=3)


def _before_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    _notify("_before_optimizer_step", "looking at an optimizer step", optimizer)


def _after_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    _notify("_after_optimizer_step_anywhere", "looking at an optimizer step", optimizer)


def _notify(method: str, what: str, argument: Any) -> None:
    for listener in list(_listeners):
        try:
            getattr(listener, method)(argument)
        except Exception as error:  # a recorder problem must never break the user's training loop
            warnings.warn(f"comgra_ndbg: {what} failed ({type(error).__name__}: {error}); training continues "
                          f"and this part is not recorded", RecorderWarning, stacklevel=4)


def attach(listener: Any) -> None:
    """Start handing backward calls to ``listener``; the first listener installs the patches."""
    with _lock:
        if listener in _listeners:
            return
        if not _listeners:
            for patch in _PATCHES:
                patch.install()
            disable = torch.compiler.disable  # a compiled optimizer step calls them, untraced
            _optimizer_hooks.append(optim_module.register_optimizer_step_pre_hook(disable(_before_step)))
            _optimizer_hooks.append(optim_module.register_optimizer_step_post_hook(disable(_after_step)))
        _listeners.append(listener)


def detach(listener: Any) -> None:
    """Stop handing backward calls to ``listener``; the last one puts every patched function back."""
    with _lock:
        if listener not in _listeners:
            return
        _listeners.remove(listener)
        if not _listeners:
            for patch in _PATCHES:
                patch.remove()
            for handle in _optimizer_hooks:
                handle.remove()
            _optimizer_hooks.clear()
            _unscaled.clear()
            _scales.clear()


def scale_of(root: torch.Tensor) -> torch.Tensor | None:
    """The scale ``GradScaler.scale`` multiplied ``root`` by (a 0-d tensor, read where it lives: no device
    sync), or None for a tensor no scaler made: the gradients of a backward call on ``root`` carry it."""
    return _scales.get(root)


def scale_calls() -> int:
    """How many times ``GradScaler.scale`` was called while the patches were in place."""
    return _scale_calls[0]


def installed() -> bool:
    """Whether the patches are in place (some listener is attached)."""
    return bool(_listeners)

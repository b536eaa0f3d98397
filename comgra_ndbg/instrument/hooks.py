"""Module-boundary instrumentation: forward hooks that hand chosen modules' outputs to a callback.

This is the part of ``NeuralDbg`` that sits inside the model. Each chosen module gets one forward hook.
In eager mode the hook calls ``on_output(path, output)`` at once (before a later in-place op can change
the output). Inside a ``torch.compile`` region the hook is traced by Dynamo instead, so it must not call
into the recorder: it appends ``(path, output, tapped)`` to :attr:`ModuleHooks.stash` — a list mutation Dynamo
replays after the compiled graph ran, without a graph break — and the caller drains the stash after the
root module's forward. Its gradient cannot be taken with ``Tensor.register_hook`` there (the hook would
be traced too, and a side effect in it breaks the graph), so the traced hook wraps the output in the
``comgra_ndbg::grad_tap`` custom op instead: an identity in the forward pass whose backward hands the
gradient to a callback registered for the hook's slot. Custom ops are opaque to Dynamo and Inductor, so
the side effect happens at run time, in the compiled backward, with no graph break.

Hooks do nothing unless :attr:`ModuleHooks.capture` is true; Dynamo guards on that attribute, so a
compiled model holds at most two variants (capturing or not) and flipping it never recompiles more.

A pass that records nothing still pays for hooks that return at once: any forward hook sends each module
call through torch's slow path (about 1.8 µs a call, more inside a training step; a model with hundreds of
leaf modules pays it hundreds of times per pass). So while the model runs eagerly, :meth:`ModuleHooks.detach` takes the hooks out of their modules for passes that need none and
:meth:`ModuleHooks.attach` puts them back, each at its old place among the module's hooks (another hook of
the module runs before or after ours as it did). Once compiled code is seen the hooks are :attr:`pinned`:
traced code guards on a module's hooks, and toggling them would recompile it.

A compiled region's backward is one autograd node, so the edges between its outputs are invisible there:
``structure.discover_structure`` runs the model once eagerly on the same inputs and returns the edges and
saturation bounds, under the same tensor names (:func:`output_names`, :func:`input_names`).

>>> from torch import nn
>>> model = nn.Sequential(nn.Linear(3, 4), nn.Sequential(nn.Tanh(), nn.Linear(4, 2)))
>>> [path for path, _ in select_modules(model, None)]
['0', '1.0', '1.1']
>>> [path for path, _ in select_modules(model, ["1", nn.Linear])]
['0', '1', '1.1']
"""
from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import fields, is_dataclass
from fnmatch import fnmatchcase
from functools import partial
from typing import Any

import torch
from torch import nn

from comgra_ndbg.errors import InvalidArgumentError
from comgra_ndbg.graph.discovery import autograd_origin

__all__ = ["ROOT", "INPUT", "ModuleHooks", "ModulePattern", "call_name", "call_node", "from_compiled_code",
           "input_names", "node_name", "output_names", "select_modules", "tensor_leaves"]

ROOT = "model"
"""The model's node name; the module at path ``p`` inside it is node ``model.p``."""
INPUT = "input"

ModulePattern = str | type
"""A module path pattern (``fnmatch`` syntax over the path inside the model, ``""`` is the model itself,
e.g. ``"blocks.*"``) or a module class (its instances and subclasses' instances match)."""

_SINKS: dict[int, Callable[[int, int, torch.Tensor], None]] = {}  # slot -> receiver of that tap's gradients
_SLOTS = itertools.count(1)


@torch.library.custom_op("comgra_ndbg::grad_tap", mutates_args=())
def _grad_tap(x: torch.Tensor, slot: int, leaf: int) -> torch.Tensor:
    """Identity (a copy: custom ops may not return their input) whose backward reports the gradient of
    tensor number ``leaf`` (in ``tensor_leaves`` order) of the output of the module hooked at ``slot``."""
    return x.clone()


@_grad_tap.register_fake
def _grad_tap_fake(x: torch.Tensor, slot: int, leaf: int) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("comgra_ndbg::grad_sink", mutates_args=())
def _grad_sink(grad: torch.Tensor, slot: int, leaf: int) -> torch.Tensor:
    """The tap's backward: hand ``grad`` to the slot's receiver, pass it on unchanged."""
    receiver = _SINKS.get(slot)
    if receiver is not None:
        receiver(slot, leaf, grad)
    return grad.clone()


@_grad_sink.register_fake
def _grad_sink_fake(grad: torch.Tensor, slot: int, leaf: int) -> torch.Tensor:
    return torch.empty_like(grad)


def _tap_setup(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    ctx.slot, ctx.leaf = inputs[1], inputs[2]


def _tap_backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
    return _grad_sink(grad, ctx.slot, ctx.leaf), None, None


_grad_tap.register_autograd(_tap_backward, setup_context=_tap_setup)


def select_modules(root: nn.Module, patterns: Sequence[ModulePattern] | None) -> list[tuple[str, nn.Module]]:
    """``(path, module)`` of the modules to instrument: every leaf module (one without children) when
    ``patterns`` is None, else every module matching one of the patterns, in ``named_modules`` order."""
    named = list(root.named_modules())
    if patterns is None:
        return [(path, module) for path, module in named if next(module.children(), None) is None]
    if isinstance(patterns, (str, type)):
        patterns = [patterns]
    if isinstance(patterns, nn.Module) or not isinstance(patterns, Iterable):
        raise InvalidArgumentError(f"modules= takes path patterns (str, e.g. 'blocks.*') or nn.Module classes, or a "
                                   f"list of them, got {type(patterns).__name__} {patterns!r:.60}"
                                   + ("; for a module, pass its path or its class" if isinstance(patterns, nn.Module)
                                      else ""))
    patterns = list(patterns)
    for pattern in patterns:
        if not (isinstance(pattern, str) or (isinstance(pattern, type) and issubclass(pattern, nn.Module))):
            raise InvalidArgumentError(f"modules= takes path patterns (str, e.g. 'blocks.*') or nn.Module classes, "
                                       f"got {pattern!r}")
    chosen = [(path, module) for path, module in named if any(
        fnmatchcase(path, p) if isinstance(p, str) else isinstance(module, p) for p in patterns)]
    if not chosen:
        paths = [path for path, _ in named if path][:12]
        raise InvalidArgumentError(f"no module matches modules={list(patterns)!r}; module paths are {paths}"
                                   f"{' …' if len(named) > 13 else ''} (the model itself is '')")
    return chosen


def tensor_leaves(output: Any, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """``(suffix, tensor)`` for each tensor in a module output: ``""`` for a tensor, ``[i]`` / ``[key]``
    for tensors in tuples, lists, dicts and dataclass instances (``[field]``), nested as deep as they go;
    anything else is skipped.

    >>> [s for s, _ in tensor_leaves((torch.ones(1), {"h": torch.ones(1), "n": 3}))]
    ['[0]', '[1][h]']
    """
    if isinstance(output, torch.Tensor):
        yield prefix, output
    elif isinstance(output, (tuple, list)):
        for i, item in enumerate(output):
            yield from tensor_leaves(item, f"{prefix}[{i}]")
    elif isinstance(output, dict):
        for key, item in output.items():
            yield from tensor_leaves(item, f"{prefix}[{key}]")
    elif is_dataclass(output) and not isinstance(output, type):
        for item in fields(output):
            yield from tensor_leaves(getattr(output, item.name), f"{prefix}[{item.name}]")


def _tap_leaves(output: Any, slot: int, counter: Iterator[int], tapped: list[int]) -> Any:
    """``output`` with each floating tensor that requires grad wrapped in a tap, in the same containers
    (tuples, named tuples, lists, dicts; dict subclasses and dataclass instances are updated in place, so
    they keep their type) and the same ``tensor_leaves`` order; ``tapped`` collects the positions of the
    wrapped tensors."""
    if isinstance(output, torch.Tensor):
        position = next(counter)
        if not (output.requires_grad and output.is_floating_point()):
            return output
        tapped.append(position)
        return _grad_tap(output, slot, position)
    if isinstance(output, (tuple, list)):
        items = [_tap_leaves(item, slot, counter, tapped) for item in output]
        if isinstance(output, list):
            return items
        return type(output)(*items) if hasattr(output, "_fields") else tuple(items)
    if isinstance(output, dict):
        items = {key: _tap_leaves(item, slot, counter, tapped) for key, item in output.items()}
        if type(output) is dict:
            return items
        _put_back(output, items)  # a subclass (attribute access, a model-output class) keeps its type
    elif is_dataclass(output) and not isinstance(output, type):
        _put_back(output, {item.name: _tap_leaves(getattr(output, item.name), slot, counter, tapped)
                           for item in fields(output)})
    return output


def _put_back(output: Any, items: dict[Any, Any]) -> None:
    """Replace the values of a dict subclass (by key) or a dataclass instance (by attribute) in place, as
    the caller receives that very instance; a read-only mapping or a frozen dataclass keeps its tensors
    (their gradients go unrecorded) rather than failing the forward pass."""
    try:
        for key, item in items.items():
            if isinstance(output, dict):
                output[key] = item
            else:
                setattr(output, key, item)
    except Exception:  # noqa: BLE001 - whatever the container refuses, the forward pass goes on
        return


def node_name(path: str) -> str:
    """The node of the module at ``path`` (``""`` is the model itself).

    >>> node_name(""), node_name("blocks.0")
    ('model', 'model.blocks.0')
    """
    return f"{ROOT}.{path}" if path else ROOT


def output_names(base: str, leaves: list[tuple[str, torch.Tensor]], counts: dict[str, int]
                 ) -> list[tuple[str, torch.Tensor]]:
    """Tensor names of one call's output: the node name ``base``, ``#k`` for the k-th further call in the
    same forward pass (``counts`` keeps the calls so far), and the position inside tuples and dicts.

    >>> counts = {}
    >>> [n for n, _ in output_names("model.fc", [("", None)], counts) + output_names("model.fc", [("[0]", None)],
    ...                                                                             counts)]
    ['model.fc', 'model.fc#1[0]']
    """
    stem = call_name(base, counts)
    return [(stem + suffix, tensor) for suffix, tensor in leaves]


def call_name(base: str, counts: dict[str, int]) -> str:
    """The name of the next call of node ``base`` in a forward pass (``output_names`` of an output that is one
    tensor): ``base``, then ``base#1``, ``base#2``, ...

    >>> counts = {}
    >>> call_name("loss", counts), call_name("loss", counts)
    ('loss', 'loss#1')
    """
    calls = counts.get(base, 0)
    counts[base] = calls + 1
    return base if calls == 0 else f"{base}#{calls}"


def call_node(name: str, suffix: str) -> str:
    """The node of output tensor ``name`` (``suffix`` is its position inside the output): one node per call
    of a module, so a module called twice around other modules (a ``ReLU`` reused in a residual block) is
    two nodes in a chain, not a node in a cycle.

    >>> call_node("model.relu#1", ""), call_node("model.lstm#1[1][0]", "[1][0]")
    ('model.relu#1', 'model.lstm#1')
    """
    return name[:len(name) - len(suffix)] if suffix else name


def input_names(args: Sequence[Any], kwargs: dict[str, Any]) -> list[tuple[str, torch.Tensor]]:
    """Names of the tensors a forward pass was called with: ``input``, or ``input[i]`` / ``input[key]``."""
    if not kwargs and len(args) == 1 and isinstance(args[0], torch.Tensor):  # the usual call: model(x)
        return [(INPUT, args[0])]
    leaves = list(tensor_leaves(tuple(args))) + list(tensor_leaves(kwargs))
    return [(INPUT if len(leaves) == 1 else INPUT + suffix, tensor) for suffix, tensor in leaves]


def from_compiled_code(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` was produced by a ``torch.compile`` region (its backward is one compiled node)."""
    return tensor.grad_fn is not None and type(tensor.grad_fn).__name__.startswith("CompiledFunction")


class ModuleHooks:
    """One forward hook per chosen module; see the module docstring for eager and compiled behaviour.

    ``on_output(path, output)`` receives outputs of eager modules; compiled ones land in :attr:`stash`,
    and the gradients of their tapped output tensors go to ``on_tap_grad(path, leaf, grad)`` once
    :meth:`bind` was called (``leaf``: the tensor's position in ``tensor_leaves`` order). While
    :attr:`replay` is set, eager calls outside a captured pass go to it (a checkpoint's recompute).
    """

    def __init__(self, modules: Sequence[tuple[str, nn.Module]], on_output: Callable[[str, Any], None]) -> None:
        self.capture = False
        self.replay: Callable[[str, Any], None] | None = None  # receives eager calls outside a captured pass
        # (path, output, positions in tensor_leaves order of the tensors whose gradients go through a tap)
        self.stash: list[tuple[str, Any, tuple[int, ...]]] = []
        self._on_output = on_output
        self._collected: list[tuple[str, Any, list[tuple[Any, int]]]] | None = None
        self.collecting_now = False  # within ``collecting()`` (an attribute: every hook of a step reads it)
        self._paths: dict[int, str] = {}
        self._handles = []
        self._placed: list[tuple[nn.Module, int, Callable[..., Any]]] = []  # (module, hook id, hook)
        self.attached = True  # the hooks are in their modules
        self.pinned = False  # compiled code was seen: the hooks stay in their modules
        for path, module in modules:
            slot = next(_SLOTS)
            self._paths[slot] = path
            hook = partial(self._hook, path, slot)
            handle = module.register_forward_hook(hook)
            self._handles.append(handle)
            self._placed.append((module, handle.id, hook))

    def _hook(self, path: str, slot: int, module: nn.Module, args: Any, output: Any) -> Any:
        if not self.capture:
            if not torch.compiler.is_compiling() and self.replay is not None:  # never traced: no guard on it
                self.replay(path, output)
            return None
        if torch.compiler.is_compiling():
            tapped: list[int] = []
            counter = itertools.count()
            replaced = _tap_leaves(output, slot, counter, tapped)
            self.stash.append((path, output, tuple(tapped)))
            return replaced if tapped else None
        if self._collected is not None:  # with the autograd identities before a later in-place op moves them
            self._collected.append((path, output, [autograd_origin(t) for _, t in tensor_leaves(output)]))
        else:
            self._on_output(path, output)
        return None

    @contextmanager
    def collecting(self) -> Iterator[list[tuple[str, Any, list[tuple[Any, int]]]]]:
        """Within the block, eager outputs go to the yielded list instead of ``on_output``, as ``(path, output,
        (grad_fn, output_nr) of each tensor in tensor_leaves order when the hook ran)``."""
        seen: list[tuple[str, Any, list[tuple[Any, int]]]] = []
        self._collected = seen
        self.collecting_now = True
        try:
            yield seen
        finally:
            self._collected = None
            self.collecting_now = False

    def drain(self) -> list[tuple[str, Any, tuple[int, ...]]]:
        """What compiled modules stashed since the last call, in call order; the stash is empty after."""
        items = list(self.stash)
        self.stash.clear()  # clear, never rebind: compiled code holds on to this very list
        return items

    def bind(self, on_tap_grad: Callable[[str, int, torch.Tensor], None]) -> None:
        """Send the gradients reaching this instance's taps to ``on_tap_grad(path, leaf, grad)``."""
        paths = self._paths

        def receive(slot: int, leaf: int, grad: torch.Tensor) -> None:
            on_tap_grad(paths[slot], leaf, grad)

        for slot in paths:
            _SINKS[slot] = receive

    @property
    def installed(self) -> int:
        return len(self._handles)

    def detach(self) -> None:
        """Take the hooks out of their modules (a pass that needs none runs at torch's speed); not once
        :attr:`pinned` or removed."""
        if not self.attached or self.pinned or not self._handles:
            return
        for module, hook_id, _ in self._placed:
            module._forward_hooks.pop(hook_id, None)
        self.attached = False

    def attach(self) -> None:
        """Put the hooks back into their modules, each where it was among the module's hooks (hook ids
        grow with registration, so the hooks registered after ours move behind it again)."""
        if self.attached or not self._handles:
            return
        for module, hook_id, hook in self._placed:
            hooks = module._forward_hooks
            hooks[hook_id] = hook
            for later in [key for key in hooks if key > hook_id]:
                hooks.move_to_end(later)
        self.attached = True

    def pin(self) -> None:
        """Compiled code runs the model: attach the hooks for good (see the module docstring)."""
        self.attach()
        self.pinned = True

    def remove(self) -> None:
        """Remove every hook and tap receiver; compiled code that still holds a traced hook sees
        ``capture`` false (a guard), so it recompiles or takes the variant that does nothing."""
        self.capture = False
        self.replay = None
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._placed.clear()
        for slot in self._paths:
            _SINKS.pop(slot, None)
        self.stash.clear()

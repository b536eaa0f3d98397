"""The structure pass: the edges of a forward pass that autograd does not show, from one eager pass.

The recorder finds edges by walking autograd from each registered tensor. Some training passes hide parts
of the model from that walk:

- a ``torch.compile`` region is one autograd node: which of its outputs came from which input is gone;
- a frozen part (``requires_grad_(False)``) builds no autograd node at all: its inputs, its modules'
  outputs and its parameters would be orphans;
- a reentrant ``torch.utils.checkpoint`` runs its function under ``no_grad``: the same, inside the
  checkpointed segment;
- under ``torch.autocast`` the first layer reads a cast copy of the input, so the input is not found
  among the tensors that layer saved for backward;
- under saved-tensor hooks the walk does not read saved tensors (see below).

For such a pass, :func:`discover_structure` runs the eager model once more on the same inputs, with every
floating input (a copy) and every frozen parameter requiring grad and every reentrant checkpoint running
its function directly, under the autocast state of the training pass, and returns the edges between the
tensors the training pass registers, named as it names them (``hooks.output_names`` /
``hooks.input_names``), and each output's saturation bounds. The random number generators are restored
afterwards, the module's buffers are copies during the pass (``graph.eager.discover_module_structure``) and
the parameters' ``requires_grad`` is put back, so training continues exactly as if it had not run. It
costs one more forward pass with gradients, once per distinct structure (``NeuralDbg`` caches the result).

A pass also takes its edges from a structure pass when some module ran under saved-tensor hooks (the
non-reentrant checkpoint, ``save_on_cpu``): the walk may not unpack those saved tensors, which would
recompute the segment, so grad-less inputs read there would have no edge.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils import checkpoint as checkpoint_module

from comgra_ndbg.graph import TensorEdge
from comgra_ndbg.graph.eager import discover_module_structure
from comgra_ndbg.instrument.hooks import ROOT, ModuleHooks, input_names, node_name, output_names, tensor_leaves
from comgra_ndbg.stats.bounds import saturation_bounds

__all__ = ["ModelStructure", "autocast_active", "discover_structure", "fully_visible", "hidden_from_autograd",
           "saved_tensors_hooked", "top_saved_tensors_hooks"]


@dataclass
class ModelStructure:
    """What one structure pass found: tensor edges and each output's saturation bounds."""

    edges: list[TensorEdge] = field(default_factory=list)
    bounds: dict[str, tuple[float, float] | None] = field(default_factory=dict)


def discover_structure(root: nn.Module, args: Sequence[Any], kwargs: dict[str, Any], hooks: ModuleHooks, *,
                       root_output: bool) -> ModelStructure:
    """Run ``root`` (the eager module, also behind a compiled one) once on ``args``/``kwargs`` with ``hooks``
    collecting and everything visible to autograd (:func:`fully_visible`), and find the edges between the
    inputs, the chosen modules' outputs (and the model's output with ``root_output``) and the parameters."""
    structure = ModelStructure()
    args, kwargs = _requiring_grad(tuple(args)), _requiring_grad(dict(kwargs))

    def forward(eager: nn.Module, register: Callable[..., None], *inputs: Any) -> None:
        with hooks.collecting() as seen:
            output = eager(*inputs, **kwargs)
        counts: dict[str, int] = {}
        named = [(name, tensor, None, False) for name, tensor in input_names(inputs, kwargs)]
        for path, out, origins in seen:
            named += [(name, tensor, origin, False) for (name, tensor), origin
                      in zip(output_names(node_name(path), list(tensor_leaves(out)), counts), origins)]
        if root_output:
            named += [(name, tensor, None, True)
                      for name, tensor in output_names(ROOT, list(tensor_leaves(output)), counts)]
        for name, tensor, origin, is_output in named:
            register(name, tensor, output=is_output, origin=origin)
            structure.bounds[name] = saturation_bounds(tensor)

    with fully_visible(root):
        structure.edges = discover_module_structure(root, list(args), forward, module_name=ROOT)
    return structure


@contextmanager
def fully_visible(root: nn.Module) -> Iterator[None]:
    """Within the block, ``root``'s frozen floating-point parameters require grad and a reentrant
    ``torch.utils.checkpoint`` calls its function directly (with gradients); both are put back after."""
    frozen = [p for p in root.parameters() if not p.requires_grad and (p.is_floating_point() or p.is_complex())]
    function_class = checkpoint_module.CheckpointFunction
    own_apply = function_class.__dict__.get("apply")
    try:
        for parameter in frozen:
            parameter.requires_grad_(True)
        function_class.apply = classmethod(_run_inline)
        yield
    finally:
        if own_apply is None:
            del function_class.apply
        else:
            function_class.apply = own_apply
        for parameter in frozen:
            parameter.requires_grad_(False)


def _run_inline(cls: type, function: Callable[..., Any], preserve_rng_state: bool, *args: Any) -> Any:
    """``CheckpointFunction.apply`` during a structure pass: the checkpointed function, run with gradients."""
    return function(*args)


def hidden_from_autograd(leaves: Sequence[tuple[str, torch.Tensor]]) -> bool:
    """Whether a module output of a training pass is hidden from autograd: a floating-point tensor that does
    not require grad (a frozen part, a ``no_grad`` region, a reentrant checkpoint's segment)."""
    return any(not t.requires_grad and (t.is_floating_point() or t.is_complex()) for _, t in leaves)


def _no_saved_tensors_hooks(ignore_empty: bool) -> None:
    """``top_saved_tensors_hooks`` of a torch without saved-tensor hooks: there are none."""
    return None


top_saved_tensors_hooks = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", _no_saved_tensors_hooks)
"""torch's ``_top_saved_tensors_default_hooks(ignore_empty)``: the innermost saved-tensor hooks, or None."""


def saved_tensors_hooked() -> bool:
    """Whether saved-tensor hooks are active now (inside a non-reentrant checkpoint, ``save_on_cpu``); the
    hook of every module output tests ``top_saved_tensors_hooks(False) is not None`` inline."""
    return top_saved_tensors_hooks(False) is not None


def autocast_active(inputs: Sequence[tuple[str, torch.Tensor]]) -> bool:
    """Whether ``torch.autocast`` is on for the host or for a device of the pass's tensor inputs (``inputs``:
    ``hooks.input_names`` of the pass)."""
    if torch.is_autocast_enabled("cpu"):
        return True
    for _, tensor in inputs:  # (no device object for a host tensor: the usual pass asks nothing more)
        if not tensor.is_cpu and torch.is_autocast_enabled(tensor.device.type):
            return True
    return False


def _requiring_grad(value: Any) -> Any:
    """``value`` with each floating-point tensor inside (tuples, lists, dicts) replaced by a copy that
    requires grad, so that what is computed from the inputs is visible to autograd."""
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() or value.is_complex():
            return value.detach().clone().requires_grad_(True)
        return value
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_requiring_grad(item) for item in value))
    if isinstance(value, (tuple, list)):
        return type(value)(_requiring_grad(item) for item in value)
    if isinstance(value, dict):
        return {key: _requiring_grad(item) for key, item in value.items()}
    return value

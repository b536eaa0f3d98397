"""Discover the structure of a compiled model by running its original module eagerly, once.

``torch.compile`` turns a region's backward into one ``CompiledFunctionBackward`` node: the outputs of the
region are still tensors with ``(grad_fn, output_nr)``, and the parameters it read are still
``AccumulateGrad`` inputs of that node, but which output came from which input is no longer visible. So
:func:`~comgra_ndbg.graph.discovery.discover_edges` on a compiled model's tensors sees every registered
output of a region depend on every input of it.

The supported pattern: call :func:`discover_module_structure` with the compiled model, an example batch
and the same forward code the training loop runs. It unwraps ``torch.compile``'s ``OptimizedModule``
(``compiled._orig_mod``, also for parameter names, which would otherwise start with ``_orig_mod.``), runs
the forward pass under ``torch.compiler.set_stance("force_eager")`` (so compiled submodules and compiled
functions called inside run eagerly too), discovers the edges while the graph is alive, and drops it
without backward. The random number generators are restored afterwards and the module's buffers (e.g.
batch-norm running statistics) are copies during the pass, so training continues exactly as if this had not
run. Do it once
per structure (see :class:`comgra_ndbg.graph.cache.GraphCache`), outside compiled code.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from comgra_ndbg.graph.discovery import autograd_origin, discover_edges
from comgra_ndbg.graph.model import TensorEdge

__all__ = ["Register", "discover_module_structure", "unwrap_compiled"]

Register = Callable[..., None]
"""``register(name, tensor, iteration=0, *, output=False, origin=None)``: what the forward code calls for
each tensor to show; ``output=True`` marks the model's outputs (see ``discover_edges``), ``origin`` is the
tensor's ``(grad_fn, output_nr)`` when it was produced, if an in-place op may have changed it since."""


def unwrap_compiled(module: nn.Module) -> nn.Module:
    """The eager module behind ``torch.compile(module)`` (unwrapping nested wrappers); ``module`` itself
    if it is not compiled.

    >>> layer = torch.nn.Linear(2, 2)
    >>> unwrap_compiled(torch.compile(layer, backend="eager")) is layer
    True
    """
    while isinstance(getattr(module, "_orig_mod", None), nn.Module):
        module = module._orig_mod
    return module


def discover_module_structure(
    module: nn.Module,
    example_inputs: Sequence[Any],
    forward: Callable[..., Any],
    *,
    module_name: str = "model",
    inputs_require_grad: bool = False,
) -> list[TensorEdge]:
    """Edges between the tensors ``forward`` registers, from one eager pass over ``example_inputs``.

    ``forward(eager_module, register, *example_inputs)`` runs the step's forward computation and calls
    ``register(name, tensor, iteration=0, output=False, origin=None)`` for each tensor the training loop
    registers. Parameters are
    named ``f"{module_name}.{parameter name}"`` as ``Recorder.track_module(module_name, module)`` names
    them. With ``inputs_require_grad=True``, floating-point tensors in ``example_inputs`` are replaced by
    copies that require grad, so edges from the inputs become visible through autograd itself (without it
    they are found, as in a training step, through the tensors the consuming ops saved for backward).

    >>> torch.manual_seed(0) and None
    >>> model = torch.compile(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh()), backend="eager")
    >>> def step(net, register, x):
    ...     register("input", x)
    ...     register("hidden", net[0](x))
    ...     register("output", net(x))
    >>> for edge in discover_module_structure(model, [torch.randn(2, 3)], step, inputs_require_grad=True):
    ...     print(edge.source, "->", edge.target)
    input -> hidden
    input -> output
    model.0.bias -> hidden
    model.0.bias -> output
    model.0.weight -> hidden
    model.0.weight -> output
    """
    eager = unwrap_compiled(module)
    inputs = [_requiring_grad(x) if inputs_require_grad else x for x in example_inputs]
    prefix = f"{module_name}." if module_name else ""
    parameters = {prefix + name: parameter for name, parameter in eager.named_parameters()}
    registered: list[tuple[str, int, torch.Tensor, tuple[Any, int]]] = []
    outputs: set[str] = set()

    def register(name: str, tensor: torch.Tensor, iteration: int = 0, *, output: bool = False,
                 origin: tuple[Any, int] | None = None) -> None:
        registered.append((name, iteration, tensor, origin or autograd_origin(tensor)))
        if output:
            outputs.add(name)

    devices = sorted({t.device.index or 0 for t in [*eager.parameters(), *inputs] if _is_cuda(t)})
    with _buffer_copies(eager), torch.random.fork_rng(devices=devices), torch.enable_grad(), \
            torch.compiler.set_stance("force_eager"):
        forward(eager, register, *inputs)
        return discover_edges(registered, parameters, outputs=outputs)


@contextmanager
def _buffer_copies(module: nn.Module) -> Iterator[None]:
    """Within the block every buffer of ``module`` is a copy; the very same buffer tensors are put back
    after, unchanged: not even their version counters move (a copy back would, and the training pass's
    backward would then refuse a batch norm's running statistics it saved)."""
    swapped = []
    try:
        for owner in module.modules():
            for name, buffer in owner._buffers.items():
                if buffer is not None:
                    swapped.append((owner, name, buffer))
                    owner._buffers[name] = buffer.detach().clone()
        yield
    finally:
        for owner, name, buffer in swapped:
            owner._buffers[name] = buffer


def _requiring_grad(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.detach().clone().requires_grad_(True)
    return value


def _is_cuda(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == "cuda"

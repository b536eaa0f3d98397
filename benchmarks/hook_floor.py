"""The floor of a step that records nothing: NeuralDbg's hook entry points with empty bodies.

NeuralDbg sees a training step through hooks, and a step its policies skip still enters Python at each of
them: the model's forward pre-hook and forward hook, a pre-hook on the output's autograd node (which queues
a callback for the end of the backward pass), the criterion's forward hook, the patched
``torch.autograd.backward``, the global optimizer step pre- and post-hooks and the ``optimizer=``'s own
post-hook, each behind ``torch.compiler.disable`` as NeuralDbg installs them. :func:`run_hook_floor` trains
with exactly those entries doing nothing, so a skipped step's ratio to bare splits into what entering the
hooks costs (any recorder built on them pays it) and what NeuralDbg does in them (step detection, the loss
and learning-rate KPIs, the loop invariants).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.optim import optimizer as optimizer_module

from benchmarks.neuraldbg_overhead import OPTIMIZERS, timed_loop

__all__ = ["run_hook_floor"]


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


def run_hook_floor(make_model: Callable[[], nn.Module], data: list, optimizer_name: str = "adam"
                   ) -> tuple[float, float]:
    """``neuraldbg_overhead.run`` with NeuralDbg's hook entry points installed and empty (see the module
    docstring); returns the median wall-clock and CPU seconds per step after 10 warm-up steps."""
    torch.manual_seed(0)
    model, criterion = make_model(), nn.CrossEntropyLoss()
    optimizer = OPTIMIZERS[optimizer_name](model.parameters())
    disable = torch.compiler.disable
    engine = torch.autograd.Variable._execution_engine

    def on_output_gradient(grad_outputs: tuple) -> None:
        engine.queue_callback(_nothing)

    def after_forward(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        if isinstance(output, torch.Tensor) and output.grad_fn is not None:
            output.grad_fn.register_prehook(on_output_gradient)

    handles = [model.register_forward_pre_hook(disable(_nothing), with_kwargs=True),
               model.register_forward_hook(disable(after_forward), with_kwargs=True),
               criterion.register_forward_hook(disable(_nothing)),
               optimizer.register_step_post_hook(disable(_nothing)),
               optimizer_module.register_optimizer_step_pre_hook(disable(_nothing)),
               optimizer_module.register_optimizer_step_post_hook(disable(_nothing))]
    original = torch.autograd.backward

    def backward(*args: Any, **kwargs: Any) -> Any:
        _nothing(args)
        return original(*args, **kwargs)

    torch.autograd.backward = backward
    try:
        return timed_loop(model, criterion, optimizer, data)
    finally:
        torch.autograd.backward = original
        for handle in handles:
            handle.remove()

"""The loss: node ``loss`` (and ``target``) and the ``loss`` KPI of every step.

``LossCapture`` is a mixin of ``NeuralDbg`` and works on its state. With ``loss=criterion_module`` the
criterion's forward hook hands over its output (the loss) and its second argument (the target).
"""
from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import nn

from comgra_ndbg.instrument.hooks import output_names
from comgra_ndbg.instrument.steps import LOSS
from comgra_ndbg.recorder.grad_hook import on_gradient

__all__ = ["LossCapture", "TARGET"]

TARGET = "target"


class LossCapture:
    """Loss capture of ``NeuralDbg`` (see the module docstring); not used on its own."""

    def _after_loss(self, module: nn.Module, args: tuple, output: Any) -> None:
        if (self._closed or self._hooks.collecting_now or not self._training_pass or not torch.is_grad_enabled()
                or not isinstance(output, torch.Tensor) or self.recorder.current_step is None):
            return
        self._safely("recording the loss", self._record_loss, args, output)

    def _record_loss(self, args: tuple, output: torch.Tensor) -> None:
        """The loss value (KPI, every step) and, on recorded steps, the loss and target tensors."""
        rec = self.recorder
        self._losses.append(output.detach().float().mean())
        if not rec.is_recording:
            return
        target = args[1] if len(args) > 1 and isinstance(args[1], torch.Tensor) and not args[1].requires_grad else None
        [(name, _)] = output_names(LOSS, [("", output)], self._counts)
        sources = list(self._output_names)
        if target is not None:
            [(target_name, _)] = output_names(TARGET, [("", target)], self._counts)
            rec.register_tensor(target_name, target, role="target", node=TARGET)
            sources.append(target_name)
        if not self._compiled_pass:
            rec.register_tensor(name, output, role="loss", node=LOSS)
            return
        rec.register_tensor(name, output.detach(), role="loss", node=LOSS)  # autograd would see the whole region
        for source in sources:
            rec.add_dependency(source, name, discovered=True)
        if output.requires_grad:
            self._tensor_handles.append(on_gradient(output, partial(self._on_grad, name, self._iteration, False)))

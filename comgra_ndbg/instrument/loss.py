"""The loss: node ``loss`` and the ``loss`` KPI of every step, however the loop computes it.

``LossCapture`` is a mixin of ``NeuralDbg`` and works on its state. Two sources:

- without ``loss=`` (the default): the tensor ``backward()`` is called on. ``patches`` hands every
  outermost backward call's roots to each open ``NeuralDbg``; one takes a root when its model ran a
  training pass in the open step and the root depends on that pass's output (:func:`reached_outputs`
  walks ``grad_fn`` from the root and stops at the output: a few nodes for a loss computed from the output,
  the loss's own graph otherwise). ``scaler.scale(loss).backward()`` reports the unscaled ``loss``. A
  loss divided before ``backward()`` (``(loss / k).backward()`` for accumulation) is recorded divided:
  it is what the optimizer's gradient came from;
- with ``loss=criterion_module``: the criterion's forward hook hands over its output (the loss) and its
  second argument (the target), before any scaling the loop applies.

Either way the KPI ``loss`` of a step is the mean of its losses (several ``backward()`` calls: gradient
accumulation, two losses), recorded on every step, skipped or not, NaN and Inf included; on recorded steps
the loss is registered as node ``loss`` (``loss#1``, … for further losses of one forward pass), so the edge
``model → loss`` is in the graph.
"""
from __future__ import annotations

import math
from functools import partial
from typing import Any

import torch
from torch import nn

from comgra_ndbg.instrument import patches
from comgra_ndbg.instrument.hooks import ROOT, call_name, tensor_leaves
from comgra_ndbg.instrument.loop_rules import FAILURE, INFO, Violation
from comgra_ndbg.instrument.loss_graph import INFORMATION, gradient_leaves, loss_mistakes
from comgra_ndbg.instrument.steps import LOSS
from comgra_ndbg.recorder import native
from comgra_ndbg.recorder.grad_hook import hook_method, on_gradient

__all__ = ["LossCapture", "TARGET", "loss_value", "reached_outputs"]

TARGET = "target"
LOSS_GRAPHS = 3
"""Backward calls of a run whose loss graphs are read for mistakes in how the prediction reaches the loss."""

OutputKey = tuple[Any, int]
"""An output tensor's autograd identity: ``(grad_fn, output_nr)``."""


def loss_value(loss: torch.Tensor) -> float | torch.Tensor:
    """One pass's contribution to the ``loss`` KPI: the loss's mean in float32. A host scalar (the usual
    loss) is read at once as a float, with no tensor operation; any other stays a 0-d tensor on its device
    until the step's KPIs are copied together (no synchronisation in the middle of a step).

    >>> loss_value(torch.tensor(0.1, dtype=torch.float64)) == float(torch.tensor(0.1).item())
    True
    >>> loss_value(torch.tensor([1.0, 2.0]))
    tensor(1.5000)
    """
    if loss.dim() == 0 and loss.is_cpu and loss.is_floating_point():
        if loss.dtype is torch.float64:
            return loss.detach().to(torch.float32).item()
        return native.scalar(loss)  # (read from memory: no tensor operation at every step)
    return loss.detach().float().mean()


def step_loss(losses: list[float | torch.Tensor]) -> float | torch.Tensor:
    """The ``loss`` KPI of a step from its passes' ``loss_value``s: their float32 mean (one pass: its value).

    >>> step_loss([1.0, 2.0]), step_loss([torch.tensor(1.0), torch.tensor(2.0)])
    (1.5, tensor(1.5000))
    """
    if len(losses) == 1:
        return losses[0]
    device = next((v.device for v in losses if isinstance(v, torch.Tensor)), None)
    if device is None:
        return torch.tensor(losses, dtype=torch.float32).mean().item()
    return torch.stack([v if isinstance(v, torch.Tensor) else torch.tensor(v, dtype=torch.float32, device=device)
                        for v in losses]).mean()


def reached_outputs(loss: torch.Tensor, outputs: dict[OutputKey, Any]) -> list[Any]:
    """The values of ``outputs`` (keyed by ``(grad_fn, output_nr)``) whose tensors ``loss`` was computed
    from, in the order the walk meets them; the walk stops at each one it reaches.

    >>> x = torch.ones(3, requires_grad=True)
    >>> out, other = x * 2, x * 3
    >>> outputs = {(out.grad_fn, out.output_nr): "out", (other.grad_fn, other.output_nr): "other"}
    >>> reached_outputs((out - 1).pow(2).mean(), outputs), reached_outputs(x.sum(), outputs)
    (['out'], [])
    """
    node = loss.grad_fn
    if node is None or not outputs:
        return []
    own = outputs.get((node, loss.output_nr))
    if own is not None:
        return [own]
    found: list[Any] = []
    seen, stack = {node}, [node]
    while stack:
        for child, output_nr in stack.pop().next_functions:
            if child is None:
                continue
            hit = outputs.get((child, output_nr))
            if hit is not None:
                if hit not in found:
                    found.append(hit)
            elif child not in seen:
                seen.add(child)
                stack.append(child)
    return found


class LossCapture:
    """Loss capture of ``NeuralDbg`` (see the module docstring); not used on its own."""

    # ---- the tensor backward() is called on ------------------------------------------------------------
    def _note_outputs(self, output: Any) -> None:
        """Remember the autograd identity of each output tensor of this training pass, for the losses (called
        without ``loss=``: the losses are then the tensors ``backward()`` is called on)."""
        for suffix, tensor in tensor_leaves(output):
            if tensor.grad_fn is not None:
                self._loss_sources[(tensor.grad_fn, tensor.output_nr)] = (ROOT + suffix, self._iteration)

    def _note_model_outputs(self, output: Any) -> None:
        """Keep the output tensors of a training pass until the model's graph was walked once for parameters
        it does not hold (``_check_outside``, at the next backward call); called until it was walked, with the
        invariants on."""
        self._model_outputs = [t for _, t in tensor_leaves(output) if t.grad_fn is not None]

    def _check_outside(self) -> None:
        """The parameters the model's pass reached that the model does not hold (sub-modules in a plain list):
        kept for the invariants, which judge them against the optimizers of the next steps."""
        self._outside_checked = True
        self._inv_outside = [p for p in gradient_leaves(self._model_outputs)
                             if isinstance(p, nn.Parameter) and id(p) not in self._parameter_ids]
        self._inv_outside_from = self._inv_step_number()
        self._model_outputs = []

    def _on_backward_call(self, roots: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """``patches``' callback: take each root computed from this step's forward passes as a loss."""
        if not self._closed:
            self._probe_before_backward()
            # a GradScaler's scaled loss: its gradients are divided by the scale (``Recorder.gradient_scale``)
            scale = None if not patches.scale_calls() else next(
                (scale for scale in map(patches.scale_of, (root for root, _ in roots)) if scale is not None), None)
            self.recorder.gradient_scale = scale
            self._scaled_backward = self._scaled_backward or scale is not None
        if self._inv and not self._light and not self._closed:  # a light step: its loss only (below)
            try:
                self._inv_backward_call()
            except Exception as error:  # a recording problem must never break the training loop
                self.recorder._warn("checking loop invariants", error)
            if self._model_outputs and not self._outside_checked:
                self._safely("checking loop invariants", self._check_outside)
            if self._loss_graphs_read < LOSS_GRAPHS and self.recorder.current_step is not None:
                self._loss_graphs_read += 1
                self._safely("checking loop invariants", self._check_loss_graph, roots)
        if self._closed or not self._loss_sources or (self.recorder.current_step is None and not self._light):
            return
        for _, loss in roots:
            sources = reached_outputs(loss, self._loss_sources)
            if sources:
                self._safely("recording the loss", self._take_loss, loss, sources)

    def _check_loss_graph(self, roots: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """How each loss of the backward call reaches its prediction (``loss_graph``): an activation the loss
        applies again, a prediction broadcast against its target; loop invariants, read at the first
        ``LOSS_GRAPHS`` backward calls of the run with a step open."""
        for _, loss in roots:
            for mistake in loss_mistakes(loss):
                node = self.recorder.registered_node(mistake.source) if mistake.source is not None else None
                evidence = dict(mistake.evidence, node=node) if mistake.source is not None else mistake.evidence
                severity = INFO if mistake.invariant in INFORMATION else FAILURE
                self._inv_report(Violation(mistake.invariant, self._inv_step_number(), node or LOSS, mistake.message,
                                           severity, evidence))

    def _take_loss(self, loss: torch.Tensor, sources: list[tuple[str, int]]) -> None:
        rec = self.recorder
        self._losses.append(loss_value(loss))
        if not rec.is_recording:
            return
        name = call_name(LOSS, self._counts)
        self._register_loss(name, loss)
        if self._declared_edges:
            for source, iteration in sources:
                rec.add_dependency(source, name, source_iteration=iteration, discovered=True)

    def _register_loss(self, name: str, loss: torch.Tensor) -> None:
        """Register a loss tensor with its gradient; after a compiled pass detached, with a hook of ours (its
        edges are declared: autograd would see the whole compiled region)."""
        if not self._compiled_pass:
            self.recorder.register_tensor(name, loss, role="loss", node=LOSS)
            return
        self.recorder.register_tensor(name, loss.detach(), role="loss", node=LOSS)
        if loss.requires_grad:
            hook = partial(hook_method(self, self._on_grad), name, self._iteration, False)
            self._tensor_handles.append(on_gradient(loss, hook))

    def _record_loss_kpi(self, rec: Any) -> None:
        """The step's loss KPI: the mean of its passes' losses (one pass: its loss as it is), checked by
        ``record_kpi`` the first time, then filed by its KPI id."""
        value = step_loss(self._losses)
        if self._loss_kpi is None:
            rec.record_kpi(LOSS, value)
            self._loss_kpi = rec.catalog.kpi_id(LOSS)
        else:
            rec._record_known_kpi(self._loss_kpi, value)

    # ---- loss=criterion_module -------------------------------------------------------------------------
    def _after_loss(self, module: nn.Module, args: tuple, output: Any) -> None:
        if self._light:
            if self._training_pass and not self._closed and isinstance(output, torch.Tensor):
                self._safely("recording the loss", self._light_loss, output)
            return
        if (self._closed or self._hooks.collecting_now or not self._training_pass or not torch.is_grad_enabled()
                or not isinstance(output, torch.Tensor) or self.recorder.current_step is None):
            return
        try:
            self._record_loss(args, output)
        except Exception as error:  # a recording problem must never break the training loop
            self.recorder._warn("recording the loss", error)

    def _check_loss_shapes(self, args: tuple) -> None:
        """The loss module's prediction and floating target of other shapes that broadcast to more elements
        than either (``[B, 1]`` against ``[B]``: every prediction compared with every target of the batch, and
        the model learns the batch's mean; torch warns once, in a warning easily missed). Checked at the first
        recorded training pass; a loop invariant of its own (``target_shape``)."""
        if len(args) < 2 or not (isinstance(args[0], torch.Tensor) and isinstance(args[1], torch.Tensor)):
            return
        prediction, target = args[0], args[1]
        if not target.is_floating_point() or prediction.shape == target.shape:
            return
        try:
            shape = torch.broadcast_shapes(prediction.shape, target.shape)
        except RuntimeError:
            return
        if math.prod(shape) <= max(prediction.numel(), target.numel()):
            return
        self._inv_report(Violation(
            "target_shape", self._inv_step_number(), LOSS,
            f"the loss compares a prediction of shape {list(prediction.shape)} with a target of shape "
            f"{list(target.shape)}: they broadcast to {list(shape)}, every prediction against every target of the "
            f"batch, so the model learns the batch's mean",
            evidence={"prediction": list(prediction.shape), "target": list(target.shape), "broadcast": list(shape)}))

    def _record_loss(self, args: tuple, output: torch.Tensor) -> None:
        """The loss value (KPI, every step) and, on recorded steps, the loss and target tensors."""
        rec = self.recorder
        self._losses.append(loss_value(output))
        if self._inv and not self._loss_shapes_checked:
            self._loss_shapes_checked = True
            self._check_loss_shapes(args)
        if not rec.is_recording:
            return
        target = args[1] if len(args) > 1 and isinstance(args[1], torch.Tensor) and not args[1].requires_grad else None
        name = call_name(LOSS, self._counts)
        sources = list(self._output_names)
        if target is not None:
            target_name = call_name(TARGET, self._counts)
            rec.register_tensor(target_name, target, role="target", node=TARGET)
            sources.append(target_name)
        if self._compiled_pass:
            self._register_loss(name, output)
        else:  # (``_register_loss`` of an eager pass, inline: every step)
            rec.register_tensor(name, output, role="loss", node=LOSS)
        if self._declared_edges:
            for source in sources:
                rec.add_dependency(source, name, discovered=True)


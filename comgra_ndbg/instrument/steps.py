"""Step detection: where a training step and its forward passes (iterations) begin and end.

``StepDetection`` is a mixin of ``NeuralDbg`` and works on its state. The model's forward pre-hook opens
a step, or a new iteration of the open step; a step ends when the next training pass finds the parameters
changed (an optimizer stepped, or any in-place update) or, after a backward pass, the gradients cleared —
or exactly at the ``optimizer=``'s step post-hook. Forward passes without gradients, in inference mode or
in ``model.eval()`` are evaluation passes: they never open or split a step; ``evaluation`` records them.

Every optimizer's step is seen too (``patches``' global optimizer hooks). Right before an optimizer that
holds some of the model's parameters steps, their gradients are taken again where they changed since the
backward pass (clipping, a ``GradScaler``'s unscaling): the step records the gradient the optimizer used.
A step in which only other optimizers stepped and the model's parameters did not change was the model's
forward pass inside another model's update (a GAN's discriminator during the generator's step): it is
discarded, not written, so there is one recorded step per update of the model.
"""
from __future__ import annotations

import weakref
from collections.abc import Callable
from functools import partial
from operator import attrgetter, is_
from typing import Any

import torch
from torch import nn

from comgra_ndbg.instrument.compile_cache import evict_compiled_code
from comgra_ndbg.instrument.hooks import INPUT, from_compiled_code, input_names, tensor_leaves
from comgra_ndbg.recorder.grad_hook import in_compiled_autograd, on_gradient
from comgra_ndbg.recorder.parameters import optimizer_holds

__all__ = ["StepDetection", "LOSS", "gradient_fingerprint"]

LOSS = "loss"
_GRAD = attrgetter("grad")
_VERSION = attrgetter("_version")
_IS_NONE = partial(is_, None)


def gradient_fingerprint(grads: list[torch.Tensor | None]) -> tuple[tuple[int, ...], tuple[int | None, ...]]:
    """``(ids, versions)`` of gradients (the parameters' ``.grad``; ``id(None)`` and None where a parameter
    holds none): equal fingerprints mean the same gradient tensors, unchanged. Two C-level passes over the
    list, no tuple per parameter: this runs after every backward pass.

    >>> p = torch.nn.Parameter(torch.ones(2))
    >>> before = gradient_fingerprint([p.grad])
    >>> before[1]
    (None,)
    >>> (p * 2).sum().backward()
    >>> after = gradient_fingerprint([p.grad])
    >>> after != before, after == gradient_fingerprint([p.grad])
    (True, True)
    """
    if any(map(_IS_NONE, grads)):
        return tuple(map(id, grads)), tuple(None if g is None else g._version for g in grads)
    return tuple(map(id, grads)), tuple(map(_VERSION, grads))


class StepDetection:
    """Step and iteration boundaries of ``NeuralDbg`` (see the module docstring); not used on its own."""

    def _before_forward(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if (self._light_ready and self._light_pass(args, kwargs)) or self._closed or self._hooks.collecting_now:
            return
        self._hooks.capture = self._eval_capture = False  # also after a pass that raised before its end
        self._training_pass = (torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
                               and self._root.training)
        if self._training_pass:
            if self._eval_run_passes:
                self._safely("recording an evaluation run", self._eval_file)
            try:
                self._end_finished_step()
            except Exception as error:  # a recording problem must never break the training loop
                self.recorder._warn("ending the last step", error)
            self._run_pending()  # the user's step hooks, and a halt (outside the recorder's fault isolation)
            # the step that just ended lets this one be light
            if self._light_ready and self._light_pass(args, kwargs):
                return
            self._before_step()
            try:
                self._start_pass(args, kwargs)
            except Exception as error:  # a recording problem must never break the training loop
                self.recorder._warn("starting a forward pass", error)
        else:
            self._evaluation_passes += 1
            self._safely("starting an evaluation pass", self._eval_begin, args, kwargs)
        if self._hooks.capture:
            self._hooks.attach()
        else:
            self._hooks.detach()  # a pass that records nothing runs the modules without hooks
        if self._inv:
            try:
                self._inv_forward(self._training_pass, args, kwargs)
            except Exception as error:  # a recording problem must never break the training loop
                self.recorder._warn("checking loop invariants", error)

    def _end_finished_step(self) -> None:
        """Before a training pass: close the pass that raised before its end, and the step if it is over."""
        rec = self.recorder
        if self._pass_open:  # the last pass raised before its end
            rec.finish_iteration()
            self._pass_open = False
        if rec.current_step is not None and self._optimizer_stepped():
            own = self._own_steps
            hand = not own and self._parameter_version() != self._parameter_mark  # an update by hand ended it
            if hand:
                self._light_hand = True  # light steps compare every parameter's version from now on
            self._end_step()
            self._light_ready = self._light_possible and (own > 0 or hand) and self._light_after_full

    def _begin_pass(self, args: tuple, kwargs: dict) -> None:
        rec = self.recorder
        if rec.current_step is None:
            rec.start_step(self._next_step, self.step_type)
            self._next_step += 1
            self._parameter_mark = self._parameter_version()
            self._backward_seen = self._scaled_backward = False
            self._own_steps = self._foreign_steps = 0
            self._declared_edges = False
        self._iteration = rec.start_iteration()
        self._pass_open = True
        self._callback_queued = False
        self._compiled_pass = self._hidden_pass = False
        self._counts, self._outputs_seen, self._output_names, self._eager_names = {}, 0, [], []
        capture = rec.is_recording
        self._pass_args = (args, kwargs) if capture else None
        self._pass_inputs = input_names(args, kwargs) if capture else []
        self._input_names = []
        for name, tensor in self._pass_inputs:
            rec.register_tensor(name, tensor, role="input", node=INPUT)
            self._input_names.append(name)
        self._hooks.capture = capture

    def _optimizer_stepped(self) -> bool:
        """Whether the open step is over: parameters changed, or gradients were cleared after a backward (a
        model without trainable parameters: any earlier pass ends it); after ``no_step_end`` fired, any
        backward call (``stuck_steps``)."""
        if self._steps_by_pass:
            return True
        return self._stuck_ended(self._parameter_version() != self._parameter_mark
                                 or (self._backward_seen and self._grad_fingerprint() != self._grad_mark))

    def _parameter_version(self) -> int:
        native = self._native_marks  # (chosen once per instance: marks of one kind are compared)
        return native.version_sum(self._parameters) if native is not None else sum(map(_VERSION, self._parameters))

    def _grad_fingerprint(self) -> tuple:
        native = self._native_marks
        if native is not None:
            return native.grad_fingerprint(self._parameters)
        return gradient_fingerprint(list(map(_GRAD, self._parameters)))

    def _after_forward(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        if self._light and not self._eval_capture:
            if self._criterion is None:
                self._safely("finishing a forward pass", self._note_outputs, output)
            return
        if self._closed or self._hooks.collecting_now:
            return
        if self._eval_capture:
            self._safely("finishing an evaluation pass", self._eval_end, output)
        elif self._pass_open:
            try:
                self._end_pass(output)
            except Exception as error:  # a recording problem must never break the training loop
                self.recorder._warn("finishing a forward pass", error)

    def _end_pass(self, output: Any) -> None:
        rec = self.recorder
        try:
            if self._hooks.capture:
                stashed = self._hooks.drain() if self._hooks.stash else None
                if stashed:
                    self._register_compiled(stashed, output)
                else:
                    if not self._root_selected:
                        single = isinstance(output, torch.Tensor) and not from_compiled_code(output)
                        if single and not self._eval_capture:
                            self._on_output("", output)  # one tensor out (the usual model): a module output's route
                        else:
                            self._register_outputs("", list(tensor_leaves(output)), "output")
                    if self._needs_structure_pass():
                        self._declare_eager_structure()
                if not self._outputs_seen and self._hooks.installed > self._root_selected:
                    self._no_module_output(output)
            elif not self._hooks.attached and any(from_compiled_code(t) for _, t in tensor_leaves(output)):
                self._hooks.pin()  # compiled code guards on the hooks: keep them from now on
            if self._criterion is None:  # (each condition at the call: they hold at almost every step)
                self._note_outputs(output)
            if self._inv and not self._outside_checked:
                self._note_model_outputs(output)
            self._watch_backward(output)
        finally:
            self._hooks.capture = False
            self._pass_args, self._pass_inputs = None, []
            rec.finish_iteration()
            self._pass_open = False

    def _no_module_output(self, output: Any) -> None:
        """No chosen module reported its output in this pass. Compiled code traced without the hooks (the
        model, or another of its class, compiled earlier) is dropped, once, so the next pass traces them."""
        compiled = any(from_compiled_code(tensor) for _, tensor in tensor_leaves(output))
        if compiled and not self._evicted:
            self._evicted = evict_compiled_code(self._root) > 0
            if self._evicted:
                return
        self._warn_once("no output", "no chosen module reported its output in this forward pass" + (
            ": torch.compile ran code traced without NeuralDbg's hooks even after its cached code was dropped; "
            "call torch.compiler.reset() before NeuralDbg" if compiled else
            "; check modules= (patterns and classes of the modules the model calls)"))

    def _watch_backward(self, output: Any) -> None:
        """Have ``_after_backward`` called when a backward pass through the pass's output ends: by the C++
        part's watch (``native.BackwardWatch``), or by a Python hook where that part is not loaded. Under
        compiled autograd neither can (``_after_backward_call`` then stands in)."""
        watch = self._backward_watch
        for _, tensor in (("", output),) if isinstance(output, torch.Tensor) else tensor_leaves(output):
            if not tensor.requires_grad:
                continue
            if watch is not None:
                if watch.arm(tensor):
                    return
            elif tensor.grad_fn is not None:
                self._tensor_handles.append(on_gradient(tensor, self._on_backward))
                return

    def _on_backward(self, grad: torch.Tensor) -> None:
        if in_compiled_autograd():  # which queues no callback: ``_after_backward_call`` stands in
            self._backward_compiled = True
            return
        if not self._callback_queued and not self._closed:
            self._callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._after_backward)

    def _after_backward(self) -> None:
        self._callback_queued = False
        self._backward_seen = True
        self.recorder.take_parameter_gradients()
        self._gradients_read = True
        self._grad_mark = self._grad_fingerprint()
        self._stuck_calls += 1  # a step that no step end cuts short (``stuck_steps``): looked at past half its limit,
        # with the invariants on (off, nothing is read and the step stays open, as the loop leaves it)
        if self._inv and self._stuck_calls > self._stuck_look and not self._stuck_splitting:
            self._safely("checking whether the step ends", self._stuck_check)
        probe = self._light_probe
        if probe is None or probe.grad is None:  # light steps see a clearing of the gradients on this one
            self._light_probe = next((p for p in self._parameters if p.grad is not None), None)

    def _after_optimizer_step(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        if self._light:
            if not self._closed:
                self._safely("finishing a light step", self._end_light_step)
        elif not self._closed and self.recorder.current_step is not None and not self._pass_open:
            if self._stuck_splitting:  # a step that ends as steps end: the usual detection again
                self._stuck_resume()
            try:
                self._finish_step()
            except Exception as error:  # a recording problem must never break the training loop
                self.recorder._warn("finishing the step", error)
            self._light_ready = self._light_possible and self._light_after_full
            self._run_pending()

    # ---- every optimizer's step (patches' global hooks) ---------------------------------------------------
    def _owns(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether ``optimizer`` holds a parameter of the model (cached while its groups keep their sizes)."""
        return optimizer_holds(optimizer, lambda: self._parameter_ids, self._owners)

    def _before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self._inv and self._inv_outside:  # parameters the model's pass reached that it does not hold
            self._safely("checking loop invariants", self._inv_any_step, optimizer)
        if self._light:
            if self._light_sentinel and not self._closed:
                self._safely("recording parameter sentinels", self._light_sentinels, optimizer)
            if self._inv and not self._closed:
                self._safely("recording the learning rate", self._light_before_step, optimizer)
            return
        if self._closed or not self._owns(optimizer):
            return
        if self._eval_with_grad:  # passes with gradients in eval() mode, then an update: training, not evaluation
            self._eval_drop()
        if self._inv:
            try:
                self._inv_before_step(optimizer)
            except Exception as error:  # a recording problem must never break the training loop
                self.recorder._warn("checking loop invariants", error)
        if self.recorder.current_step is not None:
            self.recorder.refresh_parameter_gradients(force=self._scaled_backward)

    def _after_optimizer_step_anywhere(self, optimizer: torch.optim.Optimizer) -> None:
        if self._light:
            if optimizer is not self._light_optimizer:
                self._safely("looking at an optimizer step", self._light_foreign_step, optimizer)
        elif not self._closed and self.recorder.current_step is not None:
            if self._owns(optimizer):
                self._own_steps += 1
            else:
                self._foreign_steps += 1
                if self._inv:
                    self._safely("checking loop invariants", self._inv_foreign_step, optimizer)

    # ---- ending a step -------------------------------------------------------------------------------------
    def _end_step(self) -> None:
        """Finish the open step, or discard it when it was the model's pass inside another model's update (a
        model without trainable parameters has no update of its own: every training pass is a step)."""
        if (self._foreign_steps and not self._own_steps and not self._steps_by_pass
                and self._parameter_version() == self._parameter_mark):
            self._discard_step()
        else:
            self._finish_step()

    def _finish_step(self) -> None:
        rec = self.recorder
        if self._inv:
            try:
                self._inv_end_step()
            except Exception as error:  # a recording problem must never break the training loop
                self.recorder._warn("checking loop invariants", error)
        try:
            if self._pass_open:
                rec.finish_iteration()
                self._pass_open = False
            if self._losses:
                self._record_loss_kpi(rec)
            step = rec.current_step
            # sentinel steps follow loops of one training pass per step (accumulation, a GAN's passes: full)
            sentinel = rec.sentinel_eligible and self._iteration == 0
            self._light_after_full = (not rec.is_recording or sentinel) and not self._foreign_steps
            self._light_passes_max = 2 * (self._iteration + 1) + 1
            self._stuck_finished(max(self._stuck_passes_before + self._iteration + 1, self._stuck_calls))
            rec.finish_step()
            self._step_finished(step)
        finally:
            self._release_step()

    def _discard_step(self) -> None:
        try:
            self._pass_open = False
            self.recorder.discard_step()
            self._next_step -= 1
        finally:
            self._release_step()

    def _release_step(self) -> None:
        for handle in self._tensor_handles:
            handle.remove()
        if self._backward_watch is not None:
            self._backward_watch.reset()
        self._tensor_handles, self._taps, self._losses, self._loss_sources = [], {}, [], {}
        self._forget_hidden_calls()
        self._backward_seen = False
        self._own_steps = self._foreign_steps = 0
        self._stuck_release()
        self._inv_reset_step()


def watch_callback(owner: Any) -> Callable[[], None]:
    """What the C++ watch calls at the end of a watched backward pass: ``owner``'s ``_after_backward``, through
    a weak reference (the watch is the owner's and must not keep it alive)."""
    ref = weakref.ref(owner)

    def ended() -> None:
        dbg = ref()
        if dbg is not None and not dbg._closed:
            try:
                dbg._after_backward()
            except Exception as error:  # a recording problem must never break the training loop
                dbg.recorder._warn("finishing a backward pass", error)

    return ended

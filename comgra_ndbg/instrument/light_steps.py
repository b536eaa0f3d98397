"""Light steps: a training step the recording skips runs through NeuralDbg's hooks almost untouched.

A step that records nothing still enters every hook NeuralDbg installs. Done in full, such a step opens and
closes a Recorder step, watches the backward pass for its end, fingerprints the gradients and checks the
loop invariants: about a twentieth of a small model's step. A *light* step instead only counts its forward
passes, keeps each pass's loss value and the learning rates the optimizer steps with, and ends where its
optimizer's step says it does: at the ``optimizer=``'s step post-hook, or without ``optimizer=`` at the
next training pass after an optimizer holding the model's parameters stepped (as a full step ends then).
Its ``loss`` and ``lr/<group>`` KPIs go to the Recorder in one call (``Recorder.skip_step``, which hands
them to the writer many steps at a time); every other hook returns at once.

A step goes light only when nothing could want more of it:

- the Recorder would record nothing at it (no summary, snapshot, forced or flight-recorder step, no
  profiler; ``Recorder.would_skip``), and no breakpoint, step hook or pending user code is set;
- the step before ended with an optimizer step of the model's own or an update by hand (no other model's
  optimizer stepped in it, as a GAN's does: the full path tells such steps apart) and recorded nothing;
- it is not among the first :data:`LIGHT_AFTER` steps.

So the loop invariants are checked at every step of the first :data:`LIGHT_AFTER` steps, where loop mistakes
show, and then at every recorded step *and the one after it*, a pair of consecutive steps that the checks
comparing one step with the next (an uncleared gradient, a parameter that got no gradient) need. What the
checks carried from step to step is reset after light steps (``_inv_after_gap``): a comparison never spans
steps it did not see. The most common of those mistakes, a ``zero_grad()`` dropped mid-run, is also watched
at every step on one probe parameter (``_watch_probe``): a loop moves its gradient alike across every step
boundary (a new tensor, or the same number of in-place changes); a boundary it crosses with less (the same
tensor where it was always a new one, one in-place change fewer) sends the next :data:`CARRIED_FULL` steps to
the full path, whose invariants then report the stale gradient dated from that step.

A full step also ends, with no optimizer step of the model's, where a training pass finds the parameters
changed or the gradients changed since the last backward call. A light step follows it on one *probe*
parameter (one that held a gradient after the last full step): at each of its later training passes it
compares the probe's version with the one at its start, and the probe's gradient (tensor and version) with
what the last backward call left (``patches`` calls ``_after_backward_call`` when it returns). Parameters
changed by hand (a loop with no optimizer, SAM's perturbation, an inner step, L-BFGS between closure calls)
end the step, and the next may be light, as on the full path; from then on every light step compares the
sum of all parameters' versions instead (``_light_hand``: two C-level sums a step), while a loop that never
updates by hand pays a few attribute reads per light step and backward call, none per parameter. Gradients
cleared or changed after a backward call (``zero_grad``, also in place, around an optimizer step a
``GradScaler`` skipped) end it and hand the next pass to the full path, as another model's optimizer step
does; the full path's invariants report what went wrong. A light step that runs more than twice as many
training passes as the last full step (uneven accumulation, a loop that stopped stepping and clearing) is
not ended: the full path goes on with it under its number (``_light_to_full``), counting its backward calls
on (``stuck_steps``: a step that never ends is reported and split pass by pass). Not followed: a change by
hand between two passes of one step, to parameters other than the probe, that starts after the first
:data:`LIGHT_AFTER` steps and clears no gradient (the full path would split the step there).
"""
from __future__ import annotations

import math
import weakref
from typing import Any

import torch

from comgra_ndbg.instrument.hooks import input_names
from comgra_ndbg.instrument.loop_rules import optimizer_setting
from comgra_ndbg.instrument.loss import loss_value, step_loss

__all__ = ["CARRIED_FULL", "LIGHT_AFTER", "LightSteps"]

LIGHT_AFTER = 32
"""Steps checked in full from the first before a step may go light (loop mistakes show in the first steps;
the longest run an invariant counts is ``loop_rules.UNUSED_STEPS``)."""

CARRIED_FULL = 3
"""Full steps after a light step whose gradient was not cleared: one to note the gradients its optimizer step
consumes, one to see them grown in place (and start watching their accumulation where that is ambiguous),
one to see the accumulation land on them."""

_LOSS = "loss"
_OPEN, _OVER, _FULL = 0, 1, 2  # a light step goes on; ended, as steps end; ended, the next step is full


class LightSteps:
    """Light steps of ``NeuralDbg`` (see the module docstring); not used on its own."""

    def _init_light_steps(self, optimizer: torch.optim.Optimizer | None) -> None:
        self._light = False  # a light step is open
        self._light_ready = False  # the next training pass may open a light step (or one is open)
        self._light_possible = not self._steps_by_pass
        self._light_after_full = False  # the last full step recorded nothing and no other model's optimizer stepped
        self._light_optimizer = optimizer
        self._light_step = -1
        self._light_end = _OPEN  # what the optimizers that stepped in the light step say about its end
        self._light_passes = 0  # training passes of the open light step
        self._light_passes_max = 3  # ... at most: twice those of the last full step, and one
        self._light_backwards = False  # a backward call returned in the open light step
        self._light_backward_calls = 0  # ... how many (the full path carries them on, ``stuck_steps``)
        self._light_probe: torch.Tensor | None = None  # a parameter that held a gradient after the last full step
        self._light_grads: tuple[weakref.ref, int] | None = None  # its gradient, version after the last backward
        self._probe_last: tuple[weakref.ref, int] | None = None  # the probe's gradient and version at the last
        self._probe_step: int | None = None  # ... backward call's return, in this step
        self._probe_least = None  # the least its gradient moved across a step boundary (``_watch_probe``)
        self._probe_before: tuple[torch.Tensor, int] | None = None  # its gradient and version as a backward call began
        self._full_until = 0  # the steps before this one take the full path (``_carried_over``)
        self._light_version = 0  # the parameters' version when the light step opened (``_light_version_now``)
        self._light_hand = False  # the loop changed parameters by hand where no optimizer of the model's stepped
        self._light_carried = False  # the full path goes on with the open light step (``_light_to_full``)
        self._light_lrs: tuple[Any, list[tuple[int, dict]]] | None = None  # (optimizer, its lr KPIs) till a full step
        self._light_kpis: list[tuple[int, float]] = []  # the open light step's learning rates
        self._light_steps = 0  # light steps so far
        self._light_sentinel = False  # the open light step is a sentinel step (``Recorder.sentinel_step``)
        self._light_rows: Any = None  # ... its parameters' rows, once taken at an optimizer's step
        self._light_taken = False  # ... whether they were
        self._inv_gap = False  # light steps ran since the invariants last looked at a step

    def _may_go_light(self) -> bool:
        """Whether the step about to open can be light (see the module docstring)."""
        callbacks = self._callbacks
        return (self._next_step - self._first_step >= LIGHT_AFTER and not self._hooks.collecting_now
                and not self._pending and not self._layer_handles and not callbacks["before_step"]
                and not callbacks["after_step"] and not callbacks["after_layer"]
                and self._next_step >= self._full_until and self._light_kind())

    def _light_kind(self) -> bool:
        """Whether the Recorder lets the next step be light: it would record nothing, or it may be a sentinel
        step (which then records the parameters' values and gradients at its optimizer's step)."""
        rec = self.recorder
        self._light_sentinel = False
        if rec.would_skip(self._next_step, self.step_type):
            return True
        self._light_sentinel = rec.sentinel_step(self._next_step, self.step_type)
        if self._light_sentinel:
            rec.open_sentinel(self._next_step)
        return self._light_sentinel

    def _light_pass(self, args: tuple = (), kwargs: dict | None = None) -> bool:
        """The model's forward pre-hook while light steps may run: True when this pass is a training pass of
        a light step (the one open, or a new one); False for an evaluation pass, for a step that must be
        recorded or checked, after ending the open light step where a full step would end (an optimizer
        holding the model's parameters stepped; parameters changed by hand; the gradients changed after a
        backward call) or where another model's optimizer stepped, and for the pass at which the full path
        goes on with the open light step (more than twice the passes of the last full step). The full path
        takes every pass this returns False for."""
        if not (torch.is_grad_enabled() and not torch.is_inference_mode_enabled() and self._root.training):
            if self._light and self._light_sentinel and torch.is_grad_enabled() and not self._root.training:
                # a pass in eval() mode that builds a graph (an evaluation with gradients, or eval() left on
                # while training): the full path, which tells the two apart, takes it from here
                self._safely("ending a light step", self._end_light_step)
                self._light_ready = False
            return False
        if self._light:
            self._light_passes += 1
            try:
                changed = self._light_end != _OPEN or self._light_changed()
            except Exception as error:  # ended: the full path takes the next step
                self.recorder._warn("following a light step", error)
                changed = True
            if not changed:
                if self._light_passes <= self._light_passes_max:
                    self._training_pass = True
                    return True
                self._light_to_full()  # the full path goes on with this step, under its number
                return False
            again = self._light_end == _OVER  # over as steps end: the next one may be light too
            self._safely("ending a light step", self._end_light_step)
            if not again:
                self._light_ready = False
                return False
        try:
            if self._eval_run_passes:  # the evaluation passes since the last step, as the full path files them
                self._eval_file()
            if not self._may_go_light():
                return False
        except Exception as error:  # the full path then records the step as before
            self.recorder._warn("starting a light step", error)
            return False
        self._light = self._training_pass = True
        self._light_step = self._next_step
        self._next_step += 1
        self._light_end = _OPEN
        self._light_passes = 1
        self._light_backwards = False
        self._light_backward_calls = 0
        self._light_grads = None
        self._light_rows, self._light_taken = None, False
        if self._light_sentinel:
            self._safely("recording the model's inputs", self.recorder.sentinel_inputs,
                         input_names(args, kwargs or {}))
        self._light_version = self._light_version_now()
        self._hooks.capture = self._eval_capture = False
        self._hooks.detach()
        if self._inv:
            self._inv_eval_run = 0  # evaluation passes in train() mode are counted between training passes
        return True

    def _light_version_now(self) -> int:
        """The version a light step compares from pass to pass: the probe parameter's (one attribute read),
        or the sum over every parameter once the loop was seen changing parameters by hand (or no parameter
        held a gradient yet)."""
        probe = self._light_probe
        if self._light_hand or probe is None:
            return self._parameter_version()
        return probe._version

    def _light_changed(self) -> bool:
        """Whether the open light step is over where a full step ends without an optimizer step of the
        model's: its parameters changed by hand (from then on every light step compares all of them), or the
        gradients changed after the last backward call returned (cleared, zeroed in place)."""
        if self._light_version_now() != self._light_version:
            self._light_hand = True
            self._light_end = _OVER  # ended by an update by hand: the next step may be light, as on the full path
            return True
        if not self._light_backwards:
            return False
        mark = self._light_grads
        if mark is None:  # the probe held no gradient after the backward call: every gradient was fingerprinted
            return self._grad_fingerprint() != self._grad_mark
        grad = self._light_probe.grad
        return grad is None or mark[0]() is not grad or grad._version != mark[1]

    def _after_backward_call(self) -> None:
        """``patches``' call after each backward call returned: in a light step, the probe's gradient as the
        backward pass left it (a full step fingerprints every gradient there); in a full step, the parameters'
        gradients of a backward pass that never reached the model's output (no engine callback of ours read
        them: a penalty on the weights alone, a loss on an output other than the one watched), whose fingerprint
        is then the step's latest."""
        self.recorder.gradient_scale = None  # (set for the backward call that just returned)
        watch = self._backward_watch
        compiled = watch.take_compiled() if watch is not None else self._backward_compiled
        self._backward_compiled = False
        if compiled and not self._gradients_read and not self._light and self.recorder.current_step is not None:
            self._after_backward()  # compiled autograd ran the pass, calling no watch of ours at its end: here
        read, self._gradients_read = self._gradients_read, False
        probe = self._light_probe
        grad = None if probe is None else probe.grad
        mark = None if grad is None else (weakref.ref(grad), grad._version)
        if not self._light:
            if not read and self.recorder.current_step is not None:
                self.recorder.take_parameter_gradients()
                if self._backward_seen:  # a later backward call of the step (an auxiliary loss on another output)
                    self._grad_mark = self._grad_fingerprint()
            self._watch_probe(self.recorder.current_step, mark)
            return
        self._light_backwards = True
        self._light_backward_calls += 1
        self._watch_probe(self._light_step, mark)
        self._light_grads = mark
        if mark is None:
            self._grad_mark = self._grad_fingerprint()

    def _watch_probe(self, step: int | None, mark: tuple[weakref.ref, int] | None) -> None:
        """At a backward call's return: at the first of a step, how far the probe's gradient moved since the last
        backward call of the step before — a new tensor (cleared to None between) or its version's move (zeroed
        in place, scaled, accumulated onto). A loop moves it alike at every step boundary; one that moves it
        less than ever before (the same tensor where it was always a new one, one in-place change fewer) did
        not clear it: the gradients were carried over (``_carried_over``). A backward call that did not reach the
        probe (another model's) is no boundary. ``mark``: the probe's gradient now (a weak reference) and its
        version, or None. A few attribute reads per backward call."""
        before, self._probe_before = self._probe_before, None
        if step is None or mark is None:
            return  # a backward call outside the model's steps, or the probe holds no gradient
        grad, version_now = mark[0](), mark[1]
        if before is not None and before[0] is grad and before[1] == version_now:
            return  # a backward call that did not reach the probe (another model's)
        if self._probe_last is not None and step != self._probe_step:
            last, version = self._probe_last
            moved = version_now - version if last() is grad else math.inf
            least = self._probe_least
            if least is not None and moved < least:
                self._carried_over(step)
            self._probe_least = moved if least is None else min(least, moved)
        self._probe_step = step
        self._probe_last = mark

    def _probe_before_backward(self) -> None:
        """``patches``' call before each backward call: the probe's gradient as it began (held until the call
        returns, so that ``_watch_probe`` tells a call that reached the probe from one that did not)."""
        probe = self._light_probe
        grad = None if probe is None else probe.grad
        self._probe_before = None if grad is None else (grad, grad._version)

    def _carried_over(self, step: int) -> None:
        """Step ``step``'s gradient held the step before's (``_watch_probe``): the next :data:`CARRIED_FULL`
        steps take the full path, whose invariants need that many consecutive steps (after light steps, or
        where they could not yet tell an uncleared gradient from one zeroed in place) to report it, dated
        from ``step``."""
        self._full_until = step + 1 + CARRIED_FULL
        if self._inv:
            self._inv_carried_from = step

    def _light_to_full(self) -> None:
        """The open light step runs more than twice the training passes of the last full step (uneven
        accumulation, or a loop that stopped stepping its optimizer and clearing the gradients): the full
        path opens a step with the light step's number at this pass and goes on with it, the losses of the
        passes so far and their backward calls included, so the step ends where a full step would and the
        invariants look at the rest of it."""
        self._light = self._light_ready = False
        self._next_step = self._light_step
        self._light_carried = True
        self._inv_gap = self._inv  # the invariants did not see the passes so far

    def _start_pass(self, args: tuple, kwargs: dict) -> None:
        """A training pass on the full path: a step it opens is not light, and after light steps the
        invariants' step-to-step memory starts again."""
        carried = False
        if self.recorder.current_step is None:
            self._light_ready = False
            self._light_lrs = None
            carried, self._light_carried = self._light_carried, False
            if self._inv_gap:
                self._inv_gap = False
                self._inv_after_gap()
        self._begin_pass(args, kwargs)
        if carried:
            if self._light_backwards:  # as the full step would have seen the backward calls so far
                self._backward_seen = True
                self._grad_mark = self._grad_fingerprint()
            self._stuck_carry(self._light_passes - 1, self._light_backward_calls)
            for kpi, value in self._light_kpis:
                self.recorder._record_known_kpi(kpi, value)
            self._light_kpis = []

    def _light_loss(self, output: torch.Tensor) -> None:
        """The criterion's forward hook in a light step: the pass's loss value."""
        if torch.is_grad_enabled():
            self._losses.append(loss_value(output))

    def _end_light_step(self) -> None:
        """The light step is over: its KPIs go to the Recorder in one call, and the next step may be light."""
        self._light = False
        kpis: list[tuple[int, float | torch.Tensor]] = []
        if self._losses:
            if self._loss_kpi is None:
                self._loss_kpi = self.recorder.catalog.kpi_id(_LOSS)
            kpis.append((self._loss_kpi, step_loss(self._losses)))
            self._losses = []
        if self._light_kpis:
            kpis += self._light_kpis
            self._light_kpis = []
        if self._loss_sources:
            self._loss_sources = {}
        rows = None
        if self._light_sentinel:
            rows = self._light_rows if self._light_taken else self.recorder.sentinel_rows(self._light_step)
            self._light_rows, self._light_taken = None, False
        self.recorder.skip_step(self._light_step, self.step_type, kpis, rows)
        self._light_steps += 1
        self._inv_gap = self._inv
        self._finished = self._light_step

    # ---- the loop invariants around light steps -----------------------------------------------------------
    def _inv_after_gap(self) -> None:
        """The first full step after light steps: what the invariants carried from one step to the next (the
        gradient each optimizer step consumed, runs of steps counted) describes a step long past, so they
        start again as at the first step."""
        count = len(self._inv_names)
        self._inv_consumed.forget()
        self._inv_stale = [False] * count
        self._inv_after = [None] * count
        self._inv_unused = [0] * count
        self._inv_unused_counting = False
        self._inv_no_step = self._inv_no_update = self._inv_foreign_run = 0
        self._inv_no_step_onset = self._inv_no_update_onset = self._inv_foreign_onset = -1
        self._inv_eval_grad_passes = self._inv_train_passes = self._inv_eval_run = 0

    def _inv_light_lrs(self, optimizer: torch.optim.Optimizer) -> list[tuple[int, dict]]:
        """``(KPI id, param group)`` of each of ``optimizer``'s groups whose learning rate (a number) a full
        step recorded as ``lr/<group>``: light steps record it too (the ``optimizer=``'s kept until the next
        full step)."""
        cached = self._inv_optimizers.get(optimizer)
        if cached is None:
            return []
        groups = optimizer.param_groups
        return [(kpi, groups[g]) for g, _, _, _, kpi in cached[3]
                if kpi is not None and g < len(groups) and isinstance(groups[g].get("lr"), (int, float))]

    def _light_before_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Any optimizer's step pre-hook in a light step: the learning rates of one that holds the model's
        parameters, read where a full step reads them."""
        cached = self._light_lrs
        if cached is None or cached[0] is not optimizer:
            if optimizer is not self._light_optimizer and not self._owns(optimizer):
                return
            cached = self._light_lrs = (optimizer, self._inv_light_lrs(optimizer))
        self._light_kpis += [(kpi, group["lr"]) for kpi, group in cached[1]]
        known = self._inv_optimizers.get(optimizer) if self._inv else None
        if known is not None:  # a param group edited between full steps (momentum set to 1): dated where it is used
            low = self._inv_low_lr
            for g, group in enumerate(optimizer.param_groups):
                setting = optimizer_setting(group)
                if setting is not None:
                    self._inv_optimizer_setting(known[0], g, group, setting, self._light_step)
                below = low.get((known[0], g), 0)
                if below >= 0:
                    self._inv_lr_below_base(known[0], g, group, below, self._light_step)

    def _light_sentinels(self, optimizer: torch.optim.Optimizer) -> None:
        """Any optimizer's step pre-hook in a sentinel step: the first that holds the model's parameters
        takes their values and gradients, as they are when it updates them."""
        if not self._light_taken and (optimizer is self._light_optimizer or self._owns(optimizer)):
            self._light_taken = True
            self._light_rows = self.recorder.sentinel_rows(self._light_step)

    def _light_foreign_step(self, optimizer: torch.optim.Optimizer) -> None:
        """The step post-hook of an optimizer other than ``optimizer=`` in a light step: one holding the
        model's parameters ends the step at the next training pass (which may open another light step);
        one holding none of them (another model's, as in a GAN) sends the next pass to the full path, which
        tells such steps apart."""
        if not self._owns(optimizer):
            self._light_end = _FULL
        elif self._light_end == _OPEN:
            self._light_end = _OVER

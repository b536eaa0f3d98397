"""Steps that never end: training passes with backward calls where no step ends, and how they are recorded.

A step ends at an optimizer step of the model's, an update by hand, or gradients cleared after a backward
call (:mod:`~comgra_ndbg.instrument.steps`). A loop that does none of these — ``optimizer.step()`` and
``zero_grad()`` both forgotten, or the step behind a condition that is never true — piles every training
pass into one open step: the parameters never change, the gradients add up without bound, and the recording
holds one endless step. A step in which any optimizer stepped is left to the other invariants (one of the
model's that changed nothing: ``not_in_optimizer``; only another model's: ``foreign_parameters``, or a GAN's
step). ``StuckSteps`` counts the backward calls of the open step (one integer per call on
the full path, and per call in a light step, which the full path carries on). Past half of
:func:`~comgra_ndbg.instrument.loop_rules.stuck_limit` it reads one parameter's gradient norm, once per such
step; past the limit — more backward calls than any step seen so far could explain — it reports the loop
invariant ``no_step_end`` once, with the passes, the backward calls and how that gradient grew, and from
then on ends the open step at the next training pass after a backward call: each pass is a step of its own,
so the recording shows the gradients growing and the parameters frozen step after step. A step that ends
as steps end (the parameters changed, the gradients cleared) goes back to the usual detection.

At ``close()`` a still-open step that ran more backward calls than the limit with the allowance for a
first step left out (the run is over: the step will not end) is reported too, dated to its step; a loop
that stopped stepping only for the last few passes stays within the limit and is not.

The split is part of the invariant: with ``invariants=False`` nothing is checked, no gradient norm is read
and no step is split, so such a loop is recorded as the usual step detection leaves it: all its passes in
one open step, never split behind the user's back by a check they switched off.
"""
from __future__ import annotations

import weakref

import torch

from comgra_ndbg.instrument import loop_rules as rules
from comgra_ndbg.instrument.loop_rules import Violation

__all__ = ["StuckSteps"]


class StuckSteps:
    """Counting and splitting steps that do not end (see the module docstring); a mixin of ``NeuralDbg``."""

    def _init_stuck_steps(self) -> None:
        self._stuck_calls = 0  # backward calls through the model in the open step
        self._stuck_passes_before = 0  # training passes of a light step the open step goes on with
        self._stuck_most = 0  # the most passes (or backward calls) a finished step had (0: none finished yet)
        self._stuck_limit = rules.stuck_limit(0)
        self._stuck_look = self._stuck_limit // 2  # past this many calls, each call looks at the step
        self._stuck_sample: tuple[int, float, weakref.ref, int, int] | None = None  # calls, norm, grad, version, i
        self._stuck_splitting = False  # the invariant fired: each training pass with a backward call is a step
        self._stuck_fired = (0, 0)  # (step, backward calls) where it last fired

    def _stuck_ended(self, ended: bool) -> bool:
        """Whether the open step is over at this training pass: ``ended`` as steps end (which goes back to the
        usual detection), or, once the invariant fired, after any backward call."""
        if ended:
            if self._stuck_splitting:
                self._stuck_resume()
            return True
        return self._stuck_splitting and self._backward_seen

    def _stuck_resume(self) -> None:
        """The open step ends as steps end after the invariant fired: the usual detection again, and the run
        of passes since the stall began counts as one step for the limit (at least one backward call per
        split step), so an accumulation longer than any before is reported once, not split again."""
        self._stuck_splitting = False
        step, calls = self._stuck_fired
        current = self.recorder.current_step
        self._stuck_finished(calls + (current - step if current is not None else 0))

    def _stuck_finished(self, length: int) -> None:
        """A step was finished with ``length`` training passes (or backward calls, where it made more): the
        limit follows the longest step so far (the steps split after the invariant fired do not count)."""
        if not self._stuck_splitting and length > self._stuck_most:
            self._stuck_most = length
            self._stuck_limit = rules.stuck_limit(length)
            self._stuck_look = self._stuck_limit // 2

    def _stuck_release(self) -> None:
        """The open step was finished or discarded: the next one counts from 0."""
        self._stuck_calls = self._stuck_passes_before = 0
        self._stuck_sample = None

    def _stuck_carry(self, passes: int, calls: int) -> None:
        """The full path goes on with a light step that ran ``passes`` training passes and ``calls`` backward
        calls so far: they count as the open step's."""
        self._stuck_passes_before = passes
        self._stuck_calls = calls

    def _stuck_check(self) -> None:
        """A backward call past half the limit: read the probe's gradient norm (once a step), and past the
        limit report the invariant and split the steps from here on."""
        calls = self._stuck_calls
        if self._own_steps or self._foreign_steps or self._parameter_version() != self._parameter_mark:
            return  # an optimizer stepped (one of the model's that changed nothing is ``not_in_optimizer``;
            # another model's, ``foreign_parameters``), or parameters changed: the next pass ends the step
        if self._stuck_sample is None:
            self._stuck_sample = self._stuck_probe(calls)
        if calls > self._stuck_limit:
            now = self._stuck_probe(calls)
            if now is None:  # no parameter holds a gradient: backward calls for inputs only, not a training step
                return
            self._stuck_splitting = True
            self._stuck_fired = (self.recorder.current_step, calls)
            if self._inv:
                self._stuck_report(calls, self._stuck_limit, now, at_close=False)

    def _stuck_probe(self, calls: int) -> tuple[int, float, weakref.ref, int, int] | None:
        """``(calls, gradient norm, gradient, its version, parameter index)`` of the first parameter holding a
        gradient: one norm of one tensor, read at most twice a long step."""
        for i, parameter in enumerate(self._parameters):
            grad = parameter.grad
            if grad is not None:
                with torch.no_grad():
                    norm = float(torch.linalg.vector_norm(grad.detach().float()))
                return calls, norm, weakref.ref(grad), grad._version, i
        return None

    def _stuck_at_close(self) -> None:
        """``close()`` with a step open: the run is over, so the allowance for a first step is left out."""
        if self._stuck_splitting or not self._backward_seen or self._own_steps or self._foreign_steps:
            return
        limit = rules.stuck_limit(max(self._stuck_most, 1))
        now = None
        if self._stuck_calls > limit and self._parameter_version() == self._parameter_mark:
            now = self._stuck_probe(self._stuck_calls)
        if now is not None:
            self._stuck_report(self._stuck_calls, limit, now, at_close=True)

    def _stuck_report(self, calls: int, limit: int, now: tuple[int, float, weakref.ref, int, int], *,
                      at_close: bool) -> None:
        step = self.recorder.current_step
        passes = self._stuck_passes_before + self._iteration + 1
        before = self._stuck_sample
        evidence: dict = {"passes": passes, "backward_calls": calls, "limit": limit,
                          "longest_step": self._stuck_most, "parameters_changed": False,
                          "at_close": at_close}
        growth = ""
        name = self._inv_names[now[4]]
        evidence.update(probe=name, grad_norm=now[1])
        if before is not None and before[4] == now[4] and before[0] < calls:
            same = before[2]() is now[2]()
            accumulated = same and now[3] - before[3] <= calls - before[0]
            ratio = now[1] / before[1] if before[1] > 0 else None
            evidence.update(grad_norm_before=before[1], calls_between=calls - before[0],
                            grad_norm_growth=ratio, gradients_cleared=not accumulated)
            if not accumulated:
                growth = "; the gradients are cleared between the passes, after the forward pass"
            elif ratio is not None:
                growth = (f"; the gradient of '{name}' grew {ratio:.3g}x over the last {calls - before[0]} "
                          f"backward calls")
        self._inv_report(Violation(
            "no_step_end", step, "optimizer.step()",
            f"no training step ends: {calls} backward calls over {passes} forward passes from step {step} on "
            f"changed no parameter (no optimizer.step() of the model's, no update by hand) and cleared no "
            f"gradient after a backward call, more than the {limit} the longest step so far explains{growth}"
            + ("; the run closed with this step open" if at_close else
               "; from here on each training pass is recorded as a step of its own"),
            evidence=evidence))

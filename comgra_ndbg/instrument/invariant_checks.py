"""The loop invariants that are decided at the end of a step from counts kept over several steps: no
``optimizer.step()``, parameters with gradients outside every optimizer, an optimizer holding parameters that
are not the model's, steps that change nothing because every learning rate is 0, and the trainable share of
the model's parameters.

``StepEndChecks`` is a mixin of :class:`~comgra_ndbg.instrument.invariants.LoopInvariants` and works on the
state that class gathers (``_inv_*``); it reads no tensor element. Each check reports through
``_inv_report`` once its run of steps reaches the length ``loop_rules`` sets.
"""
from __future__ import annotations

from itertools import compress
from operator import attrgetter

from comgra_ndbg.instrument import loop_rules as rules
from comgra_ndbg.instrument import patches
from comgra_ndbg.instrument.loop_rules import INFO, Violation, percent

__all__ = ["StepEndChecks"]

_REQUIRES_GRAD = attrgetter("requires_grad")


class StepEndChecks:
    """End-of-step loop-invariant checks (see the module docstring); not used on its own."""

    def _inv_check_no_step(self, step: int) -> None:
        if self._stuck_splitting:  # a step split by ``no_step_end``: nothing cleared the gradients
            self._inv_no_step = 0
            return
        skipped = (not self._inv_held and not self._own_steps and not self._foreign_steps
                   and patches.scale_calls() == self._inv_scaled
                   and self._parameter_version() == self._parameter_mark)
        if not skipped:
            self._inv_no_step = 0
            return
        if self._inv_no_step == 0:
            self._inv_no_step_onset = step
        self._inv_no_step += 1
        if self._inv_no_step == rules.NO_STEP_STEPS:
            onset = self._inv_no_step_onset
            self._inv_report(Violation(
                "no_optimizer_step", onset, "optimizer.step()",
                f"optimizer.step() is not called: from step {onset} on, {rules.NO_STEP_STEPS} steps in a row computed "
                f"gradients and cleared them, and no parameter changed",
                evidence={"steps": rules.NO_STEP_STEPS}))

    def _inv_check_omitted(self, step: int, received: list[bool]) -> None:
        if len(received) in map(len, self._inv_held):  # an optimizer that stepped holds them all
            return
        held = frozenset().union(*self._inv_held)
        missing = [i for i, got in enumerate(received) if got and i not in held
                   and ("not_in_optimizer", self._inv_nodes[i]) not in self._inv_seen]
        if not missing:
            return
        with_grad = sum(self._inv_numel[i] for i, got in enumerate(received) if got)
        share = sum(self._inv_numel[i] for i in missing) / max(with_grad, 1)
        names = [self._inv_names[i] for i in missing]
        nodes = list(dict.fromkeys(self._inv_nodes[i] for i in missing))
        for node in nodes[1:]:
            self._inv_seen.add(("not_in_optimizer", node))
        self._inv_report(rules.omission(step, names, nodes, share, first_step=step == self._first_step,
                                        norms_only=all(self._inv_norm[i] for i in missing),
                                        trainable_share=1.0 if self._inv_share is None else self._inv_share))

    def _inv_check_foreign(self, step: int) -> None:
        foreign = self._inv_foreign
        if not foreign:
            self._inv_foreign_run = 0
            return
        if self._inv_foreign_run == 0:
            self._inv_foreign_onset = step
        self._inv_foreign_run += 1
        if self._inv_foreign_run == rules.NO_STEP_STEPS:
            onset = self._inv_foreign_onset
            shapes = [list(p.shape) for p in foreign[:5]]
            self._inv_report(Violation(
                "foreign_parameters", onset, "param_groups",
                f"the optimizer holds {len(foreign)} parameter(s) that are not the model's and get no gradient (shapes "
                f"{shapes}): the optimizer was built before a layer was replaced, or for another copy of the model",
                evidence={"num_parameters": len(foreign), "shapes": shapes}))

    def _inv_check_no_update(self, step: int) -> None:
        if self._inv_live or not self._inv_zero_lr:
            self._inv_no_update = 0
            return
        if self._inv_no_update == 0:
            self._inv_no_update_onset = step
        self._inv_no_update += 1
        if self._inv_no_update == rules.NO_UPDATE_STEPS:
            onset = self._inv_no_update_onset
            self._inv_report(Violation(
                "no_update", onset, "learning rate",
                f"optimizer.step() changes no parameter from step {onset} on: every parameter with a gradient is in a "
                f"param group whose learning rate is 0",
                evidence={"steps": rules.NO_UPDATE_STEPS, "parameters_with_gradients": self._inv_zero_lr}))

    def _inv_check_share(self, step: int) -> None:
        flags = list(map(_REQUIRES_GRAD, self._inv_all_params))
        if flags == self._inv_flags:  # the usual step: no flag changed, nothing to add up
            return
        self._inv_flags = flags
        trainable, total = sum(compress(self._inv_all_numel, flags)), self._inv_total
        if trainable == self._inv_trainable_before:
            return
        self._inv_trainable_before = trainable
        norms_only = all(compress(self._inv_all_norm, flags))
        share = trainable / total if total else 1.0
        before = self._inv_share
        self._inv_share = share
        if before is None:
            if share < 1.0:
                frozen = total - trainable
                self._inv_report(Violation(
                    "trainable_share", step, "model",
                    f"{percent(share)} of the model's parameter elements are trainable from the first step on "
                    f"({frozen} of {total} frozen with requires_grad=False)", INFO,
                    {"share": share, "trainable": trainable, "total": total, "at_start": True}))
            return
        severity = rules.share_collapse(before, share, only_norms=norms_only and trainable > 0)
        if severity is not None:
            self._inv_seen.discard(("trainable_share", "model"))
            self._inv_report(Violation(
                "trainable_share", step, "model",
                f"the trainable share of the model's parameters fell from {percent(before)} to {percent(share)} at "
                f"step {step}" + (" (only normalisation parameters still train)" if norms_only and trainable else ""),
                severity, {"share": share, "before": before, "trainable": trainable, "total": total,
                           "only_norms": bool(norms_only and trainable), "at_start": False}))

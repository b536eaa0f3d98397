"""Loop invariants: mistakes of the training loop seen directly, at the step boundaries NeuralDbg already has.

``LoopInvariants`` is a mixin of ``NeuralDbg`` and works on its state. It reads plain facts where the other
mixins already stop — the optimizer's step pre-hook (which parameters it holds, their gradients, the
learning rate of each param group), the first ``backward()`` call of a step, the end of a step, and the
model's forward pre-hook (its mode, gradients on or off, the batch size) — and asks
:mod:`~comgra_ndbg.instrument.loop_rules` whether an invariant broke. A violation is written once per
(invariant, subject) into the recording's log (category ``invariant``); the analysis turns it into a
hypothesis that names the cause and the remedy (:mod:`comgra_ndbg.analysis.invariants`).

What it costs: attribute reads, a dictionary lookup and a weak reference per parameter per optimizer step,
one read of every parameter's gradient at the first backward call of a step (a fingerprint,
``steps.gradient_fingerprint``, only where some parameter still holds one), a ``requires_grad`` read per parameter per step (summed only when one
changed), and one KPI ``lr/<group>`` per param group per step. No tensor element is
read. Only where the cheap facts cannot tell an uncleared gradient from one zeroed in place (the same
gradient tensor grown since the last optimizer step, which ``zero_grad(set_to_none=False)`` also gives) a
post-accumulate-grad hook is added to those parameters, to see whether anything cleared the gradient
between the step and the next accumulation. Nothing here changes a tensor, a flag or a random number
generator; every hook it adds is removed by ``close()``.
"""
from __future__ import annotations

import weakref
from functools import partial
from operator import attrgetter, is_, is_not, ne, or_
from typing import Any

import torch
from torch import nn

from comgra_ndbg.instrument import loop_rules as rules
from comgra_ndbg.instrument import patches
from comgra_ndbg.instrument.consumed import consumed_gradients
from comgra_ndbg.instrument.hooks import node_name, tensor_leaves
from comgra_ndbg.instrument.invariant_checks import StepEndChecks
from comgra_ndbg.instrument.light_steps import CARRIED_FULL
from comgra_ndbg.instrument.loop_rules import FAILURE, INFO, Violation, names_text
from comgra_ndbg.instrument.train_dry_run import pending_train_changes

__all__ = ["LoopInvariants"]

_PARAMETERS = ".parameters"
_GRAD = attrgetter("grad")
_IS_NONE = partial(is_, None)
_IS_NOT_NONE = partial(is_not, None)
_NO_GRADIENTS = ()
"""The gradient fingerprint at a step's first backward call when no parameter held a gradient (the usual
``zero_grad()``, which sets them to None): empty, so the end of the step reads "received" as "has one now"
without building a tuple per parameter."""


class LoopInvariants(StepEndChecks):
    """Loop-invariant checks of ``NeuralDbg`` (see the module docstring); not used on its own."""

    def _init_invariants(self, enabled: bool) -> None:
        self._inv = enabled
        if not enabled:
            return
        root = self._root
        owner = {}
        for path, module in root.named_modules():
            for name, _ in module.named_parameters(recurse=False):
                owner[f"{path}.{name}" if path else name] = (path, type(module).__name__)
        named = [(name, p) for name, p in root.named_parameters() if p.requires_grad]  # = self._parameters
        self._inv_names = [name for name, _ in named]
        self._inv_nodes = [node_name(owner.get(name, ("", ""))[0]) + _PARAMETERS for name in self._inv_names]
        self._inv_index = {id(p): i for i, (_, p) in enumerate(named)}
        self._inv_all = [(p, _numel(p), any(n in owner.get(name, ("", ""))[1] for n in rules.NORM_LAYERS))
                         for name, p in root.named_parameters()]
        self._inv_all_params = [p for p, _, _ in self._inv_all]
        self._inv_all_numel = [n for _, n, _ in self._inv_all]
        self._inv_all_norm = [norm for _, _, norm in self._inv_all]
        self._inv_total = sum(self._inv_all_numel)
        self._inv_trainable_before = -1
        self._inv_flags: list[bool] | None = None  # requires_grad of every parameter at the last check
        self._inv_numel = [_numel(p) for _, p in named]
        self._inv_norm = [any(n in owner.get(name, ("", ""))[1] for n in rules.NORM_LAYERS) for name in self._inv_names]
        self._inv_mode_modules = [path for path, m in root.named_modules() if type(m).__name__ in rules.MODE_DEPENDENT
                                  or (isinstance(m, nn.RNNBase) and m.dropout > 0)]
        self._inv_batchnorms = [(path, m) for path, m in root.named_modules() if isinstance(
            m, nn.modules.batchnorm._BatchNorm) and not isinstance(m, nn.SyncBatchNorm)]
        count = len(named)
        self._inv_seen: set[tuple[str, str]] = set()
        self._inv_consumed = consumed_gradients(count, self._native_marks)  # what the last optimizer step consumed
        self._inv_stale = [False] * count
        self._inv_after: list[int | None] = [None] * count  # gradient version after the last accumulation seen
        self._inv_ambiguous: dict[int, int] = {}  # parameter -> step where its gradient was first grown in place
        self._inv_carried_from: int | None = None  # a light step whose gradient held the step before's
        self._inv_watch: dict[int, Any] = {}  # parameter -> post-accumulate-grad hook handle
        self._inv_optimizers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # -> (number, groups key, held)
        self._inv_groups_checked: set[tuple[int, int]] = set()
        self._inv_low_lr: dict[tuple[int, int], int] = {}  # (optimizer, group) -> steps below its base; -1: done
        self._inv_low_lr_start: dict[tuple[int, int], int] = {}
        self._inv_unused = [0] * count
        self._inv_unused_counting = False
        self._inv_unused_refs: dict[int, Any] = {}  # parameter -> weak reference to its gradient at the step's start
        self._inv_no_step = self._inv_no_update = 0
        self._inv_no_step_onset = self._inv_no_update_onset = -1
        self._inv_foreign_run = 0
        self._inv_foreign_onset = -1
        self._inv_outside: list[torch.Tensor] = []  # parameters the first loss reached that the model does not hold
        self._inv_outside_held: set[int] = set()  # ... and those the optimizers that stepped hold
        self._inv_outside_steps = 0
        self._inv_bn_two_checked = False  # the first pass with a batch of 2 hooked the BatchNorm1d layers once
        self._inv_bn_momentum_checked = False
        self._inv_bn_two: list[Any] = []  # those one-shot hooks' handles
        self._inv_outside_from = 0  # the step of that first pass
        self._inv_share: float | None = None
        self._inv_eval_grad_passes = self._inv_train_passes = self._inv_eval_run = 0
        self._inv_trained_in_train_mode = False
        self._inv_train_checked = False
        self._inv_own_stepped = False  # an optimizer holding the model's parameters stepped at least once
        self._inv_copy_steps = 0  # other optimizers' steps while the model's gradients wait, none of its own
        self._inv_reset_step()

    def _inv_reset_step(self) -> None:
        if not self._inv:
            return
        self._inv_grad_start: tuple | None = None
        self._inv_held: list[frozenset] = []  # parameters held by each optimizer that stepped
        self._inv_live = self._inv_zero_lr = 0
        self._inv_foreign: list[str] = []
        self._inv_scaled = patches.scale_calls()

    def _inv_close(self) -> None:
        if not getattr(self, "_inv", False):
            return
        for handle in self._inv_bn_two:
            handle.remove()
        self._inv_bn_two = []
        for handle in self._inv_watch.values():
            handle.remove()
        self._inv_watch = {}

    # ---- reporting ------------------------------------------------------------------------------------------
    def _inv_report(self, violation: Violation) -> None:
        key = (violation.invariant, violation.subject)
        if key in self._inv_seen:
            return
        self._inv_seen.add(key)
        self.recorder._add_log(violation.step, rules.CATEGORY, violation.subject, violation.message,
                               violation.detail())

    def _inv_step_number(self) -> int:
        step = self.recorder.current_step
        return self._next_step if step is None else step

    # ---- forward passes ---------------------------------------------------------------------------------------
    def _inv_forward(self, training: bool, args: tuple, kwargs: dict) -> None:
        """A forward pass of the model: its mode against the gradient mode, and BatchNorm's batch size."""
        if training:
            self._inv_eval_run = 0
            self._inv_train_passes += 1
            if self._iteration == 0 and self.recorder.current_step is not None:  # the step's first pass
                self._inv_check_share(self.recorder.current_step)
                if not self._inv_train_checked:  # once: is the model in the state its own train() sets?
                    self._inv_train_checked = True
                    violation = rules.train_not_called(self.recorder.current_step,
                                                       pending_train_changes(self._root))
                    if violation is not None:
                        self._inv_report(violation)
            if self._inv_batchnorms:
                if not self._inv_bn_momentum_checked and self.recorder.current_step is not None:
                    self._inv_bn_momentum_checked = True
                    self._inv_bn_momentum(self.recorder.current_step)
                self._inv_batch_one(args, kwargs)
            return
        grad = torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
        if grad:  # gradients on in eval(): a training step in the wrong mode, judged at the optimizer step
            self._inv_eval_grad_passes += 1
        elif self._root.training:
            self._inv_eval_run += 1
            if self._inv_eval_run == rules.EVAL_PASS_RUN and self._inv_mode_modules and not any(
                    m.momentum is None for _, m in self._inv_batchnorms):  # momentum None: update_bn recalibrating
                self._inv_train_mode_evaluation()

    def _inv_train_mode_evaluation(self) -> None:
        step = max(self._inv_step_number() - (self.recorder.current_step is None), self._first_step)
        modules = self._inv_mode_modules
        self._inv_report(Violation(
            "train_mode_evaluation", step, "model.train()",
            f"evaluation passes without gradients ran with the model in train() mode after step {step}: "
            f"{names_text([node_name(p) for p in modules], 3)} behave as in training (dropout active, BatchNorm "
            f"normalising with the batch's statistics and updating its running statistics)",
            evidence={"modules": [node_name(p) for p in modules[:20]], "num_modules": len(modules)}))

    def _inv_bn_momentum(self, step: int) -> None:
        """Once, at the first training pass: BatchNorm layers that train with ``momentum=0`` keep their running
        statistics where they start, so an evaluation normalises with them. Running statistics still at
        their initial values (mean 0, variance 1: a model trained from scratch) are a failure; others (a
        pre-trained model whose statistics are frozen on purpose) pass."""
        frozen = [path for path, m in self._inv_batchnorms if m.training and m.track_running_stats
                  and m.momentum == 0 and _initial_statistics(m)]
        if frozen:
            self._inv_report(Violation(
                "batchnorm_frozen_statistics", step, node_name(frozen[0]),
                f"BatchNorm layers ({names_text([node_name(p) for p in frozen], 3)}) train with momentum=0 from "
                f"running statistics at their initial values (mean 0, variance 1): those never change, so every "
                f"evaluation pass normalises with them instead of the data's (momentum=0.1 is the default; "
                f"momentum=None averages over all batches)",
                evidence={"modules": [node_name(p) for p in frozen[:20]], "num_modules": len(frozen)}))

    def _inv_batch_one(self, args: tuple, kwargs: dict) -> None:
        first = next((t for _, t in tensor_leaves((args, kwargs)) if t.dim() > 0), None)
        if first is None or first.shape[0] > 2:
            return
        if first.shape[0] == 1:
            training = [path for path, m in self._inv_batchnorms if m.training]
            what = ("a batch of 1 sample", "they normalise each channel with the statistics of that one sample and "
                    "update their running statistics with them")
        else:  # 2 samples: a BatchNorm1d given flat features normalises each over 2 values, to -1 and +1
            if not self._inv_bn_two_checked:
                self._inv_bn_two_checked = True
                self._inv_bn_two = [m.register_forward_pre_hook(partial(self._safely, "checking loop invariants",
                                                                        self._inv_batch_two, path))
                                    for path, m in self._inv_batchnorms if m.training and isinstance(m, nn.BatchNorm1d)]
            return
        if training:
            step = self._inv_step_number()
            self._inv_report(Violation(
                "batchnorm_batch_one", step, node_name(training[0]),
                f"BatchNorm layers in training mode ({names_text([node_name(p) for p in training], 3)}) got "
                f"{what[0]} at step {step}: {what[1]}",
                evidence={"batch_size": int(first.shape[0]), "input_shape": list(first.shape),
                          "modules": [node_name(p) for p in training[:20]]}))

    def _inv_batch_two(self, path: str, module: nn.Module, args: tuple) -> None:
        """One-shot forward pre-hook of the training BatchNorm1d layers in the first pass with a batch of 2:
        flat features there are normalised over 2 values each."""
        handles, self._inv_bn_two = self._inv_bn_two, []
        for handle in handles:
            handle.remove()
        x = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if x is None or x.dim() != 2 or x.shape[0] != 2:
            return
        step = self._inv_step_number()
        self._inv_report(Violation(
            "batchnorm_batch_one", step, node_name(path),
            f"BatchNorm1d '{node_name(path)}' in training mode got a batch of 2 samples at step {step}: each feature "
            f"is normalised over its 2 values, so the outputs are -1 and +1 whatever the inputs (micro-batches of 2 "
            f"under gradient accumulation?)",
            evidence={"batch_size": 2, "input_shape": list(x.shape), "modules": [node_name(path)]}))

    # ---- backward ---------------------------------------------------------------------------------------------
    def _inv_backward_call(self) -> None:
        """The first backward call of a step: which parameters held which gradient before it."""
        if self._inv_grad_start is None and self.recorder.current_step is not None:
            grads = list(map(_GRAD, self._parameters))
            # (``_grad_fingerprint``: of the kind ``_grad_mark`` holds, which ``_inv_end_step`` compares it with)
            self._inv_grad_start = _NO_GRADIENTS if all(map(_IS_NONE, grads)) else self._grad_fingerprint()
            if self._inv_unused_counting:  # the gradients of parameters counted unused so far, by identity
                self._inv_unused_refs = {i: weakref.ref(grads[i]) for i, n in enumerate(self._inv_unused)
                                         if n and grads[i] is not None}

    def _inv_accumulated(self, i: int, parameter: torch.Tensor) -> None:
        """Post-accumulate-grad hook of a watched parameter: did this accumulation land on the very gradient
        the last optimizer step consumed, with nothing (a zero_) between?"""
        try:
            grad = parameter.grad
            consumed = self._inv_consumed.version_if(i, grad)
            if consumed is None:
                self._inv_stale[i] = False
            else:
                before = grad._version - 1  # an in-place accumulation moves the version by one
                if before == consumed:
                    self._inv_stale[i] = True
                elif before != self._inv_after[i]:
                    self._inv_stale[i] = False  # changed in place between: cleared
            self._inv_after[i] = None if grad is None else grad._version
        except Exception as error:  # a hook inside backward must never break it
            self.recorder._warn("checking loop invariants", error)

    # ---- the optimizer's step -----------------------------------------------------------------------------------
    def _inv_optimizer(self, optimizer: torch.optim.Optimizer) -> tuple[int, frozenset, list[list]]:
        """``(number, held parameter indices, [[group, held indices, foreign parameters, lr KPI name, its id]])``
        of an optimizer holding the model's parameters, cached while its groups keep their sizes."""
        key = tuple(len(group["params"]) for group in optimizer.param_groups)
        cached = self._inv_optimizers.get(optimizer)
        if cached is None or cached[1] != key:
            number = cached[0] if cached is not None else len(self._inv_optimizers)
            index = self._inv_index
            groups = []
            for g, group in enumerate(optimizer.param_groups):
                held = [index[id(p)] for p in group["params"] if id(p) in index]
                foreign = [p for p in group["params"] if id(p) not in index and id(p) not in self._parameter_ids]
                groups.append([g, held, foreign, _lr_name(number, g, group), None])
            cached = (number, key, frozenset(i for _, held, *_ in groups for i in held), groups)
            self._inv_optimizers[optimizer] = cached
        return cached[0], cached[2], cached[3]

    def _inv_before_step(self, optimizer: torch.optim.Optimizer) -> None:
        """An optimizer holding the model's parameters is about to step: the learning rates, the gradients it
        will consume, the model's mode in the passes since the last step."""
        number, held_all, groups = self._inv_optimizer(optimizer)
        self._inv_own_stepped = True
        step = self._inv_step_number()
        if self._inv_eval_grad_passes and not self._inv_train_passes and self._inv_mode_modules:
            self._inv_eval_mode_training(self._next_step)  # a step of its own, not recorded (eval-mode pass)
        if self._inv_train_passes:
            self._inv_trained_in_train_mode = True
        self._inv_eval_grad_passes = self._inv_train_passes = 0
        self._inv_held.append(held_all)
        rec = self.recorder
        open_step = rec.current_step is not None
        params = self._parameters
        stale: list[int] = []
        for entry in groups:
            g, held, foreign, name, kpi = entry
            group = optimizer.param_groups[g]
            lr = group.get("lr")
            if open_step and lr is not None:
                if isinstance(lr, torch.Tensor):
                    rec.record_kpi(name, lr.detach().clone())
                elif kpi is None:  # the first time: checked, then by its id
                    rec.record_kpi(name, lr)
                    entry[4] = rec.catalog.kpi_id(name)
                else:
                    rec._record_known_kpi(kpi, lr)
            if (id(optimizer), g) not in self._inv_groups_checked:
                self._inv_groups_checked.add((id(optimizer), g))
                self._inv_check_eps(number, g, group, step)
            setting = rules.optimizer_setting(group)
            if setting is not None:
                self._inv_optimizer_setting(number, g, group, setting, step)
            below = self._inv_low_lr.get((number, g), 0)
            if below >= 0:
                self._inv_lr_below_base(number, g, group, below, step)
            with_grad, grown = self._inv_consumed.consume(params, held)
            stale += [i for i in grown if self._inv_grown_in_place(i, step)]
            watched = self._inv_watch
            if watched:  # (grown ones may have joined it just now)
                for i in held:
                    if i in watched and params[i].grad is not None:
                        self._inv_stale[i] = False
                        self._inv_after[i] = None
            if not isinstance(lr, torch.Tensor) and lr is not None and float(lr) == 0.0:
                self._inv_zero_lr += with_grad
            else:
                self._inv_live += with_grad
            if foreign:
                self._inv_foreign += [p for p in foreign if p.requires_grad and p.grad is None]
        if stale:
            self._inv_stale_gradients(number, stale, step)

    def _inv_foreign_step(self, optimizer: torch.optim.Optimizer) -> None:
        """An optimizer holding none of the model's parameters stepped after a backward pass through the model,
        and none holding them ever did: is it an optimizer built for a copy of the model's parameters?"""
        if self._inv_own_stepped or not self._backward_seen:
            return
        self._inv_copy_steps += 1
        if self._inv_copy_steps == rules.NO_STEP_STEPS:
            held = [tuple(p.shape) for group in optimizer.param_groups for p in group["params"]]
            violation = rules.copy_optimizer(self._inv_step_number(), [tuple(p.shape) for p in self._parameters],
                                             held)
            if violation is not None:
                self._inv_report(violation)

    def _inv_grown_in_place(self, i: int, step: int) -> bool:
        """The gradient about to be consumed is the tensor the last step consumed, changed in place since:
        uncleared (accumulated onto), or zeroed in place and accumulated again? A watched parameter's
        post-accumulate-grad hook knows; otherwise start watching it."""
        if i in self._inv_watch:
            if not self._inv_stale[i]:  # cleared in place: a later stale gradient begins where it is seen
                self._inv_ambiguous.pop(i, None)
            return self._inv_stale[i]
        self._inv_ambiguous.setdefault(i, step)
        self._inv_watch[i] = self._parameters[i].register_post_accumulate_grad_hook(partial(self._inv_accumulated, i))
        return False

    def _inv_stale_gradients(self, number: int, stale: list[int], step: int) -> None:
        names = [self._inv_names[i] for i in stale]
        onset = min(self._inv_ambiguous.get(i, step) for i in stale)
        carried, self._inv_carried_from = self._inv_carried_from, None
        if carried is not None and step - carried <= CARRIED_FULL + 1:  # seen first by a light step
            onset = min(onset, carried)
        self._inv_report(Violation(
            "stale_gradients", onset, _optimizer_label(number),
            f"optimizer.zero_grad() is not called between steps: at step {onset} the gradient of '{names[0]}' still "
            f"held the previous step's, and the next backward pass added to it (so did {len(names)} of "
            f"{len(self._inv_names)} trainable parameters: {names_text(names)})",
            evidence={"parameters": names[:20], "num_parameters": len(names),
                      "num_trainable": len(self._inv_names), "confirmed_at": step,
                      "nodes": sorted({self._inv_nodes[i] for i in stale})[:20]}))

    def _inv_eval_mode_training(self, step: int) -> None:
        modules = [node_name(p) for p in self._inv_mode_modules]
        if self._inv_trained_in_train_mode:
            message = (f"training steps run with the model in eval() mode from step {step} on (after an evaluation, "
                       f"model.train() was not called again): {names_text(modules, 3)} compute as in evaluation "
                       f"(no dropout, BatchNorm with running statistics); these steps are not recorded")
            severity = FAILURE
        else:
            message = (f"every training step so far ran with the model in eval() mode: {names_text(modules, 3)} "
                       f"compute as in evaluation (no dropout, BatchNorm with running statistics); steps in eval() "
                       f"mode are not recorded")
            severity = INFO
        self._inv_report(Violation("eval_mode_training", step, "model.eval()", message, severity,
                                   {"modules": modules[:20], "num_modules": len(modules)}))

    def _inv_check_eps(self, number: int, g: int, group: dict, step: int) -> None:
        eps = group.get("eps")
        if isinstance(eps, tuple):  # Adafactor-style (eps1, eps2)
            eps = eps[0]
        first = next(iter(group["params"]), None)
        if not isinstance(eps, (int, float)) or first is None:
            return
        dtype = str(first.dtype)
        if rules.eps_below_resolution(float(eps), dtype):
            tiny = torch.finfo(first.dtype).tiny
            label = f"{_optimizer_label(number)} group {g}"
            self._inv_report(Violation(
                "half_precision_eps", step, label,
                f"{label} updates {dtype.split('.')[1]} weights with eps={eps:g}, below the smallest normal "
                f"{dtype.split('.')[1]} number ({tiny:.3g}): the denominator sqrt(v) + eps rounds to 0 once v "
                f"underflows, and the update divides by zero",
                evidence={"eps": float(eps), "dtype": dtype, "smallest_normal": float(tiny), "group": g}))

    def _inv_any_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Any optimizer's step (another model's too, as a GAN's discriminator): which parameters it holds."""
        self._inv_outside_held.update(id(p) for group in optimizer.param_groups for p in group["params"])

    def _inv_check_outside(self, step: int) -> None:
        """``OUTSIDE_STEPS`` steps after the model's first training pass reached parameters the model does not
        hold (modules its forward calls without registering them): did any optimizer step them? Judged once."""
        outside, held = self._inv_outside, self._inv_outside_held
        self._inv_outside, self._inv_outside_held = [], set()
        missed = [p for p in outside if id(p) not in held]
        if not missed:
            return
        elements = sum(_numel(p) for p in missed)
        self._inv_report(Violation(
            "unregistered_parameters", step, "model",
            f"the model's forward pass uses {len(missed)} parameter(s) ({elements} elements; shapes "
            f"{_shapes_text(missed)}) that are not the model's (not in model.parameters()) and that no optimizer "
            f"stepped in the first {OUTSIDE_STEPS} steps holds: they get gradients and never change — layers kept in "
            f"a plain Python list or dict instead of nn.ModuleList / nn.ModuleDict",
            evidence={"parameters": len(missed), "elements": elements,
                      "shapes": [list(p.shape) for p in missed[:20]]}))

    def _inv_lr_below_base(self, number: int, g: int, group: dict, below: int, step: int) -> None:
        """Count the steps since the first at which the group's rate stayed below ``LR_BELOW`` of its scheduler's
        base (``initial_lr``); report at ``LR_BELOW_STEPS``. The first step at or above it ends the count."""
        lr, base = group.get("lr"), group.get("initial_lr")
        if not (isinstance(lr, (int, float)) and isinstance(base, (int, float)) and base > 0):
            self._inv_low_lr[(number, g)] = -1  # no scheduler (or a tensor rate): nothing to compare with
            return
        if lr >= rules.LR_BELOW * base:
            self._inv_low_lr[(number, g)] = -1
            return
        if below == 0:
            self._inv_low_lr_start[(number, g)] = step
        below += 1
        self._inv_low_lr[(number, g)] = below
        if below == rules.LR_BELOW_STEPS:
            start = self._inv_low_lr_start.get((number, g), step)
            label = f"{_optimizer_label(number)} group {g}"
            self._inv_report(Violation(
                "lr_below_base", start, label,
                f"{label}'s learning rate stayed below {rules.LR_BELOW:g} of its scheduler's base rate {base:g} for "
                f"the first {below} steps (now {lr:.3g}): the schedule never lets it up (a warm-up far longer than "
                f"the run, a factor that starts at 0 and grows per epoch while stepped per batch?), and the updates "
                f"are too small to train",
                evidence={"lr": float(lr), "initial_lr": float(base), "steps": below, "group": g}))

    def _inv_optimizer_setting(self, number: int, g: int, group: dict, setting: tuple[str, str, float],
                               step: int) -> None:
        invariant, name, value = setting
        label = f"{_optimizer_label(number)} group {g}"
        if invariant == "negative_weight_decay":
            effect = "every step moves the weights away from 0 by it: they grow until the loss follows"
        elif invariant == "weight_decay_dominant":
            shrink = rules.decay_per_step(group) or 0.0
            effect = (f"at lr {group['lr']:g} the decay alone takes {shrink:.0%} of every weight per step, halving "
                      f"them every {max(1, round(0.693 / shrink)) if shrink < 1 else 1} steps whatever the gradients "
                      f"do: the weights, and the signals and gradients they carry, shrink toward 0")
        elif invariant == "betas_unstable":
            value = tuple(float(b) for b in group["betas"])
            effect = ("beta1 squared is not below the square root of beta2, Adam's condition for stable updates "
                      "(swapped betas?): the squared-gradient average forgets faster than the gradient average, and "
                      "the updates swing")
        elif invariant == "average_without_memory":
            effect = ("the squared-gradient average keeps no memory: it is the last gradient squared, so every update "
                      "is about lr times the gradient's sign whatever its size, and it does not shrink near a minimum "
                      "(RMSprop's alpha is usually 0.99, Adam's beta2 0.999)")
        elif invariant == "eps_too_large":
            effect = ("the denominator sqrt(v) + eps is about eps, so every update is about lr times the gradient's "
                      "average, orders of magnitude smaller than Adam's (a typo for 1e-8?)")
        elif name == "momentum":
            effect = ("a momentum of 1 or more never forgets a gradient: every update is the sum of all the gradients "
                      "since, and it grows and overshoots")
        else:
            effect = ("a moving average with a factor of 1 or more never takes in a new value (and its bias "
                      "correction divides by 0 or changes sign)")
        shown = f"{value:g}" if isinstance(value, float) else str(value)
        self._inv_report(Violation(
            invariant, step, label, f"{label} runs with {name}={shown} from step {step}: {effect}",
            evidence={"setting": name, "value": list(value) if isinstance(value, tuple) else value, "group": g}))

    # ---- the end of a step ------------------------------------------------------------------------------------
    def _inv_end_step(self) -> None:
        """The step is over: what received a gradient, which optimizers stepped, what changed."""
        step = self.recorder.current_step
        if step is None or not self._backward_seen:
            return
        start = self._inv_grad_start
        ids, versions = self._grad_mark  # steps.gradient_fingerprint after the step's last backward pass
        if start:  # a gradient that changed (None stays None)
            received = list(map(or_, map(ne, ids, start[0]), map(ne, versions, start[1])))
        else:  # no gradient at the first backward call (or no call seen): whichever has one now
            received = list(map(_IS_NOT_NONE, versions))
        if not any(received):
            return
        params = self._parameters
        self._inv_check_no_step(step)
        if self._inv_outside:
            self._inv_outside_steps += 1
            if self._inv_outside_steps == OUTSIDE_STEPS:
                self._inv_check_outside(self._inv_outside_from)
        if self._inv_held:  # an optimizer holding the model's parameters stepped (its pre-hook ran; the
            # count of own steps is not there yet at the optimizer= post-hook that ends the step)
            self._inv_check_omitted(step, received)
            self._inv_check_foreign(step)
            self._inv_check_no_update(step)
        if all(received):  # the common case
            if self._inv_unused_counting:
                self._inv_unused = [0] * len(received)
                self._inv_unused_counting = False
            return
        self._inv_unused_counting = True
        refs, self._inv_unused_refs = self._inv_unused_refs, {}
        for i, got in enumerate(received):
            if not got and i in refs:  # a new gradient tensor where a freed one was (same id and version)
                got = params[i].grad is not None and refs[i]() is not params[i].grad
            if got or not params[i].requires_grad:
                self._inv_unused[i] = 0
            else:
                self._inv_unused[i] += 1
        unused = [i for i, n in enumerate(self._inv_unused) if n == rules.UNUSED_STEPS]
        if unused:
            names = [self._inv_names[i] for i in unused]
            onset = step - rules.UNUSED_STEPS + 1
            nodes = sorted({self._inv_nodes[i] for i in unused})
            self._inv_report(Violation(
                "unused_parameters", onset, nodes[0],
                f"{len(names)} trainable parameter(s) got no gradient in any of the {rules.UNUSED_STEPS} steps from "
                f"step {onset} on while the others did: the loss does not depend on {names_text(names)}",
                evidence={"parameters": names[:20], "num_parameters": len(names), "nodes": nodes[:20],
                          "steps": rules.UNUSED_STEPS}))


OUTSIDE_STEPS = 3
"""Steps over which optimizers are watched for the parameters the model's first pass reached but does not hold."""


def _shapes_text(tensors: list[torch.Tensor], limit: int = 4) -> str:
    shapes = [str(list(t.shape)) for t in tensors[:limit]]
    return ", ".join(shapes) + (f" and {len(tensors) - limit} more" if len(tensors) > limit else "")


def _initial_statistics(module: nn.Module) -> bool:
    """Whether a BatchNorm layer's running statistics are still their initial values (mean 0, variance 1)."""
    mean, var = module.running_mean, module.running_var
    return (mean is not None and var is not None and not bool(mean.any())
            and bool((var == 1).all()))


def _numel(p: torch.Tensor) -> int:
    try:
        return int(p.numel())
    except Exception:  # noqa: BLE001 - a lazy parameter not materialised yet
        return 0


def _optimizer_label(number: int) -> str:
    return "optimizer" if number == 0 else f"optimizer {number}"


def _lr_name(number: int, g: int, group: dict) -> str:
    """KPI name of a param group's learning rate: ``lr/<group>`` (its ``name`` entry, or its index), with the
    optimizer's number first for the second optimizer on (``lr/1.0``)."""
    label = group.get("name")
    label = label if isinstance(label, str) and label and "/" not in label else str(g)
    return f"lr/{label}" if number == 0 else f"lr/{number}.{label}"

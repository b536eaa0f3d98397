"""Loop invariants: what each one is, its thresholds, and the sentence of a violation — pure functions.

:mod:`~comgra_ndbg.instrument.invariants` gathers plain facts at the loop's step boundaries (which
parameters had a gradient, which optimizer holds them, the learning rates, the model's mode) and asks the
functions here whether an invariant is broken and how to say so. Nothing here touches a tensor's elements.
Each violation becomes one row of the recording's log (category :data:`CATEGORY`) with its step, subject,
sentence and the evidence as a JSON object whose ``invariant`` names the rule and ``severity`` says whether
it is a failure or information (a choice the user may have made on purpose, e.g. a frozen backbone).

>>> eps_below_resolution(1e-8, "torch.float16"), eps_below_resolution(1e-8, "torch.bfloat16")
(True, False)
>>> share_collapse(1.0, 0.004, only_norms=False)
'failure'
>>> share_collapse(1.0, 0.3, only_norms=False), share_collapse(1.0, 0.9, only_norms=False)
('info', None)
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch

from comgra_ndbg.instrument.train_dry_run import TrainChanges
from comgra_ndbg.store import schema

__all__ = ["CATEGORY", "FAILURE", "INFO", "INVARIANTS", "Violation", "eps_below_resolution", "share_collapse",
           "omission_severity", "omission", "copy_optimizer", "train_not_called", "outermost",
           "optimizer_setting", "LR_BELOW", "LR_BELOW_STEPS", "NO_STEP_STEPS", "NO_UPDATE_STEPS", "STUCK_BACKWARDS", "STUCK_PER_STEP", "STUCK_FIRST",
           "stuck_limit", "UNUSED_STEPS", "EVAL_PASS_RUN",
           "SHARE_DROP", "SHARE_COLLAPSED", "OMITTED_ON_PURPOSE", "MODE_DEPENDENT", "NORM_LAYERS", "percent",
           "names_text"]

CATEGORY = schema.LOG_INVARIANT
"""The log category of every loop-invariant row (``Recording.log("invariant")``)."""

FAILURE, INFO = "failure", "info"

INVARIANTS = {
    "stale_gradients": "gradients carried over from one optimizer step into the next (no zero_grad)",
    "not_in_optimizer": "a parameter with a gradient in no param group of the optimizers that stepped",
    "foreign_parameters": "optimizer parameters that are not the model's and never get a gradient",
    "no_optimizer_step": "gradients computed and cleared without optimizer.step()",
    "no_step_end": "training passes with backward calls where no step ends (no optimizer.step(), no zero_grad())",
    "no_update": "optimizer.step() leaves every parameter with a gradient unchanged (learning rate 0)",
    "trainable_share": "the share of trainable parameters (frozen from the start, or collapsing mid-run)",
    "eval_mode_training": "training steps taken with the model in eval() mode",
    "train_not_called": "training starts without the state the model's own train() sets (frozen stages, norm_eval)",
    "train_mode_evaluation": "evaluation passes (no gradients) with the model in train() mode",
    "batchnorm_batch_one": "BatchNorm in training mode on a batch of one sample",
    "unused_parameters": "trainable parameters that receive no gradient for many steps",
    "half_precision_eps": "half-precision weights with an optimizer eps the dtype cannot represent",
    "nonfinite_evaluation": "evaluation passes whose module outputs hold NaN or Inf",
    "nonfinite_evaluation_data": "evaluation passes whose inputs hold NaN or Inf",
    "target_shape": "a loss's prediction and target broadcast to more elements than either (every pair compared)",
    "activation_before_loss": "a sigmoid or softmax before a loss that applies it again (or probabilities to NLLLoss)",
    "decay_not_below_one": "an optimizer's momentum, beta, alpha or rho of 1 or more",
    "unregistered_parameters": "parameters the loss depends on that neither the model nor an optimizer holds",
    "betas_unstable": "Adam betas outside its convergence condition beta1^2 < sqrt(beta2) (swapped betas)",
    "eps_too_large": "an Adam-family eps of 1 or more",
    "negative_weight_decay": "an optimizer's negative weight decay",
    "average_without_memory": "a squared-gradient average with a factor of 0 or less (RMSprop alpha, Adam beta2, rho)",
    "lr_below_base": "a learning rate below 1/1000 of its scheduler's base rate from the first step on, for 200 steps",
    "batchnorm_frozen_statistics": "BatchNorm training with momentum 0: running statistics never leave their start",
    "weight_decay_dominant": "a weight decay that alone shrinks the weights by 2 % or more per step",
}
"""Every invariant checked during the loop, by the name its log rows carry in ``detail["invariant"]``."""

DECAY_SHRINK = 0.02
"""Share of the weights a weight decay may remove per step by itself before it is a typo (0.5 for 5e-4): 2 %
halves them within 35 steps whatever the gradients do, ten times what the strongest usual recipes remove
(SGD at lr 0.4 with weight decay 1e-3 and momentum 0.9: 0.4 %; AdamW at lr 1e-3 with weight decay 1: 0.1 %)."""
NO_STEP_STEPS = 3
"""Consecutive steps with gradients but no optimizer step (a skipped ``GradScaler`` step is exempt)."""
STUCK_BACKWARDS = 8
"""Backward calls in one step that no step ends, at least, before ``no_step_end`` fires."""
STUCK_PER_STEP = 4
"""... and more than this many times the passes (or backward calls) of the longest finished step."""
STUCK_FIRST = 128
"""... or, before any step ended, more than this many (a first step accumulating up to 128 micro-batches)."""
NO_UPDATE_STEPS = 3
"""Consecutive optimizer steps whose every parameter with a gradient sits in a group with learning rate 0
(a warm-up that starts at 0 moves on after one step)."""
UNUSED_STEPS = 10
"""Consecutive steps in which a trainable parameter gets no gradient while others do."""
EVAL_PASS_RUN = 2
"""Consecutive evaluation passes (no gradients) in train() mode that make a validation loop; one such pass
between training passes is a model used as a fixed part of another's step (a GAN's generator sample)."""
SHARE_DROP = 0.5
"""A trainable share that falls below this fraction of the share before is a change worth reporting."""
SHARE_COLLAPSED = 0.05
"""A trainable share at or below this (or only normalisation parameters left) is a collapse: a failure."""
OMITTED_ON_PURPOSE = 0.5
"""Parameters with gradients left out of every param group from the first step, holding at least this
share of the trainable elements, read as fine-tuning a part on purpose (information, not a failure)."""

MODE_DEPENDENT = ("Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "FeatureAlphaDropout",
                  "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "LazyBatchNorm1d", "LazyBatchNorm2d",
                  "LazyBatchNorm3d", "SyncBatchNorm", "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d")
"""Module classes that compute differently in train() and eval() (RNNs with dropout are added by value)."""
NORM_LAYERS = ("BatchNorm", "LayerNorm", "GroupNorm", "InstanceNorm", "RMSNorm", "LocalResponseNorm")


@dataclass(frozen=True)
class Violation:
    """One broken invariant at ``step``: the log row's subject, sentence and evidence."""

    invariant: str
    step: int
    subject: str
    message: str
    severity: str = FAILURE
    evidence: dict = field(default_factory=dict)

    def detail(self) -> dict:
        """The log row's detail object."""
        return {"invariant": self.invariant, "severity": self.severity, **self.evidence}


def percent(share: float) -> str:
    """A share as a short percentage.

    >>> percent(0.123), percent(0.0004), percent(1.0)
    ('12 %', '0.04 %', '100 %')
    """
    value = 100.0 * share
    return f"{value:.2g} %" if value < 1 else f"{value:.0f} %"


def names_text(names: list[str], limit: int = 4) -> str:
    """``'a', 'b' and 3 more``.

    >>> names_text(["a", "b", "c"], limit=2)
    "'a', 'b' and 1 more"
    """
    shown = ", ".join(f"'{n}'" for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def eps_below_resolution(eps: float, dtype: str) -> bool:
    """Whether an optimizer ``eps`` is below the smallest normal number of a half-precision ``dtype``
    (written ``torch.float16``): there it rounds to 0 or to a subnormal, and ``grad / (sqrt(v) + eps)``
    divides by zero once ``v`` underflows. float32 and wider are never flagged."""
    if dtype not in ("torch.float16", "torch.bfloat16"):
        return False
    return 0 < eps < torch.finfo(getattr(torch, dtype.split(".")[1])).tiny


_AVERAGES = (("momentum", "momentum"), ("alpha", "alpha (RMSprop's smoothing)"), ("rho", "rho"))
_SQUARED = ("alpha", "rho")  # the averages of squared gradients (with Adam's betas[1]): 0 keeps no memory
LR_BELOW = 1e-3
"""A learning rate below this share of its group's ``initial_lr`` (the scheduler's base) ..."""
LR_BELOW_STEPS = 200
"""... at every step from the first on, this many optimizer steps: a warm-up or schedule that never lets the
rate up (a warm-up of 10^6 steps typed for 10^2). Warm-ups of up to 200 000 steps pass."""


def optimizer_setting(group: dict) -> tuple[str, str, float] | None:
    """A param group's setting that no training wants, as ``(invariant, setting, value)``, or None: a moving
    average's factor of 1 or more (``momentum``, Adam's ``betas``, RMSprop's ``alpha``, Adadelta's ``rho``:
    a momentum of 1 never forgets a gradient, a beta of 1 divides by a bias correction of 0), or a negative
    ``weight_decay`` (the weights grow by it every step). torch checks most of these only when the optimizer
    is built, SGD's momentum never above; an edit of ``param_groups`` mid-run is not checked at all. For the
    Adam family also: betas outside Adam's convergence condition β1² < √β2 (``(0.999, 0.9)``: swapped), and an
    ``eps`` of 1 or more (a typo for 1e-8: the denominator √v + eps is then about eps, and the updates lr ×
    the gradient's average, orders of magnitude too small). A squared-gradient average with a factor of 0 or
    less (RMSprop's ``alpha``, Adadelta's ``rho``, Adam's ``betas[1]``) keeps no memory: it is the last
    gradient squared, and every update is about lr × the gradient's sign, whatever its size. A weight decay that
    alone removes ``DECAY_SHRINK`` of the weights or more per step (``decay_per_step``: 0.5 typed for 5e-4).

    >>> optimizer_setting({"momentum": 0.9, "weight_decay": 0.0}), optimizer_setting({"momentum": 1.0})
    (None, ('decay_not_below_one', 'momentum', 1.0))
    >>> optimizer_setting({"betas": (0.9, 1.0)}), optimizer_setting({"weight_decay": -0.01})
    (('decay_not_below_one', 'betas[1]', 1.0), ('negative_weight_decay', 'weight_decay', -0.01))
    >>> optimizer_setting({"betas": (0.999, 0.9)}), optimizer_setting({"betas": (0.9, 0.95), "eps": 1.0})
    (('betas_unstable', 'betas', 0.999), ('eps_too_large', 'eps', 1.0))
    >>> optimizer_setting({"betas": (0.9, 0.999), "eps": 1e-8}), optimizer_setting({"betas": (0.5, 0.999)})
    (None, None)
    >>> optimizer_setting({"alpha": 0.0, "momentum": 0}), optimizer_setting({"betas": (0.9, 0.0)})
    (('average_without_memory', "alpha (RMSprop's smoothing)", 0.0), ('average_without_memory', 'betas[1]', 0.0))
    >>> optimizer_setting({"lr": 0.05, "weight_decay": 0.5, "momentum": 0.9, "dampening": 0, "nesterov": False})
    ('weight_decay_dominant', 'weight_decay', 0.5)
    """
    for key, label in _AVERAGES:
        value = group.get(key)
        if isinstance(value, (int, float)) and value >= 1:
            return "decay_not_below_one", label, float(value)
        if key in _SQUARED and isinstance(value, (int, float)) and not isinstance(value, bool) and value <= 0:
            return "average_without_memory", label, float(value)
    betas = group.get("betas")
    if isinstance(betas, (tuple, list)):
        for i, value in enumerate(betas):
            if isinstance(value, (int, float)) and value >= 1:
                return "decay_not_below_one", f"betas[{i}]", float(value)
        if len(betas) == 2 and isinstance(betas[1], (int, float)) and betas[1] <= 0:
            return "average_without_memory", "betas[1]", float(betas[1])
        if (len(betas) == 2 and all(isinstance(b, (int, float)) for b in betas) and betas[1] > 0
                and betas[0] ** 2 >= betas[1] ** 0.5):
            return "betas_unstable", "betas", float(betas[0])
        eps = group.get("eps")
        if isinstance(eps, (int, float)) and eps >= 1:
            return "eps_too_large", "eps", float(eps)
    decay = group.get("weight_decay")
    if isinstance(decay, (int, float)) and decay < 0:
        return "negative_weight_decay", "weight_decay", float(decay)
    shrink = decay_per_step(group)
    if shrink is not None and shrink >= DECAY_SHRINK:
        return "weight_decay_dominant", "weight_decay", float(decay)
    return None


def decay_per_step(group: dict) -> float | None:
    """The share of every weight a param group's ``weight_decay`` alone removes per step, where it acts on the
    weights directly: decoupled (AdamW, ``decoupled_weight_decay=True``) ``lr × weight_decay``; SGD's, added to
    the gradient that the momentum sums, ``lr × weight_decay × (1 - dampening) / (1 - momentum)`` once the
    momentum is built up. None for the optimizers that divide the decay by the gradients' scale (Adam's L2,
    RMSprop, Adagrad), for a setting held in a tensor, and without decay.

    >>> round(decay_per_step({"lr": 0.05, "weight_decay": 0.5, "momentum": 0.9, "dampening": 0, "nesterov": False}), 6)
    0.25
    >>> decay_per_step({"lr": 1e-3, "weight_decay": 0.1, "betas": (0.9, 0.999), "decoupled_weight_decay": True})
    0.0001
    >>> decay_per_step({"lr": 1e-3, "weight_decay": 0.1, "betas": (0.9, 0.999), "decoupled_weight_decay": False})
    """
    decay, lr = group.get("weight_decay"), group.get("lr")
    if not (_number(decay) and _number(lr)) or decay <= 0 or lr <= 0:
        return None
    if group.get("decoupled_weight_decay") is True:
        return float(lr * decay)
    if "nesterov" in group and "dampening" in group:  # SGD's param group
        momentum, dampening = group.get("momentum", 0), group.get("dampening", 0)
        if not (_number(momentum) and _number(dampening)) or not 0 <= momentum < 1:
            return None
        return float(lr * decay * ((1 - dampening) / (1 - momentum) if momentum > 0 else 1))
    return None


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def stuck_limit(longest_step: int) -> int:
    """The backward calls one step may run before ``no_step_end`` fires: more than the longest finished step
    explains (``longest_step``: its training passes, or its backward calls where it made more; 0 when no
    step has ended yet).

    >>> stuck_limit(0), stuck_limit(1), stuck_limit(16), stuck_limit(64)
    (128, 8, 64, 256)
    """
    if longest_step <= 0:
        return STUCK_FIRST
    return max(STUCK_BACKWARDS, STUCK_PER_STEP * longest_step)


def share_collapse(before: float, after: float, *, only_norms: bool) -> str | None:
    """Severity of a trainable share that moved from ``before`` to ``after``: None when it did not fall
    below :data:`SHARE_DROP` of its value, a failure when it collapsed (≤ :data:`SHARE_COLLAPSED`, or
    only normalisation parameters still train), information otherwise (freezing a part on purpose)."""
    if before <= 0 or after >= SHARE_DROP * before:
        return None
    return FAILURE if after <= SHARE_COLLAPSED or only_norms else INFO


def omission_severity(share: float, first_step: bool, *, norms_only: bool = False,
                      partly_frozen: bool = False) -> str:
    """Parameters with gradients in no param group, holding ``share`` of the elements that get gradients.

    A failure when that is all of them (the optimizers that stepped change nothing that learns), or when they
    were left out after the first step (a layer created or replaced after the optimizer). Information when
    left out from the first step and either holding at least :data:`OMITTED_ON_PURPOSE` of them (training a
    head only), or being only normalisation parameters in a model ``partly_frozen`` with
    ``requires_grad=False`` (the leftovers of a freeze by name, "bn" kept: they keep their values like the
    frozen layers around them).

    >>> omission_severity(1.0, True), omission_severity(0.7, True), omission_severity(0.1, True)
    ('failure', 'info', 'failure')
    >>> omission_severity(0.1, True, norms_only=True, partly_frozen=True)
    'info'
    """
    if share >= 1.0 or not first_step:
        return FAILURE
    return INFO if share >= OMITTED_ON_PURPOSE or (norms_only and partly_frozen) else FAILURE


def omission(step: int, names: list[str], nodes: list[str], share: float, *, first_step: bool, norms_only: bool,
             trainable_share: float) -> Violation:
    """The ``not_in_optimizer`` violation of parameters ``names`` (of ``nodes``) that get gradients but are in
    no param group of the optimizers that stepped at ``step``; ``share``: their part of the elements with
    gradients, ``trainable_share``: the model's share of elements with ``requires_grad`` (see
    :func:`omission_severity`)."""
    partly_frozen = trainable_share < 1.0
    severity = omission_severity(share, first_step, norms_only=norms_only, partly_frozen=partly_frozen)
    if severity == INFO and share < OMITTED_ON_PURPOSE:
        message = (f"{len(names)} normalisation parameter(s) get gradients but are in no param group from the first "
                   f"step on, while {percent(1 - trainable_share)} of the model's parameter elements are frozen with "
                   f"requires_grad=False: {names_text(names)} keep their values like the frozen layers around them "
                   f"(freeze them too to skip their gradients, or add them to the optimizer if they should train)")
    elif severity == INFO:
        message = (f"only {percent(1 - share)} of the parameters that get gradients are in the optimizer's param "
                   f"groups from the first step on: {names_text(names)} are not trained (a part frozen on "
                   f"purpose by leaving it out of the optimizer?)")
    elif share >= 1.0:
        message = (f"none of the parameters that get gradients is in a param group of the optimizer(s) that stepped "
                   f"at step {step}: optimizer.step() changes nothing that learns ({names_text(names)} get gradients "
                   f"and are never updated; the optimizer's own parameters get none)")
    else:
        message = (f"{names_text(names)} get gradients but are in no param group of the optimizer(s) that "
                   f"stepped at step {step}: they are never updated (a layer created or replaced after the "
                   f"optimizer was built?)")
    return Violation("not_in_optimizer", step, nodes[0], message, severity,
                     {"parameters": names[:20], "num_parameters": len(names), "nodes": nodes[:20], "share": share,
                      "norms_only": norms_only, "trainable_share": trainable_share})


def outermost(paths: list[str]) -> list[str]:
    """The module paths of ``paths`` that lie inside no other of them, in their order.

    >>> outermost(["features.0", "features.0.0", "features.0.1", "head"])
    ['features.0', 'head']
    """
    chosen: list[str] = []
    for path in paths:
        if not any(path == p or path.startswith(p + ".") or not p for p in chosen):
            chosen.append(path)
    return chosen


def train_not_called(step: int, changes: TrainChanges | None) -> Violation | None:
    """The violation when the model's own ``train()`` would change its parameters' ``requires_grad`` or its
    modules' modes at the first training step (``changes`` from
    :func:`~comgra_ndbg.instrument.train_dry_run.pending_train_changes`): that code has not run, so what it
    freezes trains and what it keeps in ``eval()`` runs in training mode. None when nothing would change.

    >>> changes = TrainChanges(frozen=["features.0.0.weight"], to_eval=["features.0", "features.0.0"],
    ...                        owners=["StagedVGG"])
    >>> message = train_not_called(0, changes).message
    >>> message.startswith("model.train() was not called before training: StagedVGG defines its own train()")
    True
    >>> message.split(", which would ")[1]
    "set requires_grad=False on 1 parameter(s) ('features.0.0.weight') and put 'features.0' in eval() mode, but \
it has not run: those parameters train and those modules compute in training mode"
    """
    if changes is None or changes.empty:
        return None
    would = []
    if changes.frozen:
        would.append(f"set requires_grad=False on {len(changes.frozen)} parameter(s) ({names_text(changes.frozen)})")
    if changes.unfrozen:
        would.append(f"set requires_grad=True on {len(changes.unfrozen)} parameter(s) "
                     f"({names_text(changes.unfrozen)})")
    to_eval, to_train = outermost(changes.to_eval), outermost(changes.to_train)
    if to_eval:
        would.append(f"put {names_text([p or 'the model' for p in to_eval], 3)} in eval() mode")
    if to_train:
        would.append(f"put {names_text([p or 'the model' for p in to_train], 3)} in train() mode")
    effects = [e for e, present in (("those parameters train", changes.frozen),
                                    ("those parameters stay fixed", changes.unfrozen),
                                    ("those modules compute in training mode", to_eval),
                                    ("those modules compute in evaluation mode", to_train)) if present]
    one = len(changes.owners) == 1
    owners = " and ".join(changes.owners[:3])
    return Violation(
        "train_not_called", step, "model.train()",
        f"model.train() was not called before training: {owners} define{'s its' if one else ' their'} own "
        f"train(), which would {' and '.join(would)}, but it has not run: {' and '.join(effects)}",
        evidence={"frozen": changes.frozen[:20], "unfrozen": changes.unfrozen[:20], "to_eval": to_eval[:20],
                  "to_train": to_train[:20], "owners": changes.owners[:5],
                  "num_parameters": len(changes.frozen) + len(changes.unfrozen),
                  "num_modules": len(changes.to_eval) + len(changes.to_train)})


def copy_optimizer(step: int, model_shapes: list[tuple[int, ...]], held_shapes: list[tuple[int, ...]]
                   ) -> Violation | None:
    """The ``foreign_parameters`` violation of an optimizer that steps while holding none of the model's
    parameters (``model_shapes``: the shapes of the model's trainable ones) but parameters of the same shapes
    (``held_shapes``): it was built for other parameter objects of this model — before
    ``load_state_dict(..., assign=True)`` or ``to_empty()`` replaced them, or for a copy. None when the shapes
    do not cover the model's (another model's optimizer: a GAN's generator).

    >>> copy_optimizer(0, [(4, 2), (4,)], [(4, 2), (4,)]).invariant
    'foreign_parameters'
    >>> copy_optimizer(0, [(4, 2), (4,)], [(8, 4), (8,)]) is None
    True
    """
    if not model_shapes or Counter(model_shapes) - Counter(held_shapes):
        return None
    return Violation(
        "foreign_parameters", step, "param_groups",
        f"the optimizer that steps holds none of the model's parameters but {len(held_shapes)} of the same shapes "
        f"(the model has {len(model_shapes)} trainable): it was built for other parameter objects — before "
        f"load_state_dict(..., assign=True) or to_empty() replaced the model's, or for a copy of the model — so "
        f"the model's gradients are never applied, nor cleared by its zero_grad()",
        evidence={"num_parameters": len(held_shapes), "num_model_parameters": len(model_shapes),
                  "shapes": [list(s) for s in held_shapes[:5]]})

"""The fault catalogue: each fault is a bug as it happens in real training code, with its ground truth.

A fault is injected at the start of step ``t0`` (after a healthy stretch of 40–60 % of the run) by
changing what real code changes — a parameter in place under ``torch.no_grad()``, an optimizer's
``param_groups``, ``requires_grad``, a schedule, a loss knob, the data pipeline — or, for faults of the
architecture and of the configuration, when the run is built (``t0 = 0`` for those of the architecture).
``configs`` holds the configuration a fault needs in a family (a tanh network for saturation, a custom
loss for ``log_zero``); ``chain`` lists the secondary effects (event labels of the analysis) the fault is
expected to cause, scored only where the recording shows them.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from torch import nn

from benchmarks.diagbench.families import Site
from benchmarks.diagbench.models_dense import GradientMultiplier
from benchmarks.diagbench.setup import Config, Setup

TYPES = ("vanishing", "exploding", "dead_units", "saturation", "optimizer_divergence", "optimizer_instability",
         "nonfinite_loss", "nonfinite_data", "data_shift", "loss_spike", "update_stagnation", "mode_collapse",
         "imbalanced_learning", "output_range")
ORIGINS = ("node", "optimizer", "loss", "data", "architecture")
NONFINITE, DEAD, GRAD_VANISHING = "nonfinite:non-finite", "activation_regime:dead", "gradient_health:vanishing"
ALL = ("mlp", "resmlp", "cnn", "rnn", "transformer", "autoencoder", "twobranch")
FLOAT_INPUTS = ("mlp", "resmlp", "cnn", "rnn", "autoencoder", "twobranch")
ADAM = ("mlp", "resmlp", "rnn", "transformer", "autoencoder", "twobranch")


@dataclass(frozen=True)
class Fault:
    """One catalogue entry. ``site`` is the kind of family site it hits (None: not a place in the model);
    ``at_start`` faults exist from step 0 (onset 0; origin ``architecture``, or the optimizer for a learning
    rate wrong from the first step)."""

    name: str
    type: str
    origin: str
    injection: str
    symptom: str
    families: tuple[str, ...]
    site: str | None = None
    at_start: bool = False
    configs: dict[str, dict] = field(default_factory=dict)
    chain: tuple[str, ...] = ()


_DEEP_SIGMOID = {"mlp": {"task": "deep_sigmoid", "depth": 12, "activation": "sigmoid", "optimizer": "sgd",
                         "lr": 0.03},
                 "autoencoder": {"task": "deep_sigmoid", "activation": "sigmoid", "optimizer": "sgd", "lr": 0.1}}
_TANH = {"mlp": {"activation": "tanh", "optimizer": "sgd", "lr": 0.03}, "autoencoder": {"activation": "tanh"}}
_RELU = {"autoencoder": {"activation": "relu"}}
_SOFTMAX = {family: {"task": "softmax_output"} for family in ("mlp", "resmlp", "cnn")}
_CUSTOM = {family: {"loss": "custom"} for family in ("mlp", "resmlp", "cnn", "rnn", "autoencoder")}

FAULTS = (
    Fault("vanish_depth", "vanishing", "architecture", "12 (encoder: 7) sigmoid layers with Xavier init, SGD",
          "first-layer / output gradient ratio < 1e-4 over the first 20 steps", ("mlp", "autoencoder"),
          at_start=True, configs=_DEEP_SIGMOID),
    Fault("dead_init", "dead_units", "architecture", "nn.init.constant_(bias, -3) on every Linear before a ReLU",
          "≥ half of those ReLUs with dead share ≥ 0.99 over the first 20 steps",
          ("mlp", "autoencoder", "twobranch"), site="dead", at_start=True, configs=_RELU),
    Fault("vanish_weights", "vanishing", "node", "a layer's parameters ×1e-3 in place under no_grad (a units "
          "mix-up when reloading it; BatchNorm's γ, β in the CNN)",
          "its output rms ×≤ 1/30 over 5 steps (Adam regrows the weights within ~20)", ALL, site="scale",
          chain=(GRAD_VANISHING,)),
    Fault("explode_weights", "exploding", "node", "a layer's parameters ×30 in place under no_grad",
          "its output rms ×≥ 10 after t0, or a non-finite loss", ("mlp", "cnn", "autoencoder", "twobranch"),
          site="explode", chain=(NONFINITE,)),
    Fault("dead_bias", "dead_units", "node", "the bias before a ReLU/GELU filled with −20 under no_grad "
          "(BatchNorm's β in the CNN)", "dead share ≥ 0.99 for 20 steps",
          ("mlp", "resmlp", "cnn", "transformer", "autoencoder", "twobranch"), site="dead", configs=_RELU,
          chain=(GRAD_VANISHING,)),
    Fault("saturate_weights", "saturation", "node", "the weights before a tanh ×50 in place under no_grad",
          "saturated share ≥ 0.5 (or mean |tanh| ≥ 0.9) over 20 steps", ("mlp", "rnn", "autoencoder", "twobranch"),
          site="saturate", configs=_TANH),
    Fault("grad_bug", "exploding", "node", "a custom autograd.Function / gradient hook whose backward multiplies "
          "by 1e4 (gradient multiplier, OGM coefficient used as its reciprocal, layer-wise scaling hook)",
          "gradient rms before the module ×≥ 1e3 within 3 steps", ALL, site="grad"),
    Fault("freeze_requires_grad", "update_stagnation", "node", "block.requires_grad_(False) mid-run",
          "the block's updates exactly 0 from t0 on", ALL, site="freeze"),
    Fault("freeze_lr0", "update_stagnation", "node", "the lr of the block's param group (and scheduler base lr) "
          "set to 0 (a layer-wise lr decay bug)", "the block's updates exactly 0 from t0 on, gradients not",
          ALL, site="freeze"),
    Fault("embedding_copy", "mode_collapse", "node", "every embedding row overwritten with the mean row (new-token "
          "initialisation applied to the whole table)", "per-sample spread of the embedding output ≤ 1 % for 20 "
          "steps (measured by the loop)", ("transformer",), site="collapse"),
    Fault("code_dropout", "mode_collapse", "node", "the code's dropout-rate schedule reaches p = 1",
          "per-sample spread of the first decoder layer ≤ 1 % for 20 steps (measured by the loop)",
          ("autoencoder",), site="collapse"),
    Fault("lr_kill", "optimizer_divergence", "optimizer", "lr ×1000 in every param group (lr read in the wrong "
          "unit on resume)", "loss non-finite or ≥ 10× its median within 2 steps and over the next 20", ALL,
          chain=(NONFINITE,)),
    Fault("lr_unstable", "optimizer_instability", "optimizer", "Adam/AdamW lr ×30 in every param group",
          "loss peak ≥ 2× its median within 50 steps, finite and < 100×", ADAM, chain=(DEAD,)),
    Fault("schedule_ends_early", "update_stagnation", "optimizer", "linear-decay schedule told the steps of one "
          "epoch: lr reaches 0 at t0 and stays there", "every update exactly 0 from t0 on",
          ("resmlp", "cnn", "transformer", "autoencoder")),
    Fault("branch_lr", "imbalanced_learning", "optimizer", "the 0.01 lr multiplier meant for a pretrained part "
          "applied to one branch's param groups", "that branch's update norm ÷ the other's ×≤ 1/30",
          ("twobranch",), site="branch"),
    Fault("log_zero", "nonfinite_loss", "loss", "hand-written cross-entropy log(softmax(z / T)) with T set to "
          "1e-3 by a schedule: log(0)·0 = NaN", "loss non-finite at t0", ("mlp", "resmlp", "cnn", "rnn"),
          configs=_CUSTOM),
    Fault("empty_mask", "nonfinite_loss", "loss", "a loss averaged over an empty mask: every label masked "
          "(F.cross_entropy → NaN) or a masking-ratio schedule at 0 (0/0)", "loss non-finite at t0",
          ("transformer", "autoencoder"), configs={"autoencoder": {"loss": "custom"}}),
    Fault("loss_weight", "imbalanced_learning", "loss", "an auxiliary-loss weight typed 500 for 0.5",
          "that branch's gradient norm ÷ the other's ×≥ 30", ("twobranch",), site="branch"),
    Fault("nan_input", "nonfinite_data", "data", "one missing value parsed as NaN in one batch",
          "input non-finite at t0", FLOAT_INPUTS),
    Fault("zero_std", "nonfinite_data", "data", "a stuck sensor: the normaliser, refitted on the new shard, "
          "divides by a zero std (a flat-lined sequence z-normalised)", "input non-finite at t0",
          ("mlp", "resmlp", "rnn", "twobranch")),
    Fault("outlier_batch", "loss_spike", "data", "one corrupted batch: values ×100, random labels",
          "loss at t0 ≥ 10× the median of the 20 steps before", ("mlp", "cnn", "rnn", "autoencoder", "twobranch")),
    Fault("unnormalised", "data_shift", "data", "a refactor drops the normalisation (raw sensor units, images "
          "not divided by 255)", "input rms ×≥ 10 (20-step medians)", FLOAT_INPUTS),
)
RANGE_FAULTS = (
    Fault("relu_output", "output_range", "node", "a ReLU left on the output layer of a regression (an autoencoder "
          "of standardised features, half of them negative)", "the median loss of the last 50 steps ≥ 0.3 (the "
          "negative targets out of reach)", ("autoencoder",), site="range", at_start=True,
          configs={"autoencoder": {"task": "standardised_relu"}}),
    Fault("sigmoid_range", "output_range", "node", "a sigmoid output for standardised targets (outside [0, 1])",
          "the median loss of the last 50 steps ≥ 0.3", ("autoencoder",), site="range", at_start=True,
          configs={"autoencoder": {"task": "standardised_sigmoid"}}),
    Fault("softmax_ce", "output_range", "node", "F.cross_entropy given softmax probabilities instead of logits "
          "(the model ends in a softmax)", "the median loss of the last 50 steps ≥ 0.95 × log(1 + (C − 1)/e)",
          ("mlp", "resmlp", "cnn"), site="range", at_start=True, configs=_SOFTMAX),
)
"""Outputs that cannot reach their targets: present from step 0, named at the squashing module (origin node)."""
START_LR_FAULTS = (
    Fault("lr_start", "optimizer_divergence", "optimizer", "every param group's lr ×1000 from the first step (a "
          "learning rate typed in the wrong unit: 100 for 0.1)", "loss non-finite or ≥ 10× its first value "
          "within the first 10 steps", ALL, at_start=True),
)
"""A learning rate wrong from the first step: the first updates wreck an initialisation that was healthy at
step 0, so what they cause (dead units, exploding gradients) must not be read as the architecture's fault."""
FAULTS = FAULTS + RANGE_FAULTS + START_LR_FAULTS
FAULT_BY_NAME = {f.name: f for f in FAULTS}
assert all(f.type in TYPES and f.origin in ORIGINS for f in FAULTS)


def prepare(fault: Fault, config: Config, t0: int) -> Config:
    """The configuration of a faulty run: the fault's needs in this family, and configuration bugs."""
    config = replace(config, **fault.configs.get(config.family, {}))
    if fault.name == "schedule_ends_early":
        config = replace(config, schedule="linear_decay", decay_end=t0)
    return config


def _module(setup: Setup, path: str) -> nn.Module:
    return setup.model.get_submodule(path)


def _scale_lr(setup: Setup, factor: float, prefix: str = "") -> None:
    for i, group in enumerate(setup.optimizer.param_groups):
        if not prefix or group["name"] == prefix or group["name"].startswith(prefix + "."):
            group["lr"] *= factor
            if setup.scheduler is not None:
                setup.scheduler.base_lrs[i] *= factor


def _multiply_output_gradient(module: nn.Module, factor: float) -> None:
    def hook(_: nn.Module, __: object, output: torch.Tensor) -> None:
        if output.requires_grad:
            output.register_hook(lambda grad: grad * factor)
    module.register_forward_hook(hook)


def at_build(fault: Fault, setup: Setup, sites: tuple[Site, ...]) -> None:
    """Faults of the initialisation, applied right after the model is built."""
    if fault.name == "lr_start":
        _scale_lr(setup, 1000.0)
    if fault.name == "dead_init":
        with torch.no_grad():
            for site in sites:
                nn.init.constant_(_module(setup, site.target).bias, -3.0)


def inject(fault: Fault, setup: Setup, site: Site | None) -> None:
    """Apply ``fault`` at the start of step t0 (``site``: the chosen place, for faults that have one)."""
    name = fault.name
    with torch.no_grad():
        if name in ("vanish_weights", "explode_weights", "saturate_weights"):
            factor = {"vanish_weights": 1e-3, "explode_weights": 30.0, "saturate_weights": 50.0}[name]
            for parameter in _module(setup, site.target).parameters(recurse=False):
                parameter.mul_(factor)
        elif name == "dead_bias":
            _module(setup, site.target).bias.fill_(-20.0)
        elif name == "embedding_copy":
            weight = _module(setup, site.target).weight
            weight.copy_(weight.mean(dim=0, keepdim=True).expand_as(weight))
    if name == "grad_bug":
        target = site.target
        if target in ("branch_a", "branch_b"):
            setup.model.coefficients[0 if target == "branch_a" else 1] = 1e4
        elif isinstance(_module(setup, target), GradientMultiplier):
            _module(setup, target).factor = 1e4
        else:
            _multiply_output_gradient(_module(setup, target), 1e4)
    elif name == "freeze_requires_grad":
        _module(setup, site.target).requires_grad_(False)
    elif name == "freeze_lr0":
        _scale_lr(setup, 0.0, site.target)
    elif name == "code_dropout":
        setup.model.code_dropout = 1.0
    elif name == "lr_kill":
        _scale_lr(setup, 1000.0)
    elif name == "lr_unstable":
        _scale_lr(setup, 30.0)
    elif name == "branch_lr":
        _scale_lr(setup, 0.01, f"branch_{site.target}")
    elif name == "log_zero":
        setup.knobs["temperature"] = 1e-3
    elif name == "empty_mask":
        if "mask_ratio" in setup.knobs and setup.config.loss == "custom":
            setup.knobs["mask_ratio"] = 0.0
        else:
            setup.pipeline.corrupt("empty_labels")
    elif name == "loss_weight":
        setup.knobs[f"weight_{site.target}"] = 500.0
    elif name in ("nan_input", "zero_std", "outlier_batch", "unnormalised"):
        setup.pipeline.corrupt({"nan_input": "nan_element", "outlier_batch": "outlier"}.get(name, name))

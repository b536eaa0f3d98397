"""What one training run is made of: its configuration (``Config``, plain frozen data) and the live objects
built from it (``Setup``: model, optimizer, schedule, data pipeline, loss), plus the optimizer and schedule
factories every family shares.

Parameters are put in one optimizer parameter group per block (``blocks.3``, ``encoder.2``, ``branch_a.0``,
``head``…), as code with layer-wise learning rates does; a group's ``"name"`` says which block it holds.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from benchmarks.diagbench.pipeline import Pipeline

STEPS = 300
SCHEDULES = ("constant", "step", "warmup_cosine", "linear_decay")


@dataclass(frozen=True)
class Config:
    """A training configuration of one family; empty fields take the family's defaults.

    ``loss``: ``hooked`` (a criterion module, also passed to ``NeuralDbg(loss=...)``), ``module`` (a
    criterion module the recorder is not told about), ``functional`` (``F.cross_entropy`` / ``F.mse_loss``)
    or ``custom`` (a hand-written function). ``schedule``: see ``SCHEDULES``; ``decay_end`` is the step at
    which ``linear_decay`` reaches 0 (default: the end of the run). ``frozen`` names a block frozen on
    purpose from step 0. ``task`` picks a family-specific variant (an easier task, a deeper model…).
    """

    name: str
    family: str
    activation: str = ""
    optimizer: str = ""
    lr: float = 0.0
    weight_decay: float = 0.0
    schedule: str = "constant"
    decay_end: int = 0
    batch_size: int = 0
    depth: int = 0
    loss: str = "functional"
    clip: float = 0.0
    accumulate: int = 1
    eval_every: int = 0
    task: str = "default"
    frozen: str = ""
    cell: str = "gru"
    init: str = "default"


LossFn = Callable[["Setup", list[torch.Tensor], torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@dataclass
class Setup:
    """The live objects of one run. ``loss_fn(setup, inputs, target)`` runs the forward pass and returns
    ``(loss, model output)``; ``knobs`` are values the loss or the loop reads at every step (a temperature,
    loss weights, a masking ratio) — faults that are configuration bugs change them. ``watch`` lists module
    paths whose per-sample spread the training loop measures as ground truth (the model output always)."""

    config: Config
    model: nn.Module
    optimizer: torch.optim.Optimizer
    pipeline: Pipeline
    loss_fn: LossFn
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
    criterion: nn.Module | None = None
    knobs: dict[str, float] = field(default_factory=dict)
    watch: tuple[str, ...] = ()
    register: Callable[..., torch.Tensor] = lambda name, tensor, **_: tensor

    def forward_loss(self, inputs: list[torch.Tensor], target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.loss_fn(self, inputs, target)


def group_name(parameter_name: str) -> str:
    """The block a parameter belongs to: ``blocks.3.fc1.weight`` → ``blocks.3``, ``head.bias`` → ``head``."""
    parts = parameter_name.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 and parts[1].isdigit() else parts[0]


def make_optimizer(config: Config, model: nn.Module) -> torch.optim.Optimizer:
    """SGD with momentum 0.9, Adam or AdamW over one parameter group per block (trainable parameters only,
    so a block frozen on purpose, ``config.frozen``, is left out as people do)."""
    if config.frozen:
        model.get_submodule(config.frozen).requires_grad_(False)
    groups: dict[str, list[nn.Parameter]] = {}
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            groups.setdefault(group_name(name), []).append(parameter)
    param_groups = [{"params": params, "name": name} for name, params in groups.items()]
    if config.optimizer == "sgd":
        return torch.optim.SGD(param_groups, lr=config.lr, momentum=0.9, weight_decay=config.weight_decay)
    if config.optimizer == "adamw":
        return torch.optim.AdamW(param_groups, lr=config.lr, weight_decay=config.weight_decay or 0.01)
    if config.optimizer == "adam":
        return torch.optim.Adam(param_groups, lr=config.lr, weight_decay=config.weight_decay)
    raise ValueError(f"unknown optimizer {config.optimizer!r}; choose sgd, adam or adamw")


def lr_factor(config: Config, step: int, steps: int = STEPS) -> float:
    """The schedule's multiplier of the base learning rate after ``step`` scheduler steps."""
    if config.schedule == "constant":
        return 1.0
    if config.schedule == "step":
        return 0.1 ** ((step >= steps // 2) + (step >= 3 * steps // 4))
    if config.schedule == "warmup_cosine":
        warmup = steps // 10
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / (steps - warmup))))
    if config.schedule == "linear_decay":
        end = config.decay_end or steps
        return max(0.0, 1.0 - step / end)
    raise ValueError(f"unknown schedule {config.schedule!r}; choose one of {SCHEDULES}")


def make_scheduler(config: Config, optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR | None:
    if config.schedule == "constant":
        return None
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(config, step))

"""diagbench runs: the configurations, the fault catalogue, injection at step t0 and recorded training.

A run is described by a frozen ``RunSpec`` (plain data, picklable for worker processes). ``train_run``
trains it with the real ``Recorder`` and returns the path of its recording; faults are injected by changing
module, data-source or optimizer state at the start of step ``t0`` — the training loop is the same for all.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from torch import nn

from benchmarks.diagbench.data import IN_DIM, NUM_CLASSES, Batches, make_dataset
from benchmarks.diagbench.models import LossHead, build_model
from comgra_ndbg import Recorder

STEPS = 400
BATCH_SIZE = 64
T0 = 200
TRUTH_FILE = "truth.json"
STOP_AFTER_NONFINITE = 20  # like most trainers, the loop gives up 20 steps after the loss turned non-finite


@dataclass(frozen=True)
class Config:
    """A training configuration (model, optimizer, schedule, task)."""

    name: str
    architecture: str = "mlp"
    activation: str = "relu"
    depth: int = 6
    optimizer: str = "adam"
    lr: float = 1e-3
    schedule: str = "constant"  # or "warmup_decay": linear warm-up over 50 steps, ×0.1 at step 250
    task: str = "classification"
    init: str = "default"  # or "xavier", or "bias-3" (every bias −3 at init)


HEALTHY_CONFIGS = (
    Config("relu_adam"),
    Config("relu_sgd", optimizer="sgd", lr=0.03),
    Config("tanh_sgd", activation="tanh", optimizer="sgd", lr=0.03),
    Config("sigmoid_shallow_adam", activation="sigmoid", depth=3),
    Config("warmup_decay", schedule="warmup_decay"),
    Config("easy_task", task="easy"),
    Config("regression_tanh", activation="tanh", task="regression"),
    Config("residual_ln", architecture="residual"),
    Config("cnn", architecture="cnn", depth=4),
)


@dataclass(frozen=True)
class Fault:
    """One entry of the fault catalogue (see DIAGBENCH.md); ``chain`` lists the expected secondary effects
    as event labels that must follow from the hypothesis' root — scored only where the recording shows them."""

    id: str
    name: str
    type: str
    origin: str  # "block", "optimizer", "loss", "data" or "architecture"
    config: Config
    at_init: bool = False
    rotate_architecture: bool = False
    chain: tuple[str, ...] = ()


NONFINITE = "nonfinite:non-finite"
GRADIENT_VANISHING = "gradient_health:vanishing"
DEAD_UNITS = "activation_regime:dead"

FAULTS = (
    Fault("F1", "vanish_depth", "vanishing", "architecture",
          Config("sigmoid12", activation="sigmoid", depth=12, optimizer="sgd", lr=0.03, init="xavier"), at_init=True),
    Fault("F2", "vanish_scale", "vanishing", "block", Config("relu_adam"), rotate_architecture=True,
          chain=(GRADIENT_VANISHING,)),
    Fault("F3", "explode_scale", "exploding", "block", Config("relu_sgd", optimizer="sgd", lr=0.03),
          chain=(NONFINITE,)),
    Fault("F4", "dead_relu", "dead_units", "block", Config("relu_adam"), rotate_architecture=True,
          chain=(GRADIENT_VANISHING,)),
    Fault("F5", "saturate", "saturation", "block", Config("tanh_sgd", activation="tanh", optimizer="sgd", lr=0.03)),
    Fault("F6", "lr_spike", "optimizer_divergence", "optimizer", Config("relu_sgd", optimizer="sgd", lr=0.03),
          rotate_architecture=True, chain=(NONFINITE,)),
    Fault("F7", "lr_oscillate", "optimizer_instability", "optimizer", Config("relu_adam"), rotate_architecture=True,
          chain=(DEAD_UNITS,)),
    Fault("F8", "log_zero", "nonfinite_loss", "loss", Config("relu_adam"), rotate_architecture=True),
    Fault("F9", "nan_input", "nonfinite_data", "data", Config("relu_adam"), rotate_architecture=True),
    Fault("F10", "outlier_batch", "loss_spike", "data", Config("relu_adam"), rotate_architecture=True),
    Fault("F11", "dead_init", "dead_units", "architecture", Config("relu_bias-3", init="bias-3"), at_init=True),
    Fault("F12", "grad_scale_bug", "exploding", "block", Config("relu_adam"), rotate_architecture=True),
    Fault("F13", "frozen_layer", "update_stagnation", "block", Config("relu_adam"), rotate_architecture=True),
)
FAULT_BY_ID = {f.id: f for f in FAULTS}
FAULT_SEEDS = 5
HEALTHY_SEEDS = 10


@dataclass(frozen=True)
class RunSpec:
    """One run: a configuration, a seed and, for faulty runs, the fault, its block and its step."""

    name: str
    config: Config
    seed: int
    fault: str | None = None
    block: int | None = None
    t0: int | None = None

    @property
    def healthy(self) -> bool:
        return self.fault is None


def fault_spec(fault: Fault, seed: int) -> RunSpec:
    config = fault.config
    if fault.rotate_architecture and seed % FAULT_SEEDS == 3:
        config = replace(config, name=config.name + "+residual", architecture="residual")
    elif fault.rotate_architecture and seed % FAULT_SEEDS == 4:
        config = replace(config, name=config.name + "+cnn", architecture="cnn", depth=4)
    block = None if fault.origin != "block" else (seed + int(fault.id[1:])) % config.depth
    return RunSpec(f"{fault.id}-{fault.name}-s{seed}", config, seed, fault.id, block,
                   0 if fault.at_init else T0)


def all_specs(smoke: bool = False, seed_offset: int = 0) -> list[RunSpec]:
    """Every run of the full benchmark (5 seeds per fault, 10 per healthy configuration), or of the smoke
    subset: one seed per fault (fault i gets seed i mod 5, so the smoke set still mixes architectures and
    blocks) and one per healthy configuration. ``seed_offset`` shifts every seed, for a held-out run on
    seeds the thresholds were never looked at with."""
    if smoke:
        specs = [fault_spec(f, seed_offset + i % FAULT_SEEDS) for i, f in enumerate(FAULTS)]
        return specs + [healthy_spec(c, seed_offset) for c in HEALTHY_CONFIGS]
    specs = [fault_spec(f, seed_offset + s) for f in FAULTS for s in range(FAULT_SEEDS)]
    return specs + [healthy_spec(c, seed_offset + s) for c in HEALTHY_CONFIGS for s in range(HEALTHY_SEEDS)]


def healthy_spec(config: Config, seed: int) -> RunSpec:
    return RunSpec(f"H-{config.name}-s{seed}", config, 100 + seed)


# ---- training ------------------------------------------------------------------------------------------------
def _optimizer(config: Config, model: nn.Module) -> torch.optim.Optimizer:
    # one parameter group per module that owns parameters, so a fault can freeze one layer via its group
    groups: dict[str, list[nn.Parameter]] = {}
    for name, parameter in model.named_parameters():
        groups.setdefault(name.rpartition(".")[0], []).append(parameter)
    param_groups = [{"params": ps, "module": module} for module, ps in groups.items()]
    if config.optimizer == "sgd":
        return torch.optim.SGD(param_groups, lr=config.lr)
    return torch.optim.Adam(param_groups, lr=config.lr)


def _schedule(config: Config, optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR | None:
    if config.schedule != "warmup_decay":
        return None
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / 50) * (0.1 if step >= 250 else 1.0))


def inject(spec: RunSpec, model: nn.Module, loss_head: LossHead, optimizer: torch.optim.Optimizer,
           batches: Batches) -> None:
    """Change module, data-source or optimizer state at the start of step t0."""
    k = spec.block
    block = model.blocks[k] if k is not None else None
    with torch.no_grad():
        if spec.fault == "F2":
            block.scale.factor = 1e-3
        elif spec.fault == "F3":
            block.scale.factor = 30.0
        elif spec.fault == "F4":
            block.linear.bias.fill_(-20.0)
        elif spec.fault == "F5":
            block.linear.weight.mul_(50.0)
        elif spec.fault == "F6":
            for group in optimizer.param_groups:
                group["lr"] = 20.0
        elif spec.fault == "F7":
            for group in optimizer.param_groups:
                group["lr"] = 3e-2
        elif spec.fault == "F8":
            loss_head.force_zero_probability = True
        elif spec.fault == "F9":
            batches.corrupt = "nan"
        elif spec.fault == "F10":
            batches.corrupt = "outlier"
        elif spec.fault == "F12":
            block.scale.grad_factor = 1e4
        elif spec.fault == "F13":
            prefix = f"blocks.{k}.linear"
            for group in optimizer.param_groups:
                if group["module"] == prefix:
                    group["lr"] = 0.0


def build(spec: RunSpec) -> tuple[nn.Module, LossHead, torch.optim.Optimizer, Batches]:
    config = spec.config
    torch.manual_seed(spec.seed)
    out_dim = NUM_CLASSES
    model = build_model(config.architecture, IN_DIM, out_dim, depth=config.depth, activation=config.activation,
                        init="xavier" if config.init == "xavier" else "default")
    if config.init == "bias-3":
        with torch.no_grad():
            for block in model.blocks:
                block.linear.bias.fill_(-3.0)
    x, y = make_dataset(config.task, spec.seed)
    batches = Batches(x, y, batch_size=BATCH_SIZE, seed=spec.seed, task=config.task)
    return model, LossHead("regression" if config.task == "regression" else "classification"), \
        _optimizer(config, model), batches


def train_run(spec: RunSpec, folder: Path, *, steps: int = STEPS, enabled: bool = True) -> Path:
    """Train and record ``spec`` into ``folder/<spec.name>``; the ground truth goes to ``truth.json`` there.

    Every block's pre-activation and output, the input, the logits and the loss are registered, the model's
    parameters tracked (value, gradient, update), the loss recorded as a KPI; summaries every step, no
    snapshots.
    """
    model, loss_head, optimizer, batches = build(spec)
    schedule = _schedule(spec.config, optimizer)
    first_nonfinite = None
    with Recorder(folder, trial=spec.name, enabled=enabled, summaries=1, snapshots=False,
                  flush_every_seconds=3600.0) as rec:
        rec.track_module("model", model)
        for step in range(steps):
            if first_nonfinite is not None and step - first_nonfinite >= STOP_AFTER_NONFINITE:
                break
            if spec.fault is not None and step == spec.t0 and not FAULT_BY_ID[spec.fault].at_init:
                inject(spec, model, loss_head, optimizer, batches)
            x, y = batches.next()
            with rec.step(step):
                optimizer.zero_grad(set_to_none=True)
                rec.register_tensor("input", x, role="input")
                logits = rec.register_tensor("logits", model(x, rec.register_tensor), role="output")
                loss = rec.register_tensor("loss", loss_head(logits, y), role="loss")
                loss.backward()
                rec.record_gradients()
                optimizer.step()
                if schedule is not None:
                    schedule.step()
                rec.record_kpi("loss", loss)
            if first_nonfinite is None and not torch.isfinite(loss):
                first_nonfinite = step
    path = folder / spec.name
    path.mkdir(parents=True, exist_ok=True)
    (path / TRUTH_FILE).write_text(json.dumps(truth(spec), indent=1))
    return path


def truth(spec: RunSpec) -> dict:
    """Ground truth stored with the run."""
    if spec.fault is None:
        return {"healthy": True, "config": asdict(spec.config), "seed": spec.seed}
    fault = FAULT_BY_ID[spec.fault]
    origin = f"block:{spec.block}" if fault.origin == "block" else fault.origin
    return {"healthy": False, "fault": fault.id, "name": fault.name, "type": fault.type, "origin": origin,
            "t0": spec.t0, "block": spec.block, "config": asdict(spec.config), "seed": spec.seed,
            "chain": list(fault.chain)}

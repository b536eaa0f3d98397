"""Four more fault cases of the ``loop`` family (:mod:`benchmarks.diagbench.families_loop`), written the same
way: an ordinary loop with the mistake and a fixed twin that resembles it, the ground truth measured by the
loop itself, never through the recorder.

- ``update_guard_stuck`` (``no_optimizer_step``): a guard that skips ``optimizer.step()`` after a bad batch is
  never reset, so every step from t0 computes and clears gradients and changes nothing; the twin resets it
  after the one step it skips.
- ``resume_assign`` (``foreign_parameters``): resuming from a checkpoint, the optimizer is built first and the
  weights are loaded after it with ``load_state_dict(..., assign=True)``, which puts new parameter objects
  into the model: the optimizer holds the old ones; the twin loads without ``assign`` (a copy into the
  parameters the optimizer holds).
- ``validation_train_mode`` (``train_mode_evaluation``): from t0 the validation routine lost its
  ``model.eval()``, so its passes under ``torch.no_grad()`` run BatchNorm in training mode and overwrite
  its running statistics; the twin calls ``model.eval()`` before validating and
  ``model.train()`` after.
- ``step_guard_never_true`` (``no_step_end``): from t0 the loop accumulates gradients over micro-batches,
  but the condition that should step the optimizer and clear the gradients every 4 passes never holds, so no
  step ends again; the twin's condition holds every 4th pass.
"""
from __future__ import annotations

import torch
from torch import nn

from benchmarks.diagbench.families_loop import BATCH, STEPS, LoopRun, Record, _images, batches, mlp, step_once
from benchmarks.diagbench.models_seq import SmallResNet

__all__ = ["FAULTS", "update_guard_stuck", "resume_assign", "validation_train_mode", "step_guard_never_true"]

VALIDATE_EVERY = 8
VALIDATION_BATCHES = 3
ACCUMULATE = 4


def _snapshot(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _unchanged(before: list[torch.Tensor], model: nn.Module) -> bool:
    return all(torch.equal(b, p.detach()) for b, p in zip(before, model.parameters()))


def update_guard_stuck(record: Record, run: LoopRun, fixed: bool) -> None:
    """A guard meant to skip the update of one bad batch fires at t0 and is never reset: from then on every
    step computes and clears gradients without ``optimizer.step()`` (the twin resets the guard after the one
    step it skips)."""
    model = mlp(run.seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = batches(run.seed)
    skip_update, still = False, 0
    with record(model):
        for step in range(STEPS):
            x, y = next(data)
            if step == run.t0:
                skip_update = True  # the guard fires (a loss spike in the original loop)
            optimizer.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            before = _snapshot(model)
            if not skip_update:
                optimizer.step()
            elif fixed:
                skip_update = False
            still = still + 1 if _unchanged(before, model) else 0
            if still == 3 and not run.symptom:
                run.symptom, run.effect = True, step - 2
            run.losses.append(float(loss.detach()))


def resume_assign(record: Record, run: LoopRun, fixed: bool) -> None:
    """Resuming from a checkpoint: the optimizer is built, then the weights are loaded with
    ``load_state_dict(checkpoint, assign=True)``, which replaces the model's parameter objects, so the
    optimizer updates the old ones and the model never changes (the twin loads without ``assign``)."""
    pretrained = mlp(run.seed + 100)
    warm = torch.optim.SGD(pretrained.parameters(), lr=0.05)
    data = batches(run.seed + 100)
    for _ in range(5):  # the checkpoint: a few steps of an earlier run
        step_once(pretrained, warm, *next(data))
    checkpoint = {name: tensor.detach().clone() for name, tensor in pretrained.state_dict().items()}
    model = mlp(run.seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.load_state_dict(checkpoint, assign=not fixed)
    start = model.head.weight.detach().clone()
    data = batches(run.seed)
    with record(model):
        for _ in range(STEPS):
            run.losses.append(step_once(model, optimizer, *next(data)))
    run.symptom, run.effect = bool(torch.equal(start, model.head.weight.detach())), 0


def validation_train_mode(record: Record, run: LoopRun, fixed: bool) -> None:
    """``SmallResNet`` on scaled prototype images, validated every 8 steps on 3 batches under
    ``torch.no_grad()``; from the first validation at or after t0 the routine no longer calls
    ``model.eval()`` (the twin always does, and ``model.train()`` after it). Symptom: a validation pass that
    changed BatchNorm's running statistics; effect: the training step it follows."""
    images, labels = _images(run.seed)
    torch.manual_seed(run.seed)
    model = SmallResNet(6)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(run.seed)
    with record(model):
        for step in range(STEPS):
            index = torch.randint(0, len(labels), (BATCH,), generator=g)
            run.losses.append(step_once(model, optimizer, images[index], labels[index]))
            if step % VALIDATE_EVERY != VALIDATE_EVERY - 1:
                continue
            switch = fixed or step < run.t0
            if switch:
                model.eval()
            before = model.stem.bn.running_mean.clone()
            with torch.no_grad():
                for b in range(VALIDATION_BATCHES):
                    model(images[64 * b:64 * (b + 1)])
            if not torch.equal(before, model.stem.bn.running_mean) and not run.symptom:
                run.symptom, run.effect = True, step
            if switch:
                model.train()


def step_guard_never_true(record: Record, run: LoopRun, fixed: bool) -> None:
    """Steps every pass until t0, then accumulates over micro-batches with ``optimizer.step()`` and
    ``zero_grad()`` behind ``step % 4 == 4``, which never holds: the parameters stop changing and the
    gradients add up (the twin's condition, ``step % 4 == 3``, steps every 4th pass)."""
    model = mlp(run.seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = batches(run.seed)
    still = 0
    with record(model):
        for step in range(STEPS):
            x, y = next(data)
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            before = _snapshot(model)
            if step < run.t0 or step % ACCUMULATE == (ACCUMULATE - 1 if fixed else ACCUMULATE):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            still = still + 1 if _unchanged(before, model) else 0
            if still == 2 * ACCUMULATE and not run.symptom:
                run.symptom, run.effect = True, step - still + 1
            run.losses.append(float(loss.detach()))


FAULTS = (
    ("update_guard_stuck", "no_optimizer_step", update_guard_stuck, "update_stagnation", "loop", (), True),
    ("resume_assign", "foreign_parameters", resume_assign, "update_stagnation", "optimizer", (), False),
    ("validation_train_mode", "train_mode_evaluation", validation_train_mode, "wrong_mode", "loop", (), True),
    ("step_guard_never_true", "no_step_end", step_guard_never_true, "update_stagnation", "loop", (), True),
)
"""The cases, in the form of ``families_loop._FAULTS``: name, invariant, loop, expected type and origin,
module paths (origin ``node``), whether the mistake starts at t0."""

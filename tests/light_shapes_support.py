"""Training loops of the shapes users write beyond the plain one, for ``test_light_steps_shapes``.

Each loop trains ``model`` under ``watch(optimizer=..., loss=...)`` (NeuralDbg, or nothing for a bare run)
with or without naming its optimizer (``named``), on data made here, the same for every run.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["LR", "SHAPES", "STEPS", "Watch", "make_batches"]

STEPS = 100
LR = 0.05

Watch = Callable[..., Any]
"""``watch(optimizer=..., loss=...)``: the context manager a loop trains under (NeuralDbg, or nothing)."""


def make_batches(count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(2)
    return [(torch.randn(4, 6, generator=g), torch.randint(0, 3, (4,), generator=g)) for _ in range(count)]


def _hand_sgd(model: nn.Module) -> None:
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p -= LR * p.grad


def hand_update(model, watch: Watch, named: bool) -> None:
    """No optimizer at all: the update and the clearing of the gradients written by hand."""
    with watch():
        for x, y in make_batches(STEPS):
            F.cross_entropy(model(x), y).backward()
            _hand_sgd(model)
            model.zero_grad()


def hand_update_zeroed(model, watch: Watch, named: bool) -> None:
    """An optimizer only clears the gradients, in place (``set_to_none=False``); the update is by hand."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    with watch(optimizer=optimizer if named else None):
        for x, y in make_batches(STEPS):
            optimizer.zero_grad(set_to_none=False)
            F.cross_entropy(model(x), y).backward()
            _hand_sgd(model)


def clipped(model, watch: Watch, named: bool) -> None:
    """WGAN's critic: the optimizer steps, then the weights are clipped by hand."""
    optimizer = torch.optim.RMSprop(model.parameters(), lr=LR)
    with watch(optimizer=optimizer if named else None):
        for x, y in make_batches(STEPS):
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
            with torch.no_grad():
                for p in model.parameters():
                    p.clamp_(-0.3, 0.3)


def ema(model, watch: Watch, named: bool) -> None:
    """An exponential moving average of the weights kept in a copy after each step, and a parameter reset
    by hand between steps now and then."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    average = [p.detach().clone() for p in model.parameters()]
    with watch(optimizer=optimizer if named else None):
        for step, (x, y) in enumerate(make_batches(STEPS)):
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
            with torch.no_grad():
                for kept, p in zip(average, model.parameters()):
                    kept.lerp_(p, 0.1)
                if step % 25 == 24:
                    model.out.bias.zero_()


def _sam(model, watch: Watch, named: bool, set_to_none: bool) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    with watch(optimizer=optimizer if named else None):
        for x, y in make_batches(STEPS):
            optimizer.zero_grad(set_to_none=set_to_none)
            F.cross_entropy(model(x), y).backward()
            with torch.no_grad():
                moves = [0.05 * p.grad / (p.grad.norm() + 1e-12) for p in model.parameters()]
                for p, move in zip(model.parameters(), moves):
                    p += move
            optimizer.zero_grad(set_to_none=set_to_none)
            F.cross_entropy(model(x), y).backward()
            with torch.no_grad():
                for p, move in zip(model.parameters(), moves):
                    p -= move
            optimizer.step()


def sam(model, watch: Watch, named: bool) -> None:
    """Sharpness-aware minimisation: a pass, the weights moved uphill by hand, a second pass, the weights put
    back, then the optimizer step (the full path sees two steps: the hand update between the passes ends one)."""
    _sam(model, watch, named, True)


def sam_zeroed(model, watch: Watch, named: bool) -> None:
    """The same with the gradients cleared in place between the two passes."""
    _sam(model, watch, named, False)


def _inner_step(model, watch: Watch, named: bool, parameters: Callable[[nn.Module], Any], start: int = 0) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    batches = make_batches(2 * STEPS)
    with watch(optimizer=optimizer if named else None):
        for i in range(0, len(batches), 2):
            optimizer.zero_grad()
            F.cross_entropy(model(batches[i][0]), batches[i][1]).backward()
            if i >= 2 * start:
                with torch.no_grad():
                    for p in parameters(model):
                        p -= LR * p.grad
            F.cross_entropy(model(batches[i + 1][0]), batches[i + 1][1]).backward()
            optimizer.step()


def inner_step(model, watch: Watch, named: bool) -> None:
    """A step by hand between two passes whose gradients accumulate (no clearing between them), then the
    optimizer's step: the full path sees two steps."""
    _inner_step(model, watch, named, nn.Module.parameters)


def inner_step_last_layer(model, watch: Watch, named: bool) -> None:
    """The same, the step by hand moving the last layer only."""
    _inner_step(model, watch, named, lambda m: m.out.parameters())


def inner_step_late(model, watch: Watch, named: bool) -> None:
    """The step by hand between the passes begins only after the first light steps (at step 50)."""
    _inner_step(model, watch, named, nn.Module.parameters, start=50)


def zeroed_in_place(model, watch: Watch, named: bool) -> None:
    """``zero_grad(set_to_none=False)`` in a plain loop."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    with watch(optimizer=optimizer if named else None):
        for x, y in make_batches(STEPS):
            optimizer.zero_grad(set_to_none=False)
            F.cross_entropy(model(x), y).backward()
            optimizer.step()


def accumulated(model, watch: Watch, named: bool) -> None:
    """Four micro-batches per optimizer step, the gradients cleared only at the step."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    with watch(optimizer=optimizer if named else None):
        for i, (x, y) in enumerate(make_batches(4 * STEPS)):
            (F.cross_entropy(model(x), y) / 4).backward()
            if i % 4 == 3:
                optimizer.step()
                optimizer.zero_grad()


def accumulated_unevenly(model, watch: Watch, named: bool) -> None:
    """Micro-batches per optimizer step that vary (a token budget per step): one at most steps, six now and
    then, more than twice the passes of the full step before."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    counts = [6 if step % 9 == 5 else 1 for step in range(STEPS)]
    batches = iter(make_batches(sum(counts)))
    with watch(optimizer=optimizer if named else None):
        for count in counts:
            for _ in range(count):
                x, y = next(batches)
                (F.cross_entropy(model(x), y) / count).backward()
            optimizer.step()
            optimizer.zero_grad()


def _skipping(model, watch: Watch, named: bool, set_to_none: bool) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    with watch(optimizer=optimizer if named else None):
        for step, (x, y) in enumerate(make_batches(STEPS)):
            optimizer.zero_grad(set_to_none=set_to_none)
            F.cross_entropy(model(x), y).backward()
            if step % 7 != 3:  # a GradScaler skips the step when the gradients hold inf
                optimizer.step()


def skipping(model, watch: Watch, named: bool) -> None:
    """The optimizer step skipped now and then (as a GradScaler does on inf)."""
    _skipping(model, watch, named, True)


def skipping_zeroed(model, watch: Watch, named: bool) -> None:
    """The same, the gradients cleared in place."""
    _skipping(model, watch, named, False)


def _scaled(model, watch: Watch, named: bool, set_to_none: bool) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8, growth_interval=5)
    with watch(optimizer=optimizer if named else None):
        for step, (x, y) in enumerate(make_batches(STEPS)):
            optimizer.zero_grad(set_to_none=set_to_none)
            loss = F.cross_entropy(model(x), y)
            if step % 7 == 3:  # an overflow: the scaler skips this step and lowers its scale
                loss = loss * float("inf")
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()


def grad_scaler(model, watch: Watch, named: bool) -> None:
    """A real ``GradScaler``: the loss scaled, the gradients unscaled before the step, which it skips on
    inf."""
    _scaled(model, watch, named, True)


def grad_scaler_zeroed(model, watch: Watch, named: bool) -> None:
    """The same, the gradients cleared in place."""
    _scaled(model, watch, named, False)


def two_tasks(model, watch: Watch, named: bool) -> None:
    """Two tasks' gradients taken one after the other, cleared between them, combined by hand (gradient
    surgery, as PCGrad does): the full path sees two steps, the gradients cleared after the first backward."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    batches = make_batches(2 * STEPS)
    with watch(optimizer=optimizer if named else None):
        for i in range(0, len(batches), 2):
            grads = []
            for x, y in batches[i:i + 2]:
                optimizer.zero_grad()
                F.cross_entropy(model(x), y).backward()
                grads.append([p.grad.clone() for p in model.parameters()])
            for p, first, second in zip(model.parameters(), *grads):
                p.grad = (first + second) / 2
            optimizer.step()


def eval_metric_mid_step(model, watch: Watch, named: bool) -> None:
    """A metric pass in eval() mode between the backward call and the optimizer step."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    with watch(optimizer=optimizer if named else None):
        for x, y in make_batches(STEPS):
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            model.eval()
            with torch.no_grad():
                model(x)
            model.train()
            optimizer.step()


def lbfgs(model, watch: Watch, named: bool) -> None:
    """A closure optimizer: L-BFGS evaluates the closure (a forward and a backward pass) several times per
    step and moves the weights between evaluations."""
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=3)
    with watch(optimizer=optimizer if named else None):
        for x, y in make_batches(STEPS // 2):
            def closure() -> torch.Tensor:
                optimizer.zero_grad()
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                return loss

            optimizer.step(closure)


def two_backwards(model, watch: Watch, named: bool) -> None:
    """Two losses of one forward pass, each with its own ``backward()``."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    criterion = nn.CrossEntropyLoss()
    with watch(optimizer=optimizer if named else None, loss=criterion if named else None):
        for x, y in make_batches(STEPS):
            optimizer.zero_grad()
            out = model(x)
            criterion(out, y).backward(retain_graph=True)
            (0.1 * out.pow(2).mean()).backward()
            optimizer.step()


def metric_mid_step(model, watch: Watch, named: bool) -> None:
    """A pass without gradients for a metric between the backward call and the optimizer step."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    with watch(optimizer=optimizer if named else None):
        for x, y in make_batches(STEPS):
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            with torch.no_grad():
                model(x).argmax(1).eq(y).float().mean()
            optimizer.step()


def scheduled(model, watch: Watch, named: bool) -> None:
    """A one-cycle schedule stepping per batch."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=STEPS)
    with watch(optimizer=optimizer if named else None):
        for x, y in make_batches(STEPS):
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
            schedule.step()


SHAPES = {f.__name__: f for f in (
    hand_update, hand_update_zeroed, clipped, ema, sam, sam_zeroed, inner_step, inner_step_last_layer,
    inner_step_late, zeroed_in_place, accumulated, accumulated_unevenly, skipping, skipping_zeroed, grad_scaler,
    grad_scaler_zeroed, two_tasks, lbfgs, two_backwards, metric_mid_step, eval_metric_mid_step, scheduled)}

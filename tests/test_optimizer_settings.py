"""Optimizer settings no training wants, read by the loop invariants at every optimizer step (full or light):
a moving average's factor of 1 or more, a negative weight decay, and a learning rate turned negative (from
the ``lr/<group>`` KPIs) — each dated where the optimizer first used it, mid-run edits of ``param_groups``
included."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from comgra_ndbg import NeuralDbg
from comgra_ndbg.analysis import analyze
from comgra_ndbg.instrument.loop_rules import optimizer_setting

STEPS = 70


@pytest.mark.parametrize("group, expected", [
    ({"momentum": 0.9, "weight_decay": 1e-4, "dampening": 0}, None),
    ({"momentum": 0.0}, None),
    ({"momentum": 1.0}, ("decay_not_below_one", "momentum", 1.0)),
    ({"momentum": 1.5}, ("decay_not_below_one", "momentum", 1.5)),
    ({"betas": (0.9, 0.999)}, None),
    ({"betas": (1.0, 0.999)}, ("decay_not_below_one", "betas[0]", 1.0)),
    ({"alpha": 0.99}, None),
    ({"alpha": 1.0}, ("decay_not_below_one", "alpha (RMSprop's smoothing)", 1.0)),
    ({"rho": 1.0}, ("decay_not_below_one", "rho", 1.0)),
    ({"weight_decay": -1e-3}, ("negative_weight_decay", "weight_decay", -1e-3)),
    ({"momentum": torch.tensor(1.0)}, None),  # a tensor setting is not read (no device sync)
    ({"betas": (0.999, 0.9), "eps": 1e-8}, ("betas_unstable", "betas", 0.999)),  # swapped
    ({"betas": (0.9, 0.95), "eps": 1e-8}, None),  # a short second moment, as large models use
    ({"betas": (0.9, 0.999), "eps": 1.0}, ("eps_too_large", "eps", 1.0)),
    ({"betas": (0.9, 0.999), "eps": 1e-3}, None),
    ({"alpha": 0.0, "momentum": 0.0}, ("average_without_memory", "alpha (RMSprop's smoothing)", 0.0)),
    ({"rho": 0.0}, ("average_without_memory", "rho", 0.0)),
    ({"betas": (0.9, 0.0), "eps": 1e-8}, ("average_without_memory", "betas[1]", 0.0)),
    ({"alpha": 0.9}, None),
    ({"lr": 0.05, "weight_decay": 0.5, "momentum": 0.9, "dampening": 0, "nesterov": False},  # 0.5 typed for 5e-4
     ("weight_decay_dominant", "weight_decay", 0.5)),
    ({"lr": 0.4, "weight_decay": 1e-3, "momentum": 0.9, "dampening": 0, "nesterov": True}, None),  # large-batch SGD
    ({"lr": 0.1, "weight_decay": 0.3, "momentum": 0, "dampening": 0, "nesterov": False},
     ("weight_decay_dominant", "weight_decay", 0.3)),
    ({"lr": 0.1, "weight_decay": 0.1, "momentum": 0, "dampening": 0, "nesterov": False}, None),  # 1 % per step
    ({"lr": 1e-3, "weight_decay": 1.0, "betas": (0.9, 0.98), "eps": 1e-8, "decoupled_weight_decay": True}, None),
    ({"lr": 1e-3, "weight_decay": 30.0, "betas": (0.9, 0.999), "eps": 1e-8, "decoupled_weight_decay": True},
     ("weight_decay_dominant", "weight_decay", 30.0)),
    ({"lr": 1e-3, "weight_decay": 30.0, "betas": (0.9, 0.999), "eps": 1e-8, "decoupled_weight_decay": False}, None),
    ({"lr": torch.tensor(0.05), "weight_decay": 0.5, "momentum": 0.9, "dampening": 0, "nesterov": False}, None),
])
def test_settings_are_judged_by_their_meaning(group: dict, expected) -> None:
    assert optimizer_setting(group) == expected


def _run(folder: Path, trial: str, make_optimizer: Callable, edit: Callable | None = None, scheduler=None,
         steps: int = STEPS):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(2)
    teacher = torch.randn(16, 4, generator=g)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
    optimizer = make_optimizer(model.parameters())
    schedule = scheduler(optimizer) if scheduler else None
    criterion = nn.CrossEntropyLoss()
    with NeuralDbg(model, folder, trial=trial, loss=criterion, optimizer=optimizer, snapshots=None):
        for step in range(steps):
            if edit is not None:
                edit(step, optimizer)
            x = torch.randn(64, 16, generator=g)
            optimizer.zero_grad()
            criterion(model(x), (x @ teacher).argmax(1)).backward()
            optimizer.step()
            if schedule is not None:
                schedule.step()
    return analyze(folder / trial, store=False).hypotheses


def _set_at(step: int, key: str, value) -> Callable:
    def edit(s: int, optimizer: torch.optim.Optimizer) -> None:
        if s == step:
            for group in optimizer.param_groups:
                group[key] = value
    return edit


def test_a_momentum_of_one_from_the_start_is_named(tmp_path: Path) -> None:
    top = _run(tmp_path, "m1", lambda p: torch.optim.SGD(p, lr=0.02, momentum=1.0))[0]
    assert (top.type, top.origin, top.onset) == ("optimizer_divergence", "optimizer", 0)
    assert "momentum=1" in top.sentence and "below 1" in top.remedy


@pytest.mark.parametrize("step", [20, 50])  # a full step, and a light step (after the first 32)
def test_an_edit_of_the_param_groups_mid_run_is_dated_where_the_optimizer_uses_it(tmp_path: Path, step: int) -> None:
    hypotheses = _run(tmp_path, f"edit{step}", lambda p: torch.optim.SGD(p, lr=0.02, momentum=0.9),
                      edit=_set_at(step, "momentum", 1.0))
    named = [h for h in hypotheses if "momentum=1" in h.sentence]
    assert [(h.type, h.onset) for h in named] == [("optimizer_divergence", step)]


def test_a_beta_of_one_and_a_negative_weight_decay_are_named(tmp_path: Path) -> None:
    beta = _run(tmp_path, "beta", lambda p: torch.optim.Adam(p, lr=1e-3), edit=_set_at(40, "betas", (0.9, 1.0)))
    assert any("betas[1]=1" in h.sentence and h.onset == 40 for h in beta)
    decay = _run(tmp_path, "decay", lambda p: torch.optim.SGD(p, lr=0.05), edit=_set_at(0, "weight_decay", -0.05))
    assert decay[0].type == "optimizer_divergence" and "weight_decay=-0.05" in decay[0].sentence


def test_a_weight_decay_that_halves_the_weights_in_a_few_steps_is_named(tmp_path: Path) -> None:
    """SGD with weight_decay=0.5 (typed for 5e-4) and momentum 0.9 removes a quarter of every weight per step
    whatever the gradients do: the weights and what they carry shrink toward 0. Named by the setting, dated at
    the step that first used it; the usual decays of the same optimizers raise nothing."""
    top = _run(tmp_path, "wd", lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=0.5))[0]
    assert (top.type, top.origin, top.onset) == ("vanishing", "optimizer", 0)
    assert "weight_decay=0.5" in top.sentence and "25%" in top.sentence and "usual value" in top.remedy
    edited = _run(tmp_path, "wd_edit", lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.05),
                  edit=_set_at(45, "weight_decay", 50.0))
    assert [(h.type, h.onset) for h in edited if "weight_decay=50" in h.sentence] == [("vanishing", 45)]


def test_a_linear_decay_past_its_last_step_turns_the_learning_rate_negative(tmp_path: Path) -> None:
    """A LambdaLR told 40 steps in a 70-step run: from step 41 the rate is negative and every update climbs
    the loss. Reported as such, not as a learning rate that collapsed."""
    hypotheses = _run(tmp_path, "past_end", lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
                      scheduler=lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda s: 1 - s / 40))
    top = hypotheses[0]
    assert (top.type, top.origin, top.onset) == ("optimizer_divergence", "optimizer", 41)
    assert "turned negative" in top.sentence and "scheduler" in top.remedy
    assert all(h.type != "update_stagnation" for h in hypotheses)


def test_swapped_betas_and_an_eps_of_one_are_named(tmp_path: Path) -> None:
    swapped = _run(tmp_path, "swapped", lambda p: torch.optim.Adam(p, lr=3e-3, betas=(0.999, 0.9)))[0]
    assert (swapped.type, swapped.origin, swapped.onset) == ("optimizer_instability", "optimizer", 0)
    assert "betas=(0.999, 0.9)" in swapped.sentence and "swapped" in swapped.remedy
    eps = _run(tmp_path, "eps", lambda p: torch.optim.Adam(p, lr=3e-3, eps=1.0))[0]
    assert (eps.type, eps.origin, eps.onset) == ("update_stagnation", "optimizer", 0) and "eps=1" in eps.sentence


@pytest.mark.parametrize("make", [lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True),
                                  lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.1),
                                  lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=5e-4),
                                  lambda p: torch.optim.RMSprop(p, lr=1e-3, alpha=0.99, momentum=0.5)])
def test_usual_settings_raise_nothing(tmp_path: Path, make: Callable) -> None:
    hypotheses = _run(tmp_path, "ok", make)
    assert all(h.type not in ("optimizer_divergence", "optimizer_instability") for h in hypotheses)


def test_rmsprop_without_a_memory_for_its_squared_gradients_is_named(tmp_path: Path) -> None:
    top = _run(tmp_path, "alpha", lambda p: torch.optim.RMSprop(p, lr=1e-2, alpha=0.0))[0]
    assert (top.type, top.origin, top.onset) == ("optimizer_instability", "optimizer", 0)
    assert "alpha (RMSprop's smoothing)=0" in top.sentence and "0.99" in top.remedy


def _warm_up(steps: int) -> Callable:
    return lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda s: min(1.0, (s + 1) / steps))


def test_a_warm_up_that_never_lets_the_rate_up_is_named_and_usual_schedules_are_not(tmp_path: Path) -> None:
    """A warm-up of 10^6 steps (typed for 10^2) keeps the rate below 1/1000 of its base for the whole run;
    a 50-step warm-up, a LinearLR from 1e-4 and a small constant rate without a scheduler are fine."""
    def adam(p):
        return torch.optim.Adam(p, lr=1e-2)

    stuck = _run(tmp_path, "never", adam, scheduler=_warm_up(10 ** 6), steps=230)
    top = stuck[0]
    assert (top.type, top.origin, top.onset) == ("update_stagnation", "optimizer", 0)
    assert "base rate 0.01" in top.sentence and "warm-up" in top.remedy
    for trial, make, scheduler in (
            ("short", adam, _warm_up(50)),
            ("linear", adam, lambda o: torch.optim.lr_scheduler.LinearLR(o, start_factor=1e-4, total_iters=150)),
            ("small", lambda p: torch.optim.Adam(p, lr=1e-5), None)):
        hypotheses = _run(tmp_path, trial, make, scheduler=scheduler, steps=230)
        assert all("base rate" not in h.sentence for h in hypotheses), trial

"""A loss that jumps at once while the model and its inputs are as the step before left them was changed by
what it compares them with: the targets (or the loss). Real runs under ``NeuralDbg``'s defaults: class ids
remapped from step 150 on had been read as "optimizer divergence" at confidence 0.99, with the advice to lower
a learning rate that never changed; a lasting jump short of 100× (labels shuffled on a task the model had not
learnt as well) went unreported; a learning rate raised at the same step stays the optimizer's."""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from comgra_ndbg import NeuralDbg
from comgra_ndbg.analysis.api import analyze
from comgra_ndbg.analysis.optimizer_stability import loss_events
from comgra_ndbg.analysis.series import build_series

STEPS, T0 = 230, 150


def _run(folder: Path, fault: str) -> list:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(6)
    centers = torch.randn(6, 16, generator=g) * 1.2
    labels = torch.randint(0, 6, (4096,), generator=g)
    inputs = centers[labels] + torch.randn(4096, 16, generator=g)
    model = nn.Sequential(nn.Linear(16, 64), nn.SiLU(), nn.Linear(64, 64), nn.SiLU(), nn.Dropout(0.0),
                          nn.Linear(64, 6))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    criterion = nn.CrossEntropyLoss()
    remap = torch.tensor([3, 5, 0, 1, 2, 4])
    order = torch.randperm(4096, generator=g)
    with NeuralDbg(model, folder, trial="t", loss=criterion, optimizer=optimizer, snapshots=None):
        for step in range(STEPS):
            batch = order[(step * 64) % 4096:(step * 64) % 4096 + 64]
            x, y = inputs[batch], labels[batch]
            if step >= T0 and fault == "labels":
                y = remap[y]
            if step >= T0 and fault == "shuffled":
                y = y[torch.randperm(len(y), generator=g)]
            if step == T0 and fault == "lr":
                optimizer.param_groups[0]["lr"] = 0.5
            if step == T0 and fault == "dropout":
                model[4].p = 1.0  # a forward pass that changes without its parameters
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()
    return analyze(folder / "t", store=False).hypotheses


def test_labels_remapped_mid_run_are_read_as_a_change_of_the_targets(tmp_path: Path) -> None:
    top = _run(tmp_path, "labels")[0]
    assert (top.type, top.origin, top.onset) == ("target_shift", "data", T0)
    assert "check the targets" in top.remedy and "learning rate" not in top.remedy
    assert "while the parameters and inputs were as the steps before left them" in top.sentence


def test_labels_shuffled_mid_run_are_read_as_a_change_of_the_targets(tmp_path: Path) -> None:
    top = _run(tmp_path, "shuffled")[0]
    assert (top.type, top.origin, top.onset) == ("target_shift", "data", T0)


def test_a_lasting_loss_jump_is_an_event_and_a_recovered_spike_or_a_slow_rise_is_not() -> None:
    steps = np.arange(200)
    noise = 1 + 0.1 * np.sin(steps)
    base = np.r_[np.linspace(2.0, 0.1, 60), np.full(140, 0.1)] * noise
    lasting, spike, slow = base.copy(), base.copy(), base.copy()
    lasting[150:] *= 20
    spike[150:153] *= 20
    slow[100:] *= np.linspace(1, 20, 100)
    states = {}
    for name, loss in (("lasting", lasting), ("spike", spike), ("slow", slow)):
        series = build_series({}, roles={}, kpis={"loss": (steps, loss)})
        states[name] = [(e.to_state, e.onset) for e in loss_events(series, settle=50)]
    assert states == {"lasting": [("jumped", 150)], "spike": [("spike", 150)], "slow": []}


def test_a_dropout_set_to_one_is_the_dropouts_though_its_outputs_are_measured_a_step_after_the_loss(
        tmp_path: Path) -> None:
    """The step where p became 1 is a sentinel step: the loss jumps there, the dropout's dead outputs show at
    the next measured step. The loss is no root of its own then, neither the targets' nor the optimizer's."""
    top = _run(tmp_path, "dropout")[0]
    assert (top.type, top.node) == ("dead_units", "model.4") and T0 <= top.onset <= T0 + 1


def test_a_learning_rate_raised_mid_run_is_still_the_optimizers(tmp_path: Path) -> None:
    hypotheses = _run(tmp_path, "lr")
    assert hypotheses and hypotheses[0].origin == "optimizer"
    assert all(h.type != "target_shift" for h in hypotheses)


@pytest.mark.parametrize("squeeze", [False, True])
def test_a_regression_target_without_the_outputs_last_dimension_is_named(tmp_path: Path, squeeze: bool) -> None:
    """``MSELoss`` of an output ``[B, 1]`` against a target ``[B]`` broadcasts to ``[B, B]`` and the model learns
    the batch mean; it had read as an output that cannot reach its targets (0.98), the shapes never named."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(3)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    criterion = nn.MSELoss()
    weights = torch.randn(8, generator=g)
    with NeuralDbg(model, tmp_path, trial="t", loss=criterion, optimizer=optimizer, snapshots=None):
        for _ in range(120):
            x = torch.randn(64, 8, generator=g)
            y = x @ weights + 2.0
            optimizer.zero_grad()
            prediction = model(x)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch's own broadcast warning
                criterion(prediction.squeeze(-1) if squeeze else prediction, y).backward()
            optimizer.step()
    hypotheses = analyze(tmp_path / "t", store=False).hypotheses
    if squeeze:
        assert all(h.type != "target_shape" for h in hypotheses)
    else:
        assert (hypotheses[0].type, hypotheses[0].origin, hypotheses[0].onset) == ("target_shape", "loss", 0)
        assert "squeeze" in hypotheses[0].remedy
        assert all(h.type != "output_range" for h in hypotheses)

"""Findings read from recorded rows at analysis time: targets holding one value per batch (sorted data, or a
label overwritten from a step on), half-precision weights whose updates round away, and a ``.grad`` left
behind by an earlier phase on parameters frozen since (a healthy fine-tune, no failure)."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from comgra_ndbg import NeuralDbg
from comgra_ndbg.analysis import analyze
from comgra_ndbg.analysis.stagnation import STALE_STEPS, _left_behind

STEPS = 120


def _classifier(dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to(dtype)


def _run(folder: Path, trial: str, model: nn.Module, optimizer: torch.optim.Optimizer,
         labels: Callable[[int, torch.Tensor], torch.Tensor], dtype: torch.dtype = torch.float32,
         steps: int = STEPS) -> list:
    g = torch.Generator().manual_seed(5)
    teacher = torch.randn(16, 4, generator=g)
    criterion = nn.CrossEntropyLoss()
    with NeuralDbg(model, folder, trial=trial, loss=criterion, optimizer=optimizer, snapshots=None):
        for step in range(steps):
            x = torch.randn(64, 16, generator=g)
            y = labels(step, (x @ teacher).argmax(1))
            optimizer.zero_grad()
            criterion(model(x.to(dtype)).float(), y).backward()
            optimizer.step()
    return analyze(folder / trial, store=False).hypotheses


def test_batches_sorted_by_their_label_are_not_called_a_constant_target(tmp_path: Path) -> None:
    """Every batch holds one class and the class changes from batch to batch: the data is ordered by label
    and not shuffled. It had been read as "a constant target holding one value (0)"."""
    model = _classifier()
    hypotheses = _run(tmp_path, "sorted", model, torch.optim.SGD(model.parameters(), lr=0.05),
                      lambda step, y: torch.full_like(y, (step // 10) % 4))
    top = hypotheses[0]
    assert (top.type, top.origin, top.onset) == ("single_value_batches", "data", 0)
    assert "4 values: 0, 1, 2, 3" in top.sentence and "shuffle=True" in top.remedy
    assert all(h.type != "constant_target" for h in hypotheses)


@pytest.mark.parametrize("from_step", [40, None])
def test_a_label_overwritten_from_a_step_on_is_a_constant_target_from_there(tmp_path: Path, from_step) -> None:
    model = _classifier()
    hypotheses = _run(tmp_path, f"c{from_step}", model, torch.optim.Adam(model.parameters(), lr=1e-3),
                      lambda step, y: torch.zeros_like(y) if from_step is not None and step >= from_step else y,
                      steps=200)  # (the default tiers record 8 steps of the tail: 40, 41, 80, 81, …)
    constant = [h for h in hypotheses if h.type == "constant_target"]
    if from_step is None:
        assert constant == []
    else:
        assert [(h.origin, h.onset) for h in constant] == [("data", from_step)]
        assert "after varying targets before" in constant[0].sentence


def test_bfloat16_weights_under_plain_sgd_lose_their_updates(tmp_path: Path) -> None:
    model = _classifier(torch.bfloat16)
    hypotheses = _run(tmp_path, "bf16", model, torch.optim.SGD(model.parameters(), lr=1e-3),
                      lambda step, y: y, dtype=torch.bfloat16)
    top = hypotheses[0]
    assert (top.type, top.origin, top.onset) == ("precision", "architecture", 0)
    assert top.node == "model.0.parameters" and "bfloat16" in top.sentence and "autocast" in top.remedy


@pytest.mark.parametrize("dtype, lr, optimizer", [(torch.bfloat16, 1e-2, torch.optim.Adam),
                                                   (torch.float32, 1e-7, torch.optim.SGD)])
def test_updates_that_are_kept_or_weights_in_float32_are_not_lost(tmp_path: Path, dtype, lr, optimizer) -> None:
    """Adam's updates in bfloat16 are large against the weights' last place; float32 weights keep even a
    learning rate of 1e-7's updates (that is a stagnation question, not precision)."""
    model = _classifier(dtype)
    hypotheses = _run(tmp_path, "kept", model, optimizer(model.parameters(), lr=lr), lambda step, y: y, dtype=dtype)
    assert all(h.type != "precision" for h in hypotheses)


def test_a_grad_left_behind_on_a_frozen_backbone_is_no_gradient(tmp_path: Path) -> None:
    """Trained, then frozen with ``requires_grad_(False)`` without clearing ``.grad``, then fine-tuned with a
    new head: the backbone's ``.grad`` is the same at every step, and it had made the backbone read as
    parameters that get gradients and never move (an optimizer divergence at 0.63 on a healthy run)."""
    model = _classifier()
    g = torch.Generator().manual_seed(1)
    pre = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(20):
        x = torch.randn(64, 16, generator=g)
        pre.zero_grad()
        nn.functional.cross_entropy(model(x), x[:, :4].argmax(1)).backward()
        pre.step()
    model.requires_grad_(False)
    model[2] = nn.Linear(32, 4)
    head = torch.optim.SGD(model[2].parameters(), lr=0.1, momentum=0.9)
    hypotheses = _run(tmp_path, "finetune", model, head, lambda step, y: y)
    assert not hypotheses


def test_a_gradient_summary_that_never_changes_is_left_behind() -> None:
    same = {"abs_max": np.full(STALE_STEPS, 0.3), "l2": np.full(STALE_STEPS, 2.0), "mean": np.full(STALE_STEPS, 0.01)}
    assert _left_behind(same, 0, STALE_STEPS - 1)
    moving = dict(same, l2=np.linspace(1.0, 2.0, STALE_STEPS))
    assert not _left_behind(moving, 0, STALE_STEPS - 1)
    assert not _left_behind(same, 0, STALE_STEPS - 2)  # too few steps to tell
    assert not _left_behind(dict(same, abs_max=np.zeros(STALE_STEPS)), 0, STALE_STEPS - 1)  # exactly 0: a cut path

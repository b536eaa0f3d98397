"""A loss that falls without bound below 0 while the weights explode is read as the objective's fault, not the
optimizer's: a hand-written NLL that lost its minus sign maximises the true class's log-probability's negative,
and no learning rate fixes that."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from comgra_ndbg import NeuralDbg
from comgra_ndbg.analysis import analyze
from comgra_ndbg.analysis.reading import loss_unbounded_below


def _train(folder: Path, trial: str, loss_of, steps: int = 160) -> list[float]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    teacher = torch.randn(20, 5, generator=g)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 5))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    with NeuralDbg(model, folder, trial=trial, optimizer=optimizer):
        for _ in range(steps):
            x = torch.randn(64, 20, generator=g)
            optimizer.zero_grad()
            loss = loss_of(model(x), (x @ teacher).argmax(1))
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


def _log_likelihood(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.log_softmax(logits, 1).gather(1, labels[:, None]).mean()


def test_a_negative_log_likelihood_without_its_minus_sign_is_the_losss_fault(tmp_path: Path) -> None:
    losses = _train(tmp_path, "flipped", _log_likelihood)
    assert not np.isfinite(losses[-1]) or losses[-1] < -1e3  # the run really ran away below 0
    top = analyze(tmp_path / "flipped", store=False).hypotheses[0]
    assert (top.type, top.origin) == ("exploding", "loss")
    assert "fell without bound" in top.remedy and "sign" in top.remedy


def test_the_same_loss_with_its_sign_trains_and_raises_nothing(tmp_path: Path) -> None:
    losses = _train(tmp_path, "fixed", lambda logits, labels: -_log_likelihood(logits, labels))
    assert losses[-1] < losses[0] / 2
    assert analyze(tmp_path / "fixed", store=False).hypotheses == ()


def test_only_a_loss_still_falling_far_below_zero_is_unbounded() -> None:
    start = [-1.6] * 20
    assert loss_unbounded_below(np.array(start + [-1.6 * 3.0 ** k for k in range(1, 12)]))
    assert not loss_unbounded_below(np.array(start + [-1.6 * 3.0 ** k for k in range(1, 6)]))  # 390: not 1000×
    bottomed = start + [-1.6 * 3.0 ** k for k in range(1, 12)] + [-5.0] * 40  # fell, then came back up
    assert not loss_unbounded_below(np.array(bottomed))
    assert not loss_unbounded_below(np.array([2.3] * 20 + [1e6] * 10))  # climbing: the optimizer's divergence

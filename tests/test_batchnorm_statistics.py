"""BatchNorm trained with ``momentum=0``: its running statistics never move from where they start, so an
evaluation normalises with mean 0 and variance 1. A failure from scratch; a pre-trained model whose
statistics are frozen on purpose, ``momentum=None`` (a cumulative average) and the default are not."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from comgra_ndbg import NeuralDbg
from comgra_ndbg.analysis import analyze


def train(folder: Path, trial: str, momentum: float | None, pretrained: bool = False) -> list:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(3)
    teacher = torch.randn(12, 3, generator=g)
    model = nn.Sequential(nn.Linear(12, 24), nn.BatchNorm1d(24, momentum=momentum), nn.ReLU(), nn.Linear(24, 3))
    if pretrained:
        with torch.no_grad():
            model[1].running_mean.fill_(0.3)
            model[1].running_var.fill_(2.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    with NeuralDbg(model, folder, trial=trial, loss=criterion, optimizer=optimizer, snapshots=None):
        for step in range(60):
            x = 3 + 2 * torch.randn(32, 12, generator=g)
            optimizer.zero_grad()
            criterion(model(x), ((x - 3) @ teacher).argmax(1)).backward()
            optimizer.step()
    return analyze(folder / trial, store=False).hypotheses


def test_batchnorm_with_momentum_zero_from_scratch_is_named_at_its_layer(tmp_path: Path) -> None:
    top = train(tmp_path, "frozen", 0.0)[0]
    assert (top.type, top.origin, top.node, top.onset) == ("batch_statistics", "node", "model.1", 0)
    assert "momentum=0" in top.sentence and "momentum=0.1" in top.remedy


@pytest.mark.parametrize("momentum, pretrained", [(0.1, False), (None, False), (0.0, True)])
def test_usual_momentum_and_deliberately_frozen_statistics_are_not(tmp_path: Path, momentum: float | None,
                                                                   pretrained: bool) -> None:
    hypotheses = train(tmp_path, f"ok-{momentum}-{pretrained}", momentum, pretrained)
    assert all(h.type != "batch_statistics" for h in hypotheses)

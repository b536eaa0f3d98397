"""A loss that jumps at once while the model and its inputs are as the step before left them was changed by
what it compares them with: the targets (or the loss). Real runs under ``NeuralDbg``'s defaults: class ids
remapped from step 150 on had been read as "optimizer divergence" at confidence 0.99, with the advice to lower
a learning rate that never changed; a learning rate raised at the same step stays the optimizer's."""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from comgra_ndbg import NeuralDbg
from comgra_ndbg.analysis.api import analyze

STEPS, T0 = 230, 150


def _run(folder: Path, fault: str) -> list:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(6)
    centers = torch.randn(6, 16, generator=g) * 1.2
    labels = torch.randint(0, 6, (4096,), generator=g)
    inputs = centers[labels] + torch.randn(4096, 16, generator=g)
    model = nn.Sequential(nn.Linear(16, 64), nn.SiLU(), nn.Linear(64, 64), nn.SiLU(), nn.Linear(64, 6))
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
            if step == T0 and fault == "lr":
                optimizer.param_groups[0]["lr"] = 0.5
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()
    return analyze(folder / "t", store=False).hypotheses


def test_labels_remapped_mid_run_are_read_as_a_change_of_the_targets(tmp_path: Path) -> None:
    top = _run(tmp_path, "labels")[0]
    assert (top.type, top.origin, top.onset) == ("target_shift", "data", T0)
    assert "check the targets" in top.remedy and "learning rate" not in top.remedy
    assert "while the parameters and inputs were as the steps before left them" in top.sentence


def test_a_learning_rate_raised_mid_run_is_still_the_optimizers(tmp_path: Path) -> None:
    hypotheses = _run(tmp_path, "lr")
    assert hypotheses and hypotheses[0].origin == "optimizer"
    assert all(h.type != "target_shift" for h in hypotheses)

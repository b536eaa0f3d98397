"""Weights written back to an untrained state inside the loop (an initialisation applied every epoch): each
reset returns the loss to the untrained model's, which is what tells it from a deliberate edit."""
from __future__ import annotations

import math
from pathlib import Path

import torch

from comgra_ndbg import NeuralDbg
from comgra_ndbg.analysis import analyze


def test_weights_reinitialised_inside_the_loop_are_a_reset_of_training(tmp_path: Path) -> None:
    """``model.apply(init)`` every 60 steps (the initialisation inside the epoch loop): each time the loss
    returns to the untrained model's. The norms hardly move, so no downstream signal crosses a rule; it had
    gone unreported."""
    torch.manual_seed(0)
    g, again = torch.Generator().manual_seed(1), torch.Generator().manual_seed(99)
    teacher = torch.randn(20, 5, generator=g)
    model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 5))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    criterion = torch.nn.CrossEntropyLoss()

    def init(module: torch.nn.Module) -> None:
        if isinstance(module, torch.nn.Linear):
            bound = 1 / math.sqrt(module.in_features)
            with torch.no_grad():
                module.weight.uniform_(-bound, bound, generator=again)
                module.bias.uniform_(-bound, bound, generator=again)

    with NeuralDbg(model, tmp_path, trial="reset", loss=criterion, optimizer=optimizer, snapshots=None):
        for step in range(200):
            if step and step % 60 == 0:
                model.apply(init)
            x = torch.randn(64, 20, generator=g)
            optimizer.zero_grad()
            criterion(model(x), (x @ teacher).argmax(1)).backward()
            optimizer.step()
    top = analyze(tmp_path / "reset", store=False).hypotheses[0]
    assert (top.type, top.origin, top.node, top.onset) == ("weights_reset", "loop", "", 60)
    assert "the training loop" in top.sentence and "initialise once" in top.remedy

"""Every parameter's gradient scaled alike after the backward pass — ``clip_grad_norm_`` with a tiny
``max_norm`` from one step on — while the module outputs' gradients stay as they were is one failure of the
step between ``backward()`` and ``optimizer.step()``, not a vanishing gradient in each layer. Real runs under
``NeuralDbg``'s defaults: it had been read as three "vanishing" hypotheses, one per layer, the first at
confidence 0.95, each advising residual connections; clipping at 1.0 throughout stays healthy."""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from comgra_ndbg import NeuralDbg
from comgra_ndbg.analysis.api import analyze

STEPS, T0 = 230, 150


def _clusters() -> tuple[torch.Tensor, torch.Tensor, torch.Generator, nn.Sequential]:
    """Eight Gaussian clusters in 16 dimensions (inputs, labels, the generator drawn from) and a ReLU MLP."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(5)
    centers = torch.randn(8, 16, generator=g) * 1.2
    labels = torch.randint(0, 8, (4096,), generator=g)
    inputs = centers[labels] + torch.randn(4096, 16, generator=g)
    return inputs, labels, g, nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                                            nn.Linear(64, 8))


def _run(folder: Path, max_norm_from_t0: float) -> list:
    inputs, labels, g, model = _clusters()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    criterion = nn.CrossEntropyLoss()
    order = torch.randperm(4096, generator=g)
    with NeuralDbg(model, folder, trial="t", loss=criterion, optimizer=optimizer, snapshots=None):
        for step in range(STEPS):
            batch = order[(step * 64) % 4096:(step * 64) % 4096 + 64]
            optimizer.zero_grad()
            criterion(model(inputs[batch]), labels[batch]).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm_from_t0 if step >= T0 else 1.0)
            optimizer.step()
    return list(analyze(folder / "t", store=False).hypotheses)


def test_a_tiny_clipping_norm_from_one_step_on_is_one_scaling_of_every_gradient(tmp_path: Path) -> None:
    hypotheses = _run(tmp_path, 1e-4)
    top = hypotheses[0]
    assert (top.type, top.origin) == ("gradient_scaling", "optimizer") and abs(top.onset - T0) <= 1
    assert "clip_grad_norm_" in top.remedy
    assert not any(h.type == "vanishing" for h in hypotheses)


def test_clipping_at_one_throughout_is_healthy(tmp_path: Path) -> None:
    assert _run(tmp_path, 1.0) == []


def test_a_gradient_cut_to_exactly_zero_from_the_start_is_update_stagnation_of_that_layer(tmp_path: Path) -> None:
    """Hooks that return zeros for the first layer's gradients (a cut backward path): a gradient of exactly 0
    is no attenuation ("vanishing from the architecture, 27.8 decades off" at confidence 0.99, advising
    residual connections) and, received at every step, no choice to freeze the layer either."""
    inputs, labels, g, model = _clusters()
    for parameter in model[0].parameters():
        parameter.register_hook(torch.zeros_like)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    criterion = nn.CrossEntropyLoss()
    with NeuralDbg(model, tmp_path, trial="t", loss=criterion, optimizer=optimizer, snapshots=None):
        for step in range(120):
            batch = torch.randint(0, 4096, (64,), generator=g)
            optimizer.zero_grad()
            criterion(model(inputs[batch]), labels[batch]).backward()
            optimizer.step()
    hypotheses = analyze(tmp_path / "t", store=False).hypotheses
    assert (hypotheses[0].type, hypotheses[0].node) == ("update_stagnation", "model.0.parameters")
    assert not any(h.type == "vanishing" for h in hypotheses)

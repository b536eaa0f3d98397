"""A learning rate wrong from the first step, on real runs recorded to the end: the first updates wreck an
initialisation that was healthy at step 0, so the dead units, saturation and gradients they leave behind
are the optimizer's doing — never "the architecture or initialisation" — while the same networks at a
sane learning rate get no hypothesis at all."""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from comgra_ndbg import NeuralDbg

STEPS = 40


def convnet() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 8, 3, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(32, 3))


def tanh_regressor() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))


def run(folder: Path, model: nn.Module, lr: float, classify: bool) -> tuple:
    """Train ``model`` with SGD at ``lr`` from the first step under NeuralDbg; its hypotheses, best first."""
    g = torch.Generator().manual_seed(1)
    if classify:
        data = [(torch.randn(16, 1, 8, 8, generator=g), torch.randint(0, 3, (16,), generator=g)) for _ in range(STEPS)]
        loss_of = nn.functional.cross_entropy
    else:
        w = torch.randn(8, 1, generator=g)
        xs = [torch.randn(32, 8, generator=g) for _ in range(STEPS)]
        data = [(x, x @ w) for x in xs]
        loss_of = nn.functional.mse_loss
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    with NeuralDbg(model, folder, trial="t", snapshots=None) as dbg:
        for x, y in data:
            optimizer.zero_grad()
            loss_of(model(x), y).backward()
            optimizer.step()
    return dbg.get_causal_hypotheses()


def test_a_convnet_at_lr_100_from_the_first_step_is_the_optimizer_not_its_dead_units(tmp_path: Path) -> None:
    hypotheses = run(tmp_path, convnet(), 100.0, classify=True)
    top = hypotheses[0]
    assert (top.type, top.origin, top.onset) == ("optimizer_divergence", "optimizer", 0)
    assert "from the first step" in top.sentence and "learning rate" in top.remedy
    assert not any(h.origin == "architecture" for h in hypotheses)


def test_a_tanh_regressor_at_lr_3_from_the_first_step_is_the_optimizer_not_saturation(tmp_path: Path) -> None:
    hypotheses = run(tmp_path, tanh_regressor(), 3.0, classify=False)
    assert (hypotheses[0].type, hypotheses[0].origin) == ("optimizer_divergence", "optimizer")
    assert not any(h.origin == "architecture" for h in hypotheses)


def test_the_same_networks_at_a_sane_learning_rate_get_no_hypothesis(tmp_path: Path) -> None:
    assert run(tmp_path / "conv", convnet(), 0.05, classify=True) == ()
    assert run(tmp_path / "tanh", tanh_regressor(), 0.01, classify=False) == ()

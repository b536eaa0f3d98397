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


def _reload_run(folder: Path, trial: str, edit) -> list:
    """An MLP initialised small (its trained activations are far larger than its untrained ones) trained 150
    steps; at step 90 ``edit(model, initial_state)`` runs inside the loop."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(5)
    teacher = torch.randn(16, 4, generator=g)
    model = torch.nn.Sequential(torch.nn.Linear(16, 48), torch.nn.Tanh(), torch.nn.Linear(48, 48), torch.nn.Tanh(),
                                torch.nn.Linear(48, 4))
    with torch.no_grad():
        for layer in model[::2]:
            layer.weight.normal_(0, 0.01, generator=g)
            layer.bias.zero_()
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    criterion = torch.nn.CrossEntropyLoss()
    with NeuralDbg(model, folder, trial=trial, loss=criterion, optimizer=optimizer, snapshots=None):
        for step in range(150):
            if step == 90:
                edit(model, initial)
            x = torch.randn(64, 16, generator=g)
            optimizer.zero_grad()
            criterion(model(x), (x @ teacher).argmax(1)).backward()
            optimizer.step()
    return analyze(folder / trial, store=False).hypotheses


def test_a_checkpoint_of_the_untrained_model_reloaded_mid_run_is_a_reset(tmp_path: Path) -> None:
    """"Restore the best checkpoint", saved before training and never updated: the weights return to their
    starting values (their norms with them) and the loss to the untrained model's. Read as a reset, not as
    the vanishing signal the small initial weights cause downstream (the reading before)."""
    top = _reload_run(tmp_path, "reload", lambda model, initial: model.load_state_dict(initial))[0]
    assert (top.type, top.origin, top.onset) == ("weights_reset", "loop", 90)


def test_weights_scaled_down_mid_run_are_not_a_reset(tmp_path: Path) -> None:
    """Scaling the weights by 1/100 also takes the loss back towards the untrained model's, but the weights
    do not return to where they started: not a reset."""
    def shrink(model: torch.nn.Module, initial: dict) -> None:
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(0.01)

    hypotheses = _reload_run(tmp_path, "shrink", shrink)
    assert hypotheses and hypotheses[0].onset == 90 and hypotheses[0].type != "weights_reset"

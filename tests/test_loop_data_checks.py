"""Data and loop mistakes read from what every recording holds or from the loop's passes: every sample of a
batch the same, one corrupt batch, non-finite evaluation inputs, BatchNorm1d on micro-batches of 2, and a
GAN whose alternating steps give the generator new gradient tensors where freed ones were."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from comgra_ndbg import NeuralDbg
from comgra_ndbg.analysis import analyze

STEPS = 80


def _regression(folder: Path, trial: str, batch: Callable[[int, torch.Generator], tuple],
                model: nn.Module | None = None, lr: float = 1e-2,
                evaluate: Callable[[nn.Module, int], None] | None = None, **kwargs) -> tuple:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(3)
    model = model or nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    criterion = nn.MSELoss()
    with NeuralDbg(model, folder, trial=trial, loss=criterion, optimizer=optimizer, snapshots=None, **kwargs):
        for step in range(STEPS):
            x, y = batch(step, g)
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()
            if evaluate is not None:
                evaluate(model, step)
    return analyze(folder / trial, store=False).hypotheses


def _fresh(step: int, g: torch.Generator) -> tuple:
    x = torch.randn(32, 8, generator=g)
    return x, x[:, :1] * 0.5


def test_one_noise_vector_expanded_over_the_batch_is_mode_collapse_from_the_data(tmp_path: Path) -> None:
    def copied(step: int, g: torch.Generator) -> tuple:
        x = torch.randn(1, 8, generator=g).expand(32, 8)
        return x, x[:, :1] * 0.5

    top = _regression(tmp_path, "copied", copied)[0]
    assert (top.type, top.origin, top.onset) == ("mode_collapse", "data", 0)
    assert "every sample of the batch is the same" in top.sentence and "expand" in top.remedy
    assert all(h.type != "mode_collapse" for h in _regression(tmp_path, "fresh", _fresh))


class _WithState(nn.Module):
    """A regression head that takes an initial state beside its input, as an RNN cell does (zeros at step 0)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))

    def forward(self, x: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([x, state], 1))


def test_an_input_that_is_exactly_zero_is_mode_collapse_from_the_data(tmp_path: Path) -> None:
    """A generator's noise multiplied by a scale of 0 from a config default: every sample of every batch gets
    the same output. A zero initial state beside an input that varies is no such thing."""
    def zeroed(step: int, g: torch.Generator) -> tuple:
        return torch.randn(32, 8, generator=g) * 0.0, torch.randn(32, 1, generator=g)

    top = _regression(tmp_path, "zeroed", zeroed)[0]
    assert (top.type, top.origin, top.onset) == ("mode_collapse", "data", 0)
    assert "exactly 0" in top.sentence and "scale of 0" in top.remedy
    model = _WithState()
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(3)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    with NeuralDbg(model, tmp_path, trial="state", optimizer=optimizer, snapshots=None):
        for _ in range(STEPS):
            x = torch.randn(32, 8, generator=g)
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x, torch.zeros(32, 8)), x[:, :1] * 0.5).backward()
            optimizer.step()
    assert all(h.type != "mode_collapse" for h in analyze(tmp_path / "state", store=False).hypotheses)


def test_a_batch_whose_targets_are_in_other_units_is_named_as_that_batch(tmp_path: Path) -> None:
    def corrupt(step: int, g: torch.Generator) -> tuple:
        x, y = _fresh(step, g)
        return x, y * (1000.0 if step == 50 else 1.0)

    top = _regression(tmp_path, "corrupt", corrupt)[0]
    assert (top.type, top.origin, top.node, top.onset) == ("loss_spike", "data", "target", 50)
    assert "'target'" in top.sentence and "batch of step 50" in top.sentence


def test_non_finite_evaluation_inputs_are_the_datas(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(9)
    clean = torch.randn(64, 8, generator=g)
    broken = clean.clone()
    broken[3, 2] = float("nan")

    def evaluate(inputs: torch.Tensor) -> Callable[[nn.Module, int], None]:
        def run(model: nn.Module, step: int) -> None:
            if step % 20 == 19:
                model.eval()
                with torch.no_grad():
                    model(inputs)
                model.train()
        return run

    top = _regression(tmp_path, "nan_eval", _fresh, evaluate=evaluate(broken), record_eval=True)[0]
    assert (top.type, top.origin, top.node) == ("nonfinite_evaluation", "data", "input")
    assert "1 non-finite element(s)" in top.sentence
    assert _regression(tmp_path, "clean_eval", _fresh, evaluate=evaluate(clean), record_eval=True) == ()


def test_batchnorm1d_on_micro_batches_of_two_is_found(tmp_path: Path) -> None:
    def two(step: int, g: torch.Generator) -> tuple:
        x = torch.randn(2, 8, generator=g)
        return x, x[:, :1] * 0.5

    model = nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 1))
    top = _regression(tmp_path, "two", two, model=model)[0]
    assert (top.type, top.node) == ("batch_statistics", "model.1")
    assert "a batch of 2 samples" in top.sentence and "-1 and +1" in top.sentence
    conv = nn.Sequential(nn.Unflatten(1, (2, 4)), nn.Conv1d(2, 4, 3, padding=1), nn.BatchNorm1d(4), nn.Flatten(),
                         nn.Linear(16, 1))  # 2 samples x 4 positions per channel: not degenerate
    assert all(h.type != "batch_statistics" for h in _regression(tmp_path, "conv", two, model=conv))


def test_a_gan_generator_gets_new_gradients_where_freed_ones_were_and_is_not_unused(tmp_path: Path) -> None:
    """The discriminator steps first; ``opt_g.zero_grad()`` then frees the generator's gradients and its
    backward pass allocates new ones, often at the freed tensors' addresses with the same version: the
    unused-parameter count had read them as the same gradient, 10 steps in a row (a false alarm)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(4)
    generator = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 2))
    critic = nn.Sequential(nn.Linear(2, 64), nn.LeakyReLU(0.2), nn.Linear(64, 1))
    opt_g = torch.optim.Adam(generator.parameters(), lr=2e-3, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(critic.parameters(), lr=2e-3, betas=(0.5, 0.999))
    bce = nn.BCEWithLogitsLoss()
    ones, zeros = torch.ones(128, 1), torch.zeros(128, 1)
    with NeuralDbg(generator, tmp_path, trial="gan", optimizer=opt_g, snapshots=None):
        for _ in range(200):
            real = torch.randn(128, 2, generator=g) + 2.0
            fake = generator(torch.randn(128, 8, generator=g))
            opt_d.zero_grad()
            (bce(critic(real), ones) + bce(critic(fake.detach()), zeros)).backward()
            opt_d.step()
            opt_g.zero_grad()
            bce(critic(fake), ones).backward()
            opt_g.step()
    hypotheses = analyze(tmp_path / "gan", store=False).hypotheses
    assert all(h.type != "unused_parameters" for h in hypotheses)


def test_a_failing_check_inside_the_models_forward_never_reaches_the_training_loop(tmp_path: Path,
                                                                                 monkeypatch) -> None:
    """The one-shot BatchNorm1d pre-hook runs inside the user's forward pass: a failure there is the
    recorder's, logged and warned about, and the pass goes on."""
    def broken(self, path, module, args):
        raise RuntimeError("boom")

    monkeypatch.setattr(NeuralDbg, "_inv_batch_two", broken)

    def two(step: int, g: torch.Generator) -> tuple:
        x = torch.randn(2, 8, generator=g)
        return x, x[:, :1] * 0.5

    model = nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 1))
    with pytest.warns(Warning, match="checking loop invariants"):
        hypotheses = _regression(tmp_path, "broken", two, model=model)
    assert all(h.type != "batch_statistics" for h in hypotheses)

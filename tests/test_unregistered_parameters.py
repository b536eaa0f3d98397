"""Parameters the model's forward pass uses without holding them (sub-modules in a plain Python list): they get
gradients, no optimizer holds them, they never change. Read from the autograd graph of the model's first
training pass (its ``AccumulateGrad`` leaves), judged against every optimizer that steps in the first steps."""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from comgra_ndbg import NeuralDbg
from comgra_ndbg.analysis import analyze
from comgra_ndbg.instrument.loss_graph import gradient_leaves


class Stack(nn.Module):
    def __init__(self, plain: bool) -> None:
        super().__init__()
        self.inp = nn.Linear(16, 32)
        blocks = [nn.Linear(32, 32) for _ in range(3)]
        self.blocks = blocks if plain else nn.ModuleList(blocks)
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.inp(x))
        for block in self.blocks:
            h = h + torch.relu(block(h))
        return self.head(h)


def test_the_leaves_of_a_graph_are_its_accumulated_tensors() -> None:
    model = Stack(plain=True)
    leaves = gradient_leaves([model(torch.randn(2, 16))])
    assert {id(t) for t in leaves} == {id(p) for p in model.parameters()} | {
        id(p) for block in model.blocks for p in block.parameters()}
    assert gradient_leaves([torch.ones(2)]) == []


def _train(folder: Path, trial: str, plain: bool, teacher: nn.Module | None = None):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    target = torch.randn(16, 4, generator=g)
    model = Stack(plain)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    criterion = nn.CrossEntropyLoss()
    with NeuralDbg(model, folder, trial=trial, loss=criterion, optimizer=optimizer, snapshots=None):
        for _ in range(40):
            x = torch.randn(64, 16, generator=g)
            optimizer.zero_grad()
            out = model(x)
            loss = criterion(out, (x @ target).argmax(1))
            if teacher is not None:  # distillation from a teacher left trainable, outside the model
                loss = loss + (out - teacher(x)).pow(2).mean()
            loss.backward()
            optimizer.step()
    return analyze(folder / trial, store=False).hypotheses


def test_blocks_kept_in_a_plain_list_are_found_from_the_first_step(tmp_path: Path) -> None:
    top = _train(tmp_path, "plain", plain=True)[0]
    assert (top.type, top.origin, top.onset) == ("update_stagnation", "architecture", 0)
    assert "6 parameter(s)" in top.sentence and "[32, 32]" in top.sentence and "nn.ModuleList" in top.remedy


def test_registered_blocks_and_a_teacher_outside_the_model_are_left_alone(tmp_path: Path) -> None:
    """The teacher's parameters get gradients too, but the model's own graph does not reach them."""
    assert _train(tmp_path, "registered", plain=False) == ()
    assert all("not the model's" not in h.sentence for h in _train(tmp_path, "distill", False, nn.Linear(16, 4)))


def test_a_discriminator_its_own_optimizer_steps_is_not_the_generators_mistake(tmp_path: Path) -> None:
    """A GAN's generator wrapped alone: the generator's loss runs through the discriminator, whose
    parameters another optimizer holds and steps."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(2)

    class Critic(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(4, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

    class Generator(nn.Module):
        def __init__(self, critic: Critic) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
            self.critics = [critic]  # held for scoring, on purpose outside the generator's parameters

        def forward(self, z: torch.Tensor) -> torch.Tensor:
            return self.critics[0](self.net(z))

    critic = Critic()
    generator = Generator(critic)
    opt_g = torch.optim.Adam(generator.parameters(), lr=1e-3)
    opt_d = torch.optim.Adam(critic.parameters(), lr=1e-3)
    bce = nn.BCEWithLogitsLoss()
    with NeuralDbg(generator, tmp_path, trial="gan", optimizer=opt_g, snapshots=None):
        for _ in range(40):
            z, real = torch.randn(32, 8, generator=g), torch.randn(32, 4, generator=g) + 2.0
            opt_d.zero_grad()
            with torch.no_grad():
                fake = generator.net(z)
            (bce(critic(real), torch.ones(32, 1)) + bce(critic(fake), torch.zeros(32, 1))).backward()
            opt_d.step()
            opt_g.zero_grad()
            bce(generator(z), torch.ones(32, 1)).backward()
            opt_g.step()
    hypotheses = analyze(tmp_path / "gan", store=False).hypotheses
    assert all("not the model's" not in h.sentence for h in hypotheses)

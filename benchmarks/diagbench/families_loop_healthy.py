"""The intentional patterns of the ``loop`` family (:mod:`benchmarks.diagbench.families_loop`): healthy
training loops that look unusual to a naive check of the loop invariants. Each trains under ``record`` and
fills ``run`` like the fault cases; ``fixed`` is unused (they have no mistake to fix)."""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.diagbench.families_loop import BATCH, STEPS, LoopRun, Record, batches, cnn_loop, mlp, step_once


def accumulation(record: Record, run: LoopRun, fixed: bool) -> None:
    """Gradient accumulation: four micro-batches per optimizer step, ``zero_grad`` after the step."""
    model = mlp(run.seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = batches(run.seed)
    with record(model):
        for _ in range(STEPS):
            total = 0.0
            for _ in range(4):
                x, y = next(data)
                loss = F.cross_entropy(model(x), y) / 4
                loss.backward()
                total += float(loss.detach())
            optimizer.step()
            optimizer.zero_grad()
            run.losses.append(total)


def gan(record: Record, run: LoopRun, fixed: bool) -> None:
    """A GAN: the discriminator and the generator alternate, each with its own optimizer; the generator's
    sample for the discriminator's step comes from a ``no_grad`` pass in train mode. Recorded: the
    discriminator."""
    torch.manual_seed(run.seed)
    generator = nn.Sequential(nn.Linear(4, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))
    discriminator = nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Dropout(0.1), nn.Linear(16, 1))
    opt_g = torch.optim.Adam(generator.parameters(), lr=1e-3, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(discriminator.parameters(), lr=1e-3, betas=(0.5, 0.999))
    g = torch.Generator().manual_seed(run.seed)
    ones, zeros = torch.ones(BATCH, 1), torch.zeros(BATCH, 1)
    with record(discriminator):
        for _ in range(STEPS):
            real, noise = torch.randn(BATCH, 2, generator=g) * 0.5 + 2, torch.randn(BATCH, 4, generator=g)
            discriminator.zero_grad()
            loss_d = F.binary_cross_entropy_with_logits(discriminator(real), ones)
            with torch.no_grad():
                sample = generator(noise)
            loss_d = loss_d + F.binary_cross_entropy_with_logits(discriminator(sample), zeros)
            loss_d.backward()
            opt_d.step()
            generator.zero_grad()
            F.binary_cross_entropy_with_logits(discriminator(generator(noise)), ones).backward()
            opt_g.step()
            run.losses.append(float(loss_d.detach()))


def frozen_backbone(record: Record, run: LoopRun, fixed: bool) -> None:
    """Fine-tuning the head only: the blocks are frozen with ``requires_grad_(False)`` from the start."""
    model = mlp(run.seed)
    model.blocks.requires_grad_(False)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    data = batches(run.seed)
    with record(model):
        for _ in range(STEPS):
            run.losses.append(step_once(model, optimizer, *next(data)))


def eval_passes(record: Record, run: LoopRun, fixed: bool) -> None:
    """Validation every 10 steps: ``model.eval()``, three passes under ``torch.no_grad()``, ``model.train()``."""
    cnn_loop(record, run, size_at=lambda step: BATCH, evaluate_every=10, after_eval_train=lambda step: True)


def warmup(record: Record, run: LoopRun, fixed: bool) -> None:
    """A linear warm-up from 0 over 15 steps, then a cosine decay to the end of the run."""
    model = mlp(run.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)

    def factor(step: int) -> float:
        if step < 15:
            return step / 15
        return 0.5 * (1 + torch.cos(torch.tensor(torch.pi * (step - 15) / (STEPS - 15))).item())

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    data = batches(run.seed)
    with record(model):
        for _ in range(STEPS):
            run.losses.append(step_once(model, optimizer, *next(data)))
            scheduler.step()


class _WithEma(nn.Module):
    def __init__(self, seed: int) -> None:
        super().__init__()
        self.net = mlp(seed)
        self.ema = copy.deepcopy(self.net).requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def ema(record: Record, run: LoopRun, fixed: bool) -> None:
    """An exponential moving average of the weights, kept in the model and updated under ``no_grad`` after
    every step; evaluated every 10 steps."""
    model = _WithEma(run.seed)
    optimizer = torch.optim.Adam(model.net.parameters(), lr=3e-3)
    data = batches(run.seed)
    with record(model):
        for step in range(STEPS):
            x, y = next(data)
            run.losses.append(step_once(model, optimizer, x, y))
            with torch.no_grad():
                for average, parameter in zip(model.ema.parameters(), model.net.parameters()):
                    average.lerp_(parameter, 0.1)
                if step % 10 == 9:
                    model.ema(x)

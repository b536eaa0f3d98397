"""diagbench data: Gaussian clusters (classification, with label noise) or a smooth regression target.

Everything is generated in-process from a seed; a ``Batches`` object hands out the batch of each step and
carries the data faults (one NaN element, one outlier batch) as its own state.
"""
from __future__ import annotations

import torch

IN_DIM = 32
NUM_CLASSES = 10
NUM_SAMPLES = 4096


def make_dataset(task: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)``: ``task`` is ``classification`` (10% label noise), ``easy`` (well separated, no noise)
    or ``regression`` (10 smooth targets of a random two-layer map)."""
    g = torch.Generator().manual_seed(10_000 + seed)
    if task == "regression":
        x = torch.randn(NUM_SAMPLES, IN_DIM, generator=g)
        w1 = torch.randn(IN_DIM, 16, generator=g) / IN_DIM ** 0.5
        w2 = torch.randn(16, NUM_CLASSES, generator=g) / 4.0
        return x, torch.tanh(x @ w1) @ w2
    separation = 6.0 if task == "easy" else 1.2
    centers = torch.randn(NUM_CLASSES, IN_DIM, generator=g) * separation / IN_DIM ** 0.5 * 3
    y = torch.randint(0, NUM_CLASSES, (NUM_SAMPLES,), generator=g)
    x = centers[y] + torch.randn(NUM_SAMPLES, IN_DIM, generator=g)
    if task == "classification":
        noisy = torch.rand(NUM_SAMPLES, generator=g) < 0.1
        y = torch.where(noisy, torch.randint(0, NUM_CLASSES, (NUM_SAMPLES,), generator=g), y)
    return x, y


class Batches:
    """Seeded mini-batches; ``corrupt`` (``"nan"`` or ``"outlier"``) spoils the next batch only."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, *, batch_size: int, seed: int, task: str) -> None:
        self.x, self.y, self.batch_size, self.task = x, y, batch_size, task
        self.generator = torch.Generator().manual_seed(20_000 + seed)
        self.corrupt: str | None = None

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.randint(0, len(self.x), (self.batch_size,), generator=self.generator)
        x, y = self.x[index].clone(), self.y[index].clone()
        if self.corrupt == "nan":
            x[0, 0] = float("nan")
        elif self.corrupt == "outlier":
            x = x * 100.0
            if self.task == "regression":
                y = torch.randn(y.shape, generator=self.generator) * 100.0
            else:
                y = torch.randint(0, NUM_CLASSES, y.shape, generator=self.generator)
        self.corrupt = None
        return x, y

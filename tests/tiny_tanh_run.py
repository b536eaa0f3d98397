"""The tiny tanh classifier, its optimizer and its seeded batches that the statistic-tier tests train: the
same starting point for a recorded run, a run with other settings and a bare one."""
from __future__ import annotations

import torch
from torch import nn


def tiny_run(steps: int) -> tuple[nn.Sequential, nn.Module, torch.optim.Optimizer, list]:
    """``(model, criterion, SGD optimizer, batches)``, seeded: two calls give identical runs."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(32, 6, generator=g), torch.randint(0, 3, (32,), generator=g)) for _ in range(steps)]
    return model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.05), batches

"""``benchmarks/hook_floor.py`` enters every hook NeuralDbg installs, once per step each, and leaves the
model, the optimizer module and ``torch.autograd.backward`` as it found them."""
from __future__ import annotations

import torch
from torch import nn
from torch.optim import optimizer as optimizer_module

from benchmarks import hook_floor
from benchmarks.overhead import make_data


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def test_the_hook_floor_enters_each_entry_point_once_per_step_and_removes_them(monkeypatch) -> None:
    calls = []
    monkeypatch.setattr(hook_floor, "_nothing", lambda *args, **kwargs: calls.append(1))
    models = []

    def make() -> nn.Module:
        models.append(Small())
        return models[-1]

    original = torch.autograd.backward
    wall, cpu = hook_floor.run_hook_floor(make, make_data(12), "sgd")
    # per step: the forward pre-hook, the criterion's hook, the end-of-backward callback, the patched
    # backward, the global step pre- and post-hooks and the optimizer's own post-hook
    assert len(calls) == 12 * 7
    assert wall > 0 and cpu > 0
    assert torch.autograd.backward is original
    model = models[0]
    assert not model._forward_hooks and not model._forward_pre_hooks
    assert not optimizer_module._global_optimizer_pre_hooks and not optimizer_module._global_optimizer_post_hooks

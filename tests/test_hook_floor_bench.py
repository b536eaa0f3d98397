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
    # backward (before and after the pass), the global step pre- and post-hooks and the optimizer's own post-hook
    assert len(calls) == 12 * 8
    assert wall > 0 and cpu > 0
    assert torch.autograd.backward is original
    model = models[0]
    assert not model._forward_hooks and not model._forward_pre_hooks
    assert not optimizer_module._global_optimizer_pre_hooks and not optimizer_module._global_optimizer_post_hooks


def test_skipped_step_rounds_alternate_the_variants_and_time_only_light_steps(monkeypatch, tmp_path) -> None:
    calls = []

    def fake_run(make_model, data, options, folder, trial, optimizer_name, warmup):
        calls.append(("bare" if options is None else "nothing recorded", warmup, options))
        return 1.0, 2.0

    def fake_floor(make_model, data, optimizer_name, warmup):
        calls.append(("hook entries alone", warmup, None))
        return 1.0, 3.0

    monkeypatch.setattr(hook_floor, "run", fake_run)
    monkeypatch.setattr(hook_floor, "run_hook_floor", fake_floor)
    found = hook_floor.skipped_step_rounds(Small, make_data(4), "sgd", 2, str(tmp_path))
    order = [variant for variant, _, _ in calls]
    assert order == list(hook_floor.SKIPPED) + list(hook_floor.SKIPPED)[::-1]
    assert {warmup for _, warmup, _ in calls} == {hook_floor.LIGHT_AFTER + 10}
    assert [options for variant, _, options in calls if variant == "nothing recorded"] == [
        {"summaries": None, "snapshots": None}] * 2
    assert found == {"bare": [2.0, 2.0], "nothing recorded": [2.0, 2.0], "hook entries alone": [3.0, 3.0]}

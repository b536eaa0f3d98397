"""Passes that record nothing run the chosen modules without NeuralDbg's hooks, and nothing is lost by it.

A forward hook that returns at once still sends every module call through torch's slow path, so NeuralDbg
takes its module hooks out for passes that record nothing and puts them back, at their old place among a
module's hooks, for passes that record. Compiled code guards on the hooks: then they stay.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from comgra_ndbg import NeuralDbg, open_recording


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 8)
        self.act = nn.Tanh()
        self.out = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.act(self.fc(x)))


def _ours(module: nn.Module, dbg: NeuralDbg) -> int:
    """How many of ``dbg``'s module hooks ``module`` holds now."""
    return sum(getattr(hook, "func", None) == dbg._hooks._hook for hook in module._forward_hooks.values())


def _step(model: nn.Module, criterion: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor,
          y: torch.Tensor) -> None:
    optimizer.zero_grad()
    criterion(model(x), y).backward()
    optimizer.step()


def test_hooks_leave_the_modules_for_skipped_passes_and_come_back_for_recorded_ones(tmp_path) -> None:
    torch.manual_seed(0)
    model, criterion = Net(), nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    held = {}  # step -> whether fc held NeuralDbg's hook during that step's forward pass

    def note(module: nn.Module, args: tuple) -> None:
        held[dbg.recorder.current_step] = _ours(module, dbg)

    model.fc.register_forward_pre_hook(note)
    data = [(torch.randn(4, 6), torch.randint(0, 3, (4,))) for _ in range(7)]
    with NeuralDbg(model, tmp_path, trial="t", loss=criterion, optimizer=optimizer, summaries=3,
                   snapshots=None) as dbg:
        for x, y in data:
            _step(model, criterion, optimizer, x, y)
    assert held == {0: 1, 1: 0, 2: 0, 3: 1, 4: 0, 5: 0, 6: 1}
    assert all(_ours(m, dbg) == 0 for m in model.modules())  # close() removed them, attached or not
    with open_recording(tmp_path, "t") as recording:
        for node in ("model.fc", "model.act", "model.out"):
            assert recording.summary(node)[0].tolist() == [0, 3, 6]
            assert recording.summary(node, "grad")[0].tolist() == [0, 3, 6]
        assert recording.kpi("loss")[0].tolist() == list(range(7))  # the loss of every step, skipped or not


def test_a_hook_of_the_user_keeps_its_place_before_or_after_neuraldbg_s(tmp_path) -> None:
    """A hook registered after NeuralDbg's that changes the output: NeuralDbg still records the module's own
    output, at every recorded step (also after skipped ones), and the one registered before still runs first."""
    torch.manual_seed(0)
    model, criterion = Net(), nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    order: list[str] = []
    model.act.register_forward_hook(lambda m, a, out: order.append("before"))
    raw: dict[int, torch.Tensor] = {}
    data = [(torch.randn(4, 6), torch.randint(0, 3, (4,))) for _ in range(5)]
    with NeuralDbg(model, tmp_path, trial="t", loss=criterion, optimizer=optimizer, summaries=2,
                   snapshots=None) as dbg:
        def doubled(module: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor:
            order.append("after")
            raw[dbg.recorder.current_step] = out.detach().clone()
            return out * 2

        model.act.register_forward_hook(doubled)
        for x, y in data:
            _step(model, criterion, optimizer, x, y)
        assert list(model.act._forward_hooks.values())[1].func == dbg._hooks._hook  # between the two, as placed
    assert order == ["before", "after"] * 5
    with open_recording(tmp_path, "t") as recording:
        steps, means = recording.summary("model.act")
        assert steps.tolist() == [0, 2, 4]
        np.testing.assert_allclose(means, [raw[s].double().mean().item() for s in (0, 2, 4)], rtol=1e-5)


def test_evaluation_passes_get_the_hooks_while_no_training_step_records(tmp_path) -> None:
    torch.manual_seed(0)
    model, criterion = Net(), nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    with NeuralDbg(model, tmp_path, trial="t", loss=criterion, optimizer=optimizer, summaries=None,
                   snapshots=None) as dbg:
        for step in range(4):
            _step(model, criterion, optimizer, torch.randn(4, 6), torch.randint(0, 3, (4,)))
            assert _ours(model.fc, dbg) == 0
            with torch.no_grad():
                seen.append(torch.tanh(model.fc(x := torch.randn(5, 6))).abs().mean().item())
                model(x)
    with open_recording(tmp_path, "t") as recording:
        steps, abs_mean = recording.kpi("eval/model.act/abs_mean", "eval")
        assert steps.tolist() == [0, 1, 2, 3]  # each run at the training step it follows
        np.testing.assert_allclose(abs_mean, seen, rtol=1e-5)


@pytest.mark.parametrize("compiled", ["wrapper", "inside"])
def test_compiled_code_pins_the_hooks(tmp_path, compiled) -> None:
    """Compiled code guards on the hooks: with the whole model compiled they never leave; with a part of it
    compiled they stay from the first recorded pass that ran it. Every recorded step has every output."""
    torch._dynamo.reset()
    try:
        torch.manual_seed(0)
        net, criterion = Net(), nn.CrossEntropyLoss()
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
        if compiled == "inside":
            net.fc = torch.compile(net.fc, backend="aot_eager")
        model = torch.compile(net, backend="aot_eager") if compiled == "wrapper" else net
        with NeuralDbg(model, tmp_path, trial="t", loss=criterion, optimizer=optimizer, summaries=2,
                       snapshots=None) as dbg:
            assert dbg._hooks.pinned == (compiled == "wrapper")
            for _ in range(6):
                _step(model, criterion, optimizer, torch.randn(4, 6), torch.randint(0, 3, (4,)))
            assert dbg._hooks.pinned and dbg._hooks.attached
        with open_recording(tmp_path, "t") as recording:
            for node in ("model.act", "model.out"):
                assert recording.summary(node)[0].tolist() == [0, 2, 4]
    finally:
        torch._dynamo.reset()


def test_the_model_itself_as_a_chosen_module_is_recorded_on_recorded_steps_only(tmp_path) -> None:
    """``modules=[""]`` hooks the model itself, whose own hooks also run NeuralDbg's step detection: taking
    its output hook out and back keeps the step detection's hook after it."""
    torch.manual_seed(0)
    model, criterion = Net(), nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with NeuralDbg(model, tmp_path, trial="t", loss=criterion, optimizer=optimizer, modules=[""], summaries=2,
                   snapshots=None) as dbg:
        for _ in range(5):
            _step(model, criterion, optimizer, torch.randn(4, 6), torch.randint(0, 3, (4,)))
        hooks = list(model._forward_hooks.values())
        assert hooks[0].func == dbg._hooks._hook and len(hooks) == 2  # the output hook, then step detection
    assert dbg.steps == 5
    with open_recording(tmp_path, "t") as recording:
        assert recording.summary("model")[0].tolist() == [0, 2, 4]
        assert recording.kpi("loss")[0].tolist() == [0, 1, 2, 3, 4]

"""The Recorder options NeuralDbg's hooks rely on, used directly through the explicit API."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from comgra_ndbg import Recorder, open_recording
from comgra_ndbg.errors import InvalidArgumentError
from comgra_ndbg.graph import GraphEdge


@pytest.mark.parametrize("set_to_none", [True, False])
def test_gradients_in_hook_survive_zero_grad_before_the_step_ends(tmp_path: Path, set_to_none: bool) -> None:
    """Whether ``zero_grad`` drops ``.grad`` or zeroes it in place, the step keeps the gradient its hook saw,
    summarised once."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    expected = []
    with Recorder(tmp_path, "hook") as rec:
        rec.track_module("model", model, node_suffix=".parameters", gradients_in_hook=True)
        for step in range(3):
            rec.start_step(step)
            for _ in range(2):  # two accumulations: the step records the last (the accumulated) gradient
                model(torch.randn(5, 4)).pow(2).mean().backward()
            expected.append(float(model[0].weight.grad.abs().max()))
            optimizer.step()
            optimizer.zero_grad(set_to_none=set_to_none)  # .grad is gone (or zero) before finish_step
            rec.finish_step()
    with open_recording(tmp_path, "hook") as recording:
        steps, counts = recording.summary("model.0.weight", "grad", "count")
        assert steps.tolist() == [0, 1, 2] and counts.tolist() == [24, 24, 24]
        assert recording.tensors_of("model.0.parameters")[0].module == "model.0"
        assert [t.label for t in recording.tensors_of("model.0.parameters")] == ["model.0.weight", "model.0.bias"]
        np.testing.assert_allclose(recording.summary("model.0.weight", "grad", "abs_max")[1], expected, rtol=1e-6)
        assert (recording.summary("model.0.weight", "update", "abs_max")[1] > 0).all()


def test_record_gradient_and_discovered_edges(tmp_path: Path) -> None:
    with Recorder(tmp_path, "t") as rec:
        rec.start_step(0)
        x = torch.randn(3, 2)
        rec.register_tensor("a", x, module="model.a")
        rec.register_tensor("b", x * 2)
        rec.register_tensor("c", x * 3)
        rec.add_dependency("a", "b", discovered=True)
        rec.add_dependency("a", "c")
        rec.record_gradient("b", torch.full((3, 2), 0.5))
        with pytest.raises(InvalidArgumentError, match="register_tensor"):
            rec.record_gradient("nothing", torch.ones(1))
        rec.finish_step()
    with open_recording(tmp_path, "t") as recording:
        assert recording.kinds("b") == ["value", "grad"]
        assert recording.summary("b", "grad", "mean")[1].tolist() == [0.5]
        assert recording.tensors_of("a")[0].module == "model.a"
        assert recording.graph().graph.edges == (GraphEdge("a", "b", "forward"), GraphEdge("a", "c", "manual"))

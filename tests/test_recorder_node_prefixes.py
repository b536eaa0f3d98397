"""``track_module(..., node_prefixes=...)``: the parameters under a prefix form one node, in the file and
in the graph, with every parameter still recorded as its own tensor (value, gradient, update)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from comgra_ndbg import InvalidArgumentError, Recorder, open_recording


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8))
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


def record(folder: Path, **track: object) -> Path:
    torch.manual_seed(0)
    net = Net()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    with Recorder(folder, trial="t") as rec:
        rec.track_module("net", net, **track)
        for step in range(3):
            with rec.step(step):
                x = rec.register_tensor("x", torch.randn(5, 4), role="input")
                out = rec.register_tensor("out", net(x), role="output")
                loss = rec.register_tensor("loss", out.pow(2).mean(), role="loss")
                optimizer.zero_grad()
                loss.backward()
                rec.record_gradients()
                optimizer.step()
    return folder


def test_parameters_under_a_prefix_form_one_node(tmp_path: Path) -> None:
    with open_recording(record(tmp_path, node_prefixes=["net.encoder"])) as recording:
        nodes = {t.name: t.node for t in recording.tensors if t.role == "parameter"}
        assert nodes == {"net.encoder.0.weight": "net.encoder", "net.encoder.0.bias": "net.encoder",
                         "net.encoder.2.weight": "net.encoder", "net.encoder.2.bias": "net.encoder",
                         "net.head.weight": "net.head", "net.head.bias": "net.head"}
        assert sorted(t.label for t in recording.tensors_of("net.encoder")) == ["0.bias", "0.weight", "2.bias",
                                                                                "2.weight"]
        modules = {t.name: t.module for t in recording.tensors if t.role == "parameter"}
        assert modules["net.encoder.2.weight"] == "net.encoder.2"  # the owning module is kept
        graph = recording.graph("default").graph
        assert graph.node("net.encoder").is_parameter_group
        assert set(graph.node("net.encoder").tensors) == {"net.encoder.0.weight", "net.encoder.0.bias",
                                                          "net.encoder.2.weight", "net.encoder.2.bias"}
        assert ("net.encoder", "out") in {(e.source, e.target) for e in graph.edges}
        steps, norms = recording.summary("net.encoder", "update", "l2", tensor="2.weight")
        assert steps.tolist() == [0, 1, 2] and np.all(norms > 0)
        assert recording.kinds("net.encoder.0.bias") == ["value", "grad", "update"]


def test_the_first_matching_prefix_wins_and_without_prefixes_nodes_are_modules(tmp_path: Path) -> None:
    with open_recording(record(tmp_path / "a", node_prefixes=["net.encoder.2", "net"])) as recording:
        nodes = {t.name: t.node for t in recording.tensors if t.role == "parameter"}
        assert nodes["net.encoder.2.weight"] == "net.encoder.2" and nodes["net.encoder.0.weight"] == "net"
        assert nodes["net.head.bias"] == "net"
    with open_recording(record(tmp_path / "b")) as recording:
        nodes = {t.name: t.node for t in recording.tensors if t.role == "parameter"}
        assert nodes["net.encoder.0.weight"] == "net.encoder.0" and nodes["net.head.bias"] == "net.head"


@pytest.mark.parametrize("prefixes", ["net.encoder", [""], [3]])
def test_bad_prefixes_are_rejected(tmp_path: Path, prefixes: object) -> None:
    with Recorder(tmp_path, trial="t") as rec, pytest.raises(InvalidArgumentError, match="node_prefixes"):
        rec.track_module("net", Net(), node_prefixes=prefixes)

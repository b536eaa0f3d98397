"""NeuralDbg with torch.compile: the same recording as eager, no graph break, no recompilation per step.

Most tests use the ``aot_eager`` backend (Dynamo and AOTAutograd, as with Inductor, without code
generation); one test uses Inductor itself. Dynamo's caches are process-wide and keyed by code object, so
every test starts and ends with ``torch._dynamo.reset()``.
"""
from __future__ import annotations

import collections
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters

from comgra_ndbg import NeuralDbg, RecorderWarning, open_recording
from comgra_ndbg.instrument import hooks as hooks_module

STATS = ("mean", "abs_mean", "abs_max", "min", "max", "l2")


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(x))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(8, 16)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.act = nn.Tanh()
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        for block in self.blocks:
            h = block(h)
        return self.head(self.act(h))


class Pair(nn.Module):
    """A leaf module (parameters, no submodules) whose output is a tuple."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(16, 16) / 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = x @ self.weight
        return torch.tanh(h), torch.sigmoid(h)


class Named(nn.Module):
    """A leaf module whose output is a dict."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"sum": a + b, "product": a * b}


class MultiOutputNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(8, 16)
        self.pair = Pair()
        self.named = Named()
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.pair(self.stem(x))
        parts = self.named(a, b)
        return self.head(parts["sum"] - parts["product"])


class Fields(collections.OrderedDict):
    """A dict whose items are also attributes, as the model-output classes of some libraries are."""

    def __getattr__(self, name: str) -> torch.Tensor:
        try:
            return self[name]
        except KeyError as error:
            raise AttributeError(name) from error


@dataclass
class Halves:
    low: torch.Tensor
    high: torch.Tensor
    parts: int = 2


@dataclass(frozen=True)
class FrozenHalves:
    low: torch.Tensor
    high: torch.Tensor


class ReadOnly(dict):
    def __setitem__(self, key: str, value: torch.Tensor) -> None:
        raise TypeError("read-only")


class AttributeOutput(nn.Module):
    def forward(self, x: torch.Tensor) -> Fields:
        return Fields(up=torch.tanh(x), down=-x)


class DataclassOutput(nn.Module):
    def __init__(self, kind: type = Halves) -> None:
        super().__init__()
        self.kind = kind

    def forward(self, x: torch.Tensor) -> Halves | FrozenHalves:
        return self.kind(x[:, :8], x[:, 8:])


class ReadOnlyOutput(nn.Module):
    def forward(self, x: torch.Tensor) -> ReadOnly:
        return ReadOnly(twice=2 * x)


class OutputsNet(nn.Module):
    """Leaf modules whose outputs are a dict subclass read by attribute and a dataclass instance (or, with
    ``frozen``, a frozen dataclass and a read-only dict: the gradients of those cannot be tapped)."""

    def __init__(self, frozen: bool = False) -> None:
        super().__init__()
        self.stem = nn.Linear(8, 16)
        self.fields = ReadOnlyOutput() if frozen else AttributeOutput()
        self.halves = DataclassOutput(FrozenHalves if frozen else Halves)
        self.head = nn.Linear(8, 3)
        self.frozen = frozen

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.fields(self.stem(x))
        h = out["twice"] if self.frozen else out.up + out.down
        halves = self.halves(h)
        return self.head(halves.low * halves.high)


def make(kind: str) -> nn.Module:
    torch.manual_seed(0)
    if kind == "net":
        return Net()
    if kind == "multi":
        return MultiOutputNet()
    if kind in ("outputs", "frozen outputs"):
        return OutputsNet(frozen=kind == "frozen outputs")
    return nn.Sequential(nn.Linear(8, 16), Block(), Block(), nn.Tanh(), nn.Linear(16, 3))


def data(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(32, 8, generator=g), torch.randint(0, 3, (32,), generator=g)) for _ in range(steps)]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def record(folder: Path, kind: str, pattern: str, backend: str = "aot_eager", steps: int = 8,
           accumulate: int = 1, compiled_backward: bool = False, every: list[str] | None = None
           ) -> tuple[dict, list[str]]:
    """Train with the plain training loop under one compile pattern (``compiled_backward``: the backward passes
    under compiled autograd); returns Dynamo's counters and the recorder's warnings (``every`` receives all)."""
    model, criterion = make(kind), nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    counters.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if pattern == "compiled outside":
            net = torch.compile(model, backend=backend)
            dbg = NeuralDbg(net, folder, trial="t", loss=criterion)
        else:
            dbg = NeuralDbg(model, folder, trial="t", loss=criterion)
            if pattern == "compiled inside":
                net = torch.compile(model, backend=backend)
            elif pattern == "module.compile":
                model.compile(backend=backend)
                net = model
            elif pattern == "one block compiled":
                model.blocks[1].compile(backend=backend) if kind == "net" else model[2].compile(backend=backend)
                net = model
            else:
                net = model
        with dbg:
            batches = data(steps * accumulate)
            for step in range(steps):
                optimizer.zero_grad()
                for inputs, targets in batches[step * accumulate:(step + 1) * accumulate]:
                    loss = criterion(net(inputs), targets)
                    if compiled_backward:
                        from torch._dynamo import compiled_autograd
                        with compiled_autograd._enable(torch.compile(backend="eager")):
                            loss.backward()
                    else:
                        loss.backward()
                optimizer.step()
    if every is not None:
        every += [str(w.message) for w in caught]
    seen = {key: dict(value) for key, value in counters.items()}
    return seen, [str(w.message) for w in caught if issubclass(w.category, RecorderWarning)]


def assert_same_recording(eager_folder: Path, compiled_folder: Path) -> None:
    with open_recording(eager_folder) as eager, open_recording(compiled_folder) as compiled:
        assert compiled.steps.tolist() == eager.steps.tolist()
        layout = sorted((t.name, t.node, t.role, t.bounds) for t in eager.tensors)
        # a compiled region's outputs are registered when the root module's forward ends, later than eager ones
        assert sorted((t.name, t.node, t.role, t.bounds) for t in compiled.tensors) == layout
        assert any(bounds == (-1.0, 1.0) for _, _, _, bounds in layout)  # a tanh output
        compared = 0
        for tensor in eager.tensors:
            assert compiled.kinds(tensor.name) == eager.kinds(tensor.name), tensor.name
            for kind in eager.kinds(tensor.name):
                for stat in STATS:
                    np.testing.assert_allclose(compiled.summary(tensor.name, kind, stat)[1],
                                               eager.summary(tensor.name, kind, stat)[1], rtol=2e-4, atol=1e-7,
                                               err_msg=f"{tensor.name} {kind} {stat}")
                    compared += 1
        assert compared > 100
        eager_graph, compiled_graph = eager.graph().graph, compiled.graph().graph
        assert compiled_graph.edges == eager_graph.edges


@pytest.mark.parametrize("kind, pattern", [("net", "compiled inside"), ("net", "compiled outside"),
                                           ("seq", "compiled outside"), ("seq", "compiled inside"),
                                           ("net", "module.compile"), ("net", "one block compiled"),
                                           ("seq", "one block compiled"), ("multi", "compiled inside"),
                                           ("outputs", "compiled inside")])
def test_compiled_model_records_what_eager_records_without_graph_breaks_or_recompiles(
        tmp_path: Path, kind: str, pattern: str) -> None:
    record(tmp_path / "eager", kind, "eager", steps=5)
    seen, warned = record(tmp_path / "compiled", kind, pattern, steps=5)
    assert warned == []
    assert seen["stats"]["unique_graphs"] == 1  # one compilation for all 5 steps
    breaks = sum(seen.get("graph_break", {}).values())
    # A torch.nn container compiled by torch.compile(model) traces its own hooks, and NeuralDbg's root
    # hooks (torch.compiler.disable'd) break the frame once, before the graph; elsewhere there is none.
    assert breaks == (1 if (kind, pattern) == ("seq", "compiled inside") else 0)
    assert_same_recording(tmp_path / "eager", tmp_path / "compiled")


@pytest.mark.slow
def test_a_compiled_model_under_compiled_autograd_records_the_gradients_of_eager_passes(tmp_path: Path) -> None:
    """Compiled autograd traces a backward pass's hooks with dynamo: NeuralDbg's hooks on the compiled region's
    outputs and on the loss run untraced (nothing of the recorder is traced, no dynamo warning), and every
    gradient is the eager run's."""
    record(tmp_path / "eager", "net", "eager", steps=4)
    every: list[str] = []
    _, warned = record(tmp_path / "compiled", "net", "compiled outside", steps=4, compiled_backward=True, every=every)
    assert warned == [] and not [m for m in every if "Dynamo" in m or "dynamo" in m], every
    with open_recording(tmp_path / "eager") as eager, open_recording(tmp_path / "compiled") as compiled:
        graded = [t.name for t in eager.tensors if "grad" in eager.kinds(t.name)]
        assert len(graded) > 5 and "loss" in graded
        for name in graded:
            steps, means = compiled.summary(name, "grad", "mean")
            assert steps.tolist() == [0, 1, 2, 3], name
            np.testing.assert_allclose(means, eager.summary(name, "grad", "mean")[1], rtol=2e-4, atol=1e-7,
                                       err_msg=name)

def test_compiled_gradient_accumulation_attributes_each_pass_to_its_iteration(tmp_path: Path) -> None:
    record(tmp_path / "eager", "net", "eager", steps=4, accumulate=3)
    seen, warned = record(tmp_path / "compiled", "net", "compiled inside", steps=4, accumulate=3)
    assert warned == [] and seen["stats"]["unique_graphs"] == 1
    assert_same_recording(tmp_path / "eager", tmp_path / "compiled")
    with open_recording(tmp_path / "eager") as eager, open_recording(tmp_path / "compiled") as compiled:
        for iteration in range(3):
            np.testing.assert_allclose(compiled.summary("model.stem", "grad", "l2", iteration=iteration)[1],
                                       eager.summary("model.stem", "grad", "l2", iteration=iteration)[1], rtol=2e-4)


def test_outputs_whose_gradients_cannot_be_tapped_keep_their_values_and_training_runs_on(tmp_path: Path) -> None:
    record(tmp_path / "eager", "frozen outputs", "eager", steps=3)
    seen, warned = record(tmp_path / "compiled", "frozen outputs", "compiled inside", steps=3)
    assert warned == [] and seen["stats"]["unique_graphs"] == 1
    with open_recording(tmp_path / "eager") as eager, open_recording(tmp_path / "compiled") as compiled:
        assert compiled.steps.tolist() == [0, 1, 2]
        for name in ("model.fields[twice]", "model.halves[low]", "model.halves[high]"):
            assert eager.kinds(name) == ["value", "grad"] and compiled.kinds(name) == ["value"], name
            np.testing.assert_allclose(compiled.summary(name, "value", "l2")[1], eager.summary(name, "value", "l2")[1],
                                       rtol=2e-4)
        np.testing.assert_allclose(compiled.summary("loss", "value", "mean")[1],
                                   eager.summary("loss", "value", "mean")[1], rtol=2e-4)


@pytest.mark.slow  # Inductor generates and compiles C++ for the forward and backward graphs: 10-20 s on 2 cores
def test_inductor_records_what_eager_records(tmp_path: Path) -> None:
    record(tmp_path / "eager", "net", "eager", steps=5)
    seen, warned = record(tmp_path / "compiled", "net", "compiled inside", backend="inductor", steps=5)
    assert warned == [] and seen["stats"]["unique_graphs"] == 1 and not seen.get("graph_break")
    assert_same_recording(tmp_path / "eager", tmp_path / "compiled")


def test_after_leaving_a_compiled_model_computes_exactly_as_an_uninstrumented_one(tmp_path: Path) -> None:
    model, criterion = make("net"), nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    net = torch.compile(model, backend="aot_eager")
    with NeuralDbg(model, tmp_path, trial="t", loss=criterion) as dbg:
        for inputs, targets in data(3):
            optimizer.zero_grad()
            criterion(net(inputs), targets).backward()
            optimizer.step()
    slots = set(dbg._hooks._paths)
    assert not slots & set(hooks_module._SINKS)
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    twin = make("net")
    twin.load_state_dict(model.state_dict())
    twin_net = torch.compile(twin, backend="aot_eager")
    for inputs, targets in data(2):
        model.zero_grad()
        out_a, out_b = net(inputs), twin_net(inputs)
        criterion(out_a, targets).backward()
        criterion(out_b, targets).backward()
        assert torch.equal(out_a, out_b)
        assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), twin.parameters()))
        twin.zero_grad()
    assert dbg._hooks.stash == []  # compiled code that still held the hooks no longer runs them
    with open_recording(tmp_path) as rec:
        assert len(rec.steps) == 3


@pytest.mark.parametrize("kind", ["net", "seq"])
def test_a_model_compiled_and_called_before_hooking_is_recorded_in_full(tmp_path: Path, kind: str) -> None:
    """torch.compile does not guard on hooks: code traced before NeuralDbg hooked the model is dropped, so
    the first recorded pass traces the hooks (it used to record no module output, with a warning)."""
    record(tmp_path / "eager", kind, "eager", steps=3)
    model, criterion = make(kind), nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    net = torch.compile(model, backend="aot_eager")
    with torch.no_grad():
        net(data(1)[0][0])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with NeuralDbg(net, tmp_path / "compiled", trial="t", loss=criterion):
            for inputs, targets in data(3):
                optimizer.zero_grad()
                criterion(net(inputs), targets).backward()
                optimizer.step()
    assert [str(w.message) for w in caught if issubclass(w.category, RecorderWarning)] == []
    assert_same_recording(tmp_path / "eager", tmp_path / "compiled")


@pytest.mark.parametrize("how", ["torch.compile", "module.compile"])
def test_another_instance_of_the_class_compiled_earlier_does_not_hide_the_modules(tmp_path: Path, how: str) -> None:
    """Dynamo reuses the code traced for an earlier instance of the same class (its guards pass, hooks are
    not guarded): that code is dropped when NeuralDbg hooks the new instance."""
    record(tmp_path / "eager", "net", "eager", steps=3)
    earlier = make("net")
    torch.compile(earlier, backend="aot_eager")(data(1)[0][0]).sum().backward()
    model, criterion = make("net"), nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with NeuralDbg(model, tmp_path / "compiled", trial="t", loss=criterion):
            if how == "module.compile":
                model.compile(backend="aot_eager")
                net = model
            else:
                net = torch.compile(model, backend="aot_eager")
            for inputs, targets in data(3):
                optimizer.zero_grad()
                criterion(net(inputs), targets).backward()
                optimizer.step()
    assert [str(w.message) for w in caught if issubclass(w.category, RecorderWarning)] == []
    assert_same_recording(tmp_path / "eager", tmp_path / "compiled")
    twin = make("net")
    assert torch.equal(torch.compile(earlier, backend="aot_eager")(data(1)[0][0]), twin(data(1)[0][0]))

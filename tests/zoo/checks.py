"""What every zoo model is checked for: training bit-identical to the bare loop, the expected graph (kept as a
readable fixture in ``expected/``), one recorded step per optimizer step, and no failure on a healthy run."""
from __future__ import annotations

import graphlib
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from comgra_ndbg import RecorderWarning, open_recording
from comgra_ndbg.graph import DependencyGraph
from comgra_ndbg.instrument import patches

EXPECTED = Path(__file__).parent / "expected"


@dataclass
class Run:
    """What one training run left: per-step losses, and the state that must be bit-identical."""

    losses: list[float] = field(default_factory=list)
    optimizer_steps: int = 0
    state: list[tuple[str, torch.Tensor]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def snapshot_state(modules: dict[str, nn.Module], optimizers: dict[str, torch.optim.Optimizer]) -> list:
    """Every parameter, buffer, ``.grad``, optimizer state tensor, the global RNG, and the number of hooks on
    the modules, parameters and optimizers (none may be left after NeuralDbg closed), by name."""
    state = [("rng", torch.get_rng_state())]
    for key, module in modules.items():
        hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
                    for m in module.modules())
        hooks += sum(len(p._post_accumulate_grad_hooks or {}) + len(p._backward_hooks or {})
                     for p in module.parameters())
        state.append((f"{key}.hooks", torch.tensor(hooks)))
        state += [(f"{key}.{name}", p.detach().clone()) for name, p in module.named_parameters()]
        state += [(f"{key}.{name}.grad", p.grad.clone()) for name, p in module.named_parameters() if p.grad is not None]
        state += [(f"{key}.{name}", b.clone()) for name, b in module.named_buffers()]
        state += [(f"{key}.{name}.requires_grad", torch.tensor(p.requires_grad))
                  for name, p in module.named_parameters()]
    for key, optimizer in optimizers.items():
        state.append((f"{key}.hooks", torch.tensor(len(optimizer._optimizer_step_pre_hooks)
                                                   + len(optimizer._optimizer_step_post_hooks))))
        for index, entry in optimizer.state_dict()["state"].items():
            state += [(f"{key}.state.{index}.{k}", v.clone() if isinstance(v, torch.Tensor) else torch.tensor(v))
                      for k, v in entry.items()]
    return state


def assert_bit_identical(bare: Run, recorded: Run) -> None:
    assert recorded.losses == bare.losses
    assert [name for name, _ in recorded.state] == [name for name, _ in bare.state]
    for (name, a), (_, b) in zip(bare.state, recorded.state):
        assert a.dtype == b.dtype and torch.equal(a, b), name


def record_and_compare(train: Callable[[bool, Path], Run], folder: Path) -> Run:
    """Run ``train`` bare and recorded (``train(recorded, folder)``), assert bit-identical training and that
    every process-wide patch is gone; returns the recorded run, with its RecorderWarnings."""
    bare = train(False, folder)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        recorded = train(True, folder)
    recorded.warnings = [str(w.message) for w in caught if issubclass(w.category, RecorderWarning)]
    assert not patches.installed()
    assert_bit_identical(bare, recorded)
    return recorded


def edge_lines(graph: DependencyGraph) -> list[str]:
    """The node-level edges, one ``source -> target`` per line (``~>`` for an edge between iterations)."""
    return sorted(f"{e.source} {'~>' if e.kind == 'iteration' else '->'} {e.target}" for e in graph.edges)


def expected_edges(name: str) -> list[str]:
    """The reviewed edge list ``expected/<name>.txt``: one edge per line; a line starting with ``#`` is a
    comment (node names hold ``#`` too: ``model.relu#1``)."""
    lines = [line.strip() for line in (EXPECTED / f"{name}.txt").read_text().splitlines()]
    return sorted(line for line in lines if line and not line.startswith("#"))


def assert_graph(folder: Path, trial: str, name: str) -> DependencyGraph:
    """The recorded graph equals the fixture, its forward edges form no cycle, and every node is linked."""
    with open_recording(folder, trial) as rec:
        graph = rec.graph(rec.step_types[0]).graph
    assert edge_lines(graph) == expected_edges(name)
    assert_acyclic(graph)
    linked = {e.source for e in graph.edges} | {e.target for e in graph.edges}
    assert sorted(set(graph.node_names) - linked) == []  # no orphan: every used parameter and tensor is linked
    return graph


def assert_acyclic(graph: DependencyGraph) -> None:
    """The forward (same-iteration) edges form no cycle."""
    sorter = graphlib.TopologicalSorter()
    for e in graph.edges:
        if e.kind != "iteration":
            sorter.add(e.target, e.source)
    sorter.prepare()  # raises graphlib.CycleError on a cycle


def assert_steps(folder: Path, trial: str, optimizer_steps: int) -> None:
    with open_recording(folder, trial) as rec:
        assert rec.steps.tolist() == list(range(optimizer_steps))
        assert rec.kpi("loss")[0].tolist() == list(range(optimizer_steps))

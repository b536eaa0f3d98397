"""Node-level graph, regrouping, identity and serialisation: pure functions on hand-written tensor edges."""
from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from comgra_ndbg.errors import UnknownSeriesError
from comgra_ndbg.graph import (
    DependencyGraph,
    GraphEdge,
    GraphError,
    GraphNode,
    TensorEdge,
    TensorInfo,
    build_graph,
    collapse_modules,
    expand_modules,
    graph_from_dict,
    graph_to_dict,
    structure_hash,
    tensor_metadata,
)

REPO = Path(__file__).resolve().parents[1]


def parameter(name: str) -> tuple[str, tuple[str, str, str]]:
    module = name.rpartition(".")[0]
    return name, (module, "parameter", module)


METADATA = dict(
    [
        ("input", ("input", "input", "")),
        ("hidden", ("hidden", "intermediate", "model.encoder")),
        ("state", ("state", "intermediate", "")),
        ("output", ("output", "output", "")),
        ("target", ("target", "target", "")),
        ("loss", ("loss", "loss", "")),
        parameter("model.encoder.0.weight"),
        parameter("model.encoder.0.bias"),
        parameter("model.encoder.2.weight"),
        parameter("model.head.weight"),
    ]
)
TENSOR_EDGES = [
    TensorEdge("input", "hidden", 0, 0),
    TensorEdge("model.encoder.0.weight", "hidden", 0, 0),
    TensorEdge("model.encoder.0.bias", "hidden", 0, 0),
    TensorEdge("model.encoder.2.weight", "hidden", 0, 0),
    TensorEdge("hidden", "state", 0, 0),
    TensorEdge("state", "state", 0, 1),
    TensorEdge("input", "state", 1, 1),
    TensorEdge("state", "output", 1, 1),
    TensorEdge("model.head.weight", "output", 1, 1),
    TensorEdge("output", "loss", 1, 1),
]
MANUAL = [TensorEdge("target", "loss", 1, 1), TensorEdge("output", "loss", 1, 1)]


def graph() -> DependencyGraph:
    return build_graph(TENSOR_EDGES, METADATA, manual_edges=MANUAL)


def test_build_graph_nodes_edges_and_kinds() -> None:
    g = graph()
    assert g.edges == (
        GraphEdge("hidden", "state", "forward"),
        GraphEdge("input", "hidden", "forward"),
        GraphEdge("input", "state", "forward"),
        GraphEdge("model.encoder.0", "hidden", "forward"),
        GraphEdge("model.encoder.2", "hidden", "forward"),
        GraphEdge("model.head", "output", "forward"),
        GraphEdge("output", "loss", "forward"),
        GraphEdge("state", "output", "forward"),
        GraphEdge("state", "state", "iteration"),
        GraphEdge("target", "loss", "manual"),
    )
    assert g.node("model.encoder.0") == GraphNode(
        "model.encoder.0", "parameter", "model.encoder.0", ("model.encoder.0.bias", "model.encoder.0.weight"),
        True, ("bias", "weight"),
    )
    assert g.node("hidden") == GraphNode(
        "hidden", "intermediate", "model.encoder", ("hidden",), False, ("intermediate",)
    )
    assert g.node_names == ("hidden", "input", "loss", "model.encoder.0", "model.encoder.2", "model.head", "output",
                            "state", "target")
    assert g.manual_edges == (TensorEdge("target", "loss", 1, 1),)
    assert g.tensor_edges == tuple(sorted(TENSOR_EDGES))
    assert g.predecessors("hidden") == ("input", "model.encoder.0", "model.encoder.2")
    assert g.successors("state", kinds=("forward",)) == ("output",)
    assert g.predecessors("state", kinds=("iteration",)) == ("state",)


def test_unknown_node_is_a_key_error_that_names_it() -> None:
    with pytest.raises(UnknownSeriesError, match="decoder") as caught:
        graph().node("decoder")
    assert isinstance(caught.value, KeyError)


def test_tensors_of_one_node_hide_their_internal_edges_and_pick_the_most_specific_role() -> None:
    metadata = {"q": ("attention", "intermediate", "model.attn"), "out": ("attention", "output", "model.attn.proj"),
                "x": ("x", "input", "")}
    g = build_graph(
        [TensorEdge("x", "q", 0, 0), TensorEdge("q", "out", 0, 0), TensorEdge("out", "q", 0, 1)], metadata
    )
    assert g.edges == (GraphEdge("attention", "attention", "iteration"), GraphEdge("x", "attention", "forward"))
    assert g.node("attention") == GraphNode("attention", "output", "model.attn", ("out", "q"), False,
                                            ("output", "intermediate"))


def test_tensors_without_metadata_are_rejected_and_isolated_tensors_are_nodes() -> None:
    with pytest.raises(GraphError, match="'ghost'"):
        build_graph([TensorEdge("ghost", "input", 0, 0)], {"input": ("input", "input", "")})
    with pytest.raises(GraphError, match="'input'"):
        build_graph([], {"input": ("input", "input")})
    assert build_graph([], {"input": ("input", "input", "")}).node_names == ("input",)


def test_collapse_and_expand_parameter_nodes_by_module_prefix() -> None:
    g = graph()
    collapsed = collapse_modules(g, "model.encoder")
    assert collapsed.node("model.encoder") == GraphNode(
        "model.encoder", "parameter", "model.encoder",
        ("model.encoder.0.bias", "model.encoder.0.weight", "model.encoder.2.weight"),
        True, ("0.bias", "0.weight", "2.weight"),
    )
    assert [e for e in collapsed.edges if e.target == "hidden"] == [
        GraphEdge("input", "hidden", "forward"),
        GraphEdge("model.encoder", "hidden", "forward"),
    ]
    assert "model.encoder.0" not in collapsed.node_names and collapsed.tensor_edges == g.tensor_edges
    assert expand_modules(collapsed, "model.encoder") == g
    assert expand_modules(collapsed) == g
    assert expand_modules(g) == g

    everything = collapse_modules(collapsed, "model")
    assert everything.node("model").roles == ("encoder.0.bias", "encoder.0.weight", "encoder.2.weight", "head.weight")
    assert [e for e in everything.edges if e.source == "model"] == [
        GraphEdge("model", "hidden", "forward"),
        GraphEdge("model", "output", "forward"),
    ]
    assert expand_modules(everything, "model") == g
    assert build_graph(g.tensor_edges, tensor_metadata(collapsed), manual_edges=g.manual_edges) == collapsed


def test_collapse_needs_a_prefix_that_owns_parameters() -> None:
    with pytest.raises(GraphError, match="model.decoder"):
        collapse_modules(graph(), "model.decoder")
    with pytest.raises(GraphError):
        collapse_modules(graph(), "")
    with pytest.raises(GraphError):  # a prefix is a whole path component, not a string prefix
        collapse_modules(graph(), "model.enc")


def test_dict_round_trip_through_json() -> None:
    for g in (graph(), collapse_modules(graph(), "model.encoder"), build_graph([], {})):
        data = json.loads(json.dumps(graph_to_dict(g)))
        assert graph_from_dict(data) == g
        assert structure_hash(graph_from_dict(data)) == structure_hash(g)


def test_dict_form_is_plain_and_compact() -> None:
    metadata = {"x": ("x", "input", ""), "y": ("y", "output", "m")}
    data = graph_to_dict(build_graph([TensorEdge("x", "y", 0, 1)], metadata))
    assert data == {
        "format": "comgra_ndbg.dependency_graph",
        "version": 1,
        "nodes": [
            {"name": "x", "role": "input", "module": "", "tensors": ["x"], "roles": ["input"],
             "is_parameter_group": False},
            {"name": "y", "role": "output", "module": "m", "tensors": ["y"], "roles": ["output"],
             "is_parameter_group": False},
        ],
        "edges": [["x", "y", "iteration"]],
        "tensors": [["x", "x", "input", ""], ["y", "y", "output", "m"]],
        "tensor_edges": [["x", "y", 0, 1]],
        "manual_edges": [],
    }


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d.update(format="something else"),
        lambda d: d.update(version=99),
        lambda d: d.pop("edges"),
        lambda d: d["edges"].append(["x", "y", "sideways"]),
        lambda d: d["tensor_edges"].append(["x", "y", "0", 1]),
        lambda d: d["nodes"][0].update(is_parameter_group="no"),
        lambda d: d["tensors"].append(["x", "x", "input"]),
    ],
)
def test_malformed_descriptions_raise_graph_error(change) -> None:
    data = graph_to_dict(graph())
    change(data)
    with pytest.raises(GraphError):
        graph_from_dict(data)


def test_structure_hash_is_pinned_and_sensitive() -> None:
    g = graph()
    # Recordings store graphs under this hash: if it changes, bump GRAPH_FORMAT_VERSION on purpose.
    assert structure_hash(g) == "3816ef675a64d0f9"
    assert structure_hash(collapse_modules(g, "model.encoder")) != structure_hash(g)
    changed = build_graph(TENSOR_EDGES[:-1], METADATA, manual_edges=MANUAL)
    assert structure_hash(changed) != structure_hash(g)
    shuffled = build_graph(reversed(TENSOR_EDGES), dict(reversed(METADATA.items())), manual_edges=MANUAL[::-1])
    assert structure_hash(shuffled) == structure_hash(g)


DISCOVERY_SCRIPT = """
import torch
from torch import nn
from comgra_ndbg.graph import build_graph, discover_edges, structure_hash
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
x = torch.randn(5, 3, requires_grad=True)
hidden = model[0](x)
output = model[2](model[1](hidden))
q, k = output.chunk(2, dim=-1)
tensors = [("input", 0, x), ("hidden", 0, hidden), ("output", 0, output), ("q", 0, q), ("k", 0, k)]
parameters = {f"model.{name}": p for name, p in model.named_parameters()}
metadata = {name: (name, "intermediate", "") for name, _, _ in tensors}
metadata.update({name: (name.rpartition(".")[0], "parameter", name.rpartition(".")[0]) for name in parameters})
print(structure_hash(build_graph(discover_edges(tensors, parameters), metadata)))
"""


def test_structure_hash_of_a_discovered_graph_is_the_same_in_another_process() -> None:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(DISCOVERY_SCRIPT, {})
    env = dict(os.environ, PYTHONHASHSEED="12345", PYTHONPATH=str(REPO))
    other = subprocess.run([sys.executable, "-c", DISCOVERY_SCRIPT], env=env, capture_output=True, text=True,
                           check=True, timeout=120)
    assert other.stdout.strip() == printed.getvalue().strip()
    assert len(printed.getvalue().strip()) == 16


def test_graph_objects_are_frozen_and_hashable() -> None:
    g = graph()
    with pytest.raises(AttributeError):
        g.nodes = ()  # type: ignore[misc]
    assert len({g, graph()}) == 1
    assert TensorInfo("a", "a", "input", "") < TensorInfo("b", "a", "input", "")

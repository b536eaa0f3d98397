"""Discovery of tensor edges from autograd: exact edge sets on small real models run on random data."""
from __future__ import annotations

import math
import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from comgra_ndbg.graph import (
    GraphCache,
    GraphEdge,
    TensorEdge,
    build_graph,
    discover_edges,
    find_compiled_tensors,
    merge_manual_edges,
    structure_signature,
)
from comgra_ndbg.graph.discovery import autograd_origin
from comgra_ndbg.graph.eager import discover_module_structure, unwrap_compiled
from comgra_ndbg.graph.model import GraphError


def edge(source: str, target: str, source_iteration: int = 0, target_iteration: int | None = None) -> TensorEdge:
    target_iteration = source_iteration if target_iteration is None else target_iteration
    return TensorEdge(source, target, source_iteration, target_iteration)


def parameters_of(module: nn.Module, name: str = "model") -> dict[str, torch.Tensor]:
    return {f"{name}.{parameter_name}": p for parameter_name, p in module.named_parameters()}


def parameter_metadata(parameters: dict[str, torch.Tensor]) -> dict[str, tuple[str, str, str]]:
    """The recorder's convention: a parameter belongs to the node named by its owning module's path."""
    return {name: (name.rpartition(".")[0], "parameter", name.rpartition(".")[0]) for name in parameters}


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        hidden = self.fc1(x)
        activation = self.act(hidden)
        return self.fc2(activation), hidden, activation


def test_mlp_edges_from_input_hidden_parameters_to_loss() -> None:
    model = MLP()
    x = torch.randn(5, 4, requires_grad=True)
    y = torch.randint(0, 3, (5,))
    output, hidden, activation = model(x)
    loss = F.cross_entropy(output, y)
    tensors = [("input", 0, x), ("hidden", 0, hidden), ("activation", 0, activation), ("output", 0, output),
               ("target", 0, y), ("loss", 0, loss)]

    edges = discover_edges(tensors, parameters_of(model))

    assert edges == [
        edge("activation", "output"),
        edge("hidden", "activation"),
        edge("input", "hidden"),
        edge("model.fc1.bias", "hidden"),
        edge("model.fc1.weight", "hidden"),
        edge("model.fc2.bias", "output"),
        edge("model.fc2.weight", "output"),
        edge("output", "loss"),
        edge("target", "loss"),
    ]


def test_input_without_grad_is_found_through_the_tensors_autograd_saved() -> None:
    model = MLP()
    x = torch.randn(5, 4)
    output, hidden, _activation = model(x)
    edges = discover_edges([("input", 0, x), ("hidden", 0, hidden), ("output", 0, output)], parameters_of(model))
    assert edges == [
        edge("hidden", "output"),
        edge("input", "hidden"),
        edge("model.fc1.bias", "hidden"),
        edge("model.fc1.weight", "hidden"),
        edge("model.fc2.bias", "output"),
        edge("model.fc2.weight", "output"),
    ]


def test_discovery_changes_no_tensor_and_computes_no_gradient() -> None:
    model = MLP()
    x = torch.randn(5, 4, requires_grad=True)
    output, hidden, _activation = model(x)
    before = (hidden.grad_fn, output.grad_fn, x.requires_grad, hidden.requires_grad, output._version)

    discover_edges([("input", 0, x), ("hidden", 0, hidden), ("output", 0, output)], parameters_of(model))

    assert (hidden.grad_fn, output.grad_fn, x.requires_grad, hidden.requires_grad, output._version) == before
    assert x.grad is None and all(p.grad is None for p in model.parameters())
    output.sum().backward()
    assert x.grad is not None and model.fc1.weight.grad is not None


def test_residual_blocks_have_skip_edges_from_block_input_and_branch() -> None:
    blocks = nn.ModuleList(nn.Linear(6, 6) for _ in range(2))
    x = torch.randn(3, 6, requires_grad=True)
    tensors = [("input", 0, x)]
    h = x
    for i, block in enumerate(blocks):
        branch = torch.tanh(block(h))
        tensors.append((f"block{i}.f", 0, branch))
        h = h + branch
        tensors.append((f"block{i}.out", 0, h))

    edges = discover_edges(tensors, parameters_of(blocks, "blocks"))

    assert edges == [
        edge("block0.f", "block0.out"),
        edge("block0.out", "block1.f"),
        edge("block0.out", "block1.out"),
        edge("block1.f", "block1.out"),
        edge("blocks.0.bias", "block0.f"),
        edge("blocks.0.weight", "block0.f"),
        edge("blocks.1.bias", "block1.f"),
        edge("blocks.1.weight", "block1.f"),
        edge("input", "block0.f"),
        edge("input", "block0.out"),
    ]


def test_recurrent_model_links_iterations_and_shows_an_iteration_self_loop() -> None:
    model = nn.ModuleDict({"cell": nn.RNNCell(3, 4), "head": nn.Linear(4, 2)})
    xs = torch.randn(3, 2, 3, requires_grad=True)
    h = torch.zeros(2, 4)
    tensors = []
    for i in range(3):
        tensors.append(("input", i, xs[i]))
        h = model["cell"](tensors[-1][2], h)
        tensors.append(("h", i, h))
    tensors.append(("output", 2, model["head"](h)))

    edges = discover_edges(tensors, parameters_of(model))

    cell = [f"model.cell.{name}" for name in ("bias_hh", "bias_ih", "weight_hh", "weight_ih")]
    assert edges == sorted(
        [edge("h", "h", 0, 1), edge("h", "h", 1, 2), edge("h", "output", 2)]
        + [edge("input", "h", i) for i in range(3)]
        + [edge(name, "h", i) for name in cell for i in range(3)]
        + [edge("model.head.bias", "output", 2), edge("model.head.weight", "output", 2)]
    )
    metadata = {"input": ("input", "input", ""), "h": ("h", "intermediate", ""), "output": ("output", "output", "")}
    metadata |= parameter_metadata(parameters_of(model))
    graph = build_graph(edges, metadata)
    assert graph.edges == (
        GraphEdge("h", "h", "iteration"),
        GraphEdge("h", "output", "forward"),
        GraphEdge("input", "h", "forward"),
        GraphEdge("model.cell", "h", "forward"),
        GraphEdge("model.head", "output", "forward"),
    )


def test_self_attention_separates_the_chunks_of_one_linear() -> None:
    model = nn.ModuleDict({"qkv": nn.Linear(8, 24)})
    x = torch.randn(2, 5, 8, requires_grad=True)
    q, k, v = model["qkv"](x).chunk(3, dim=-1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(8)
    attn = scores.softmax(dim=-1)
    out = attn @ v
    tensors = [("input", 0, x), ("q", 0, q), ("k", 0, k), ("v", 0, v), ("scores", 0, scores), ("attn", 0, attn),
               ("out", 0, out)]

    edges = discover_edges(tensors, parameters_of(model))

    assert edges == [
        edge("attn", "out"),
        edge("input", "k"),
        edge("input", "q"),
        edge("input", "v"),
        edge("k", "scores"),
        edge("model.qkv.bias", "k"),
        edge("model.qkv.bias", "q"),
        edge("model.qkv.bias", "v"),
        edge("model.qkv.weight", "k"),
        edge("model.qkv.weight", "q"),
        edge("model.qkv.weight", "v"),
        edge("q", "scores"),
        edge("scores", "attn"),
        edge("v", "out"),
    ]


def test_views_are_tensors_of_their_own_and_repeated_registrations_chain() -> None:
    fc = nn.Linear(3, 4)
    x = torch.randn(2, 3)
    h = fc(x)
    flat = h.view(-1)
    same = flat.contiguous()  # returns its input: the very same tensor under a second name
    assert same is flat
    transposed = h.transpose(0, 1)
    tensors = [("h", 0, h), ("h_flat", 0, flat), ("h_same", 0, same), ("from_same", 0, same * 2),
               ("h_t", 0, transposed), ("from_t", 0, transposed.exp()), ("from_h", 0, h**2),
               ("state_in", 1, h), ("next", 1, h + 1)]

    edges = discover_edges(tensors, {"fc.weight": fc.weight, "fc.bias": fc.bias})

    assert edges == [
        edge("fc.bias", "h"),
        edge("fc.weight", "h"),
        edge("h", "from_h"),
        edge("h", "h_flat"),
        edge("h", "h_t"),
        edge("h", "state_in", 0, 1),
        edge("h_flat", "h_same"),
        edge("h_same", "from_same"),
        edge("h_t", "from_t"),
        edge("state_in", "next", 1),
    ]


def test_parameter_reached_through_unregistered_ops_still_gives_an_edge() -> None:
    model = nn.Module()
    model.w = nn.Parameter(torch.randn(2, 3))
    x = torch.randn(4, 3)
    y = F.linear(x, model.w * 2)
    assert discover_edges([("input", 0, x), ("y", 0, y)], parameters_of(model)) == [
        edge("input", "y"), edge("model.w", "y")
    ]


def test_integer_indices_and_masks_are_found_and_detached_tensors_need_manual_connections() -> None:
    model = nn.ModuleDict({"emb": nn.Embedding(10, 4), "fc": nn.Linear(4, 4)})
    tokens = torch.randint(0, 10, (2, 5))
    embedded = model["emb"](tokens)
    detached = embedded.detach()
    with torch.no_grad():
        mask = (tokens > 2).float()
    out = model["fc"](detached) * mask.unsqueeze(-1)
    tensors = [("tokens", 0, tokens), ("embedded", 0, embedded), ("mask", 0, mask), ("out", 0, out)]

    edges = discover_edges(tensors, parameters_of(model))
    assert edges == [
        edge("mask", "out"), edge("model.emb.weight", "embedded"), edge("model.fc.bias", "out"),
        edge("model.fc.weight", "out"), edge("tokens", "embedded"),
    ]

    manual = [("tokens", "embedded", 0, 0), edge("embedded", "out"), ("mask", "out", 0, 0)]
    merged = merge_manual_edges(edges, manual)
    assert merged == [
        edge("embedded", "out"),
        edge("mask", "out"),
        edge("model.emb.weight", "embedded"),
        edge("model.fc.bias", "out"),
        edge("model.fc.weight", "out"),
        edge("tokens", "embedded"),
    ]
    metadata = {"tokens": ("tokens", "input", ""), "embedded": ("embedded", "intermediate", "model.emb"),
                "mask": ("mask", "input", ""), "out": ("out", "output", ""),
                "model.emb.weight": ("model.emb", "parameter", "model.emb"),
                "model.fc.weight": ("model.fc", "parameter", "model.fc"),
                "model.fc.bias": ("model.fc", "parameter", "model.fc")}
    graph = build_graph(edges, metadata, manual_edges=merge_manual_edges([], manual))
    assert graph.edges == (
        GraphEdge("embedded", "out", "manual"),
        GraphEdge("mask", "out", "forward"),
        GraphEdge("model.emb", "embedded", "forward"),
        GraphEdge("model.fc", "out", "forward"),
        GraphEdge("tokens", "embedded", "forward"),
    )


@pytest.mark.parametrize(
    "bad",
    [("a", "b", 1, 0), ("a", "a", 0, 0), ("", "b", 0, 0), ("a", "b", -1, 0), ("a", "b"), ("a", "b", 0.5, 1)],
)
def test_bad_manual_connections_are_rejected(bad: tuple) -> None:
    with pytest.raises(GraphError):
        merge_manual_edges([], [bad])


def test_deep_chain_of_200_registered_tensors() -> None:
    layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(200))
    x = torch.randn(2, 4, requires_grad=True)
    tensors = [("input", 0, x)]
    h = x
    for i, layer in enumerate(layers):
        h = torch.tanh(layer(h))
        tensors.append((f"layer{i:03d}", 0, h))

    edges = discover_edges(tensors, parameters_of(layers, "layers"))

    assert len(edges) == 200 + 2 * 200
    assert edge("input", "layer000") in edges and edge("layer198", "layer199") in edges
    assert edge("layers.199.weight", "layer199") in edges and edge("layer000", "layer002") not in edges


def test_many_unregistered_paths_and_a_deep_unregistered_chain_are_linear_time() -> None:
    x = torch.randn(3, requires_grad=True)
    h = x
    for _ in range(60):  # every step doubles the number of paths: 2**60 without memoisation
        h = h * torch.sigmoid(h)
    wide = h
    for _ in range(3000):  # deeper than Python's recursion limit
        h = h + 1.0
    edges = discover_edges([("input", 0, x), ("wide", 0, wide), ("deep", 0, h)], {})
    assert edges == [edge("input", "wide"), edge("wide", "deep")]


class CompiledMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 3)
        self.norm = nn.BatchNorm1d(8)
        self.drop = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        hidden = self.fc1(x)
        activation = self.drop(torch.relu(self.norm(hidden)))
        return self.fc2(activation), hidden, activation


def compiled_step(net: nn.Module, register, x: torch.Tensor) -> None:
    register("input", x)
    output, hidden, activation = net(x)
    register("hidden", hidden)
    register("activation", activation)
    register("output", output)


COMPILED_EAGER_EDGES = [
    edge("activation", "output"),
    edge("hidden", "activation"),
    edge("input", "hidden"),
    edge("model.fc1.bias", "hidden"),
    edge("model.fc1.weight", "hidden"),
    edge("model.fc2.bias", "output"),
    edge("model.fc2.weight", "output"),
    edge("model.norm.bias", "activation"),
    edge("model.norm.weight", "activation"),
]


def test_compiled_model_hides_inner_edges_and_eager_discovery_recovers_them() -> None:
    model = CompiledMLP()
    compiled = torch.compile(model, backend="aot_eager")
    assert unwrap_compiled(compiled) is model
    x = torch.randn(6, 4, requires_grad=True)

    registered: list[tuple[str, int, torch.Tensor]] = []
    compiled_step(compiled, lambda name, tensor, iteration=0: registered.append((name, iteration, tensor)), x)
    assert find_compiled_tensors(registered) == ["hidden", "activation", "output"]
    opaque = discover_edges(registered, parameters_of(model))
    assert edge("hidden", "activation") not in opaque and edge("model.fc2.weight", "hidden") in opaque

    eager_registered: list[tuple[str, int, torch.Tensor]] = []
    compiled_step(model, lambda name, tensor, iteration=0: eager_registered.append((name, iteration, tensor)), x)
    assert discover_edges(eager_registered, parameters_of(model)) == COMPILED_EAGER_EDGES

    rng_before = torch.get_rng_state()
    buffers_before = [b.clone() for b in model.buffers()]
    edges = discover_module_structure(compiled, [x.detach()], compiled_step, inputs_require_grad=True)
    assert edges == COMPILED_EAGER_EDGES
    assert torch.equal(torch.get_rng_state(), rng_before)
    assert all(torch.equal(a, b) for a, b in zip(model.buffers(), buffers_before))


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("COMGRA_RUN_SLOW") != "1", reason="inductor compiles for ~15 s; COMGRA_RUN_SLOW=1")
def test_inductor_compiled_model_gives_the_eager_edges() -> None:
    model = CompiledMLP()
    compiled = torch.compile(model)
    x = torch.randn(6, 4)
    registered: list[tuple[str, int, torch.Tensor]] = []
    compiled_step(compiled, lambda name, tensor, iteration=0: registered.append((name, iteration, tensor)), x)
    assert find_compiled_tensors(registered) == ["hidden", "activation", "output"]
    edges = discover_module_structure(compiled, [x], compiled_step, inputs_require_grad=True)
    assert edges == COMPILED_EAGER_EDGES


def test_graph_cache_discovers_an_unchanged_structure_once() -> None:
    model = MLP()
    cache = GraphCache()
    walks = []

    def counted_discover(tensors, parameters):
        walks.append(len(tensors))
        return discover_edges(tensors, parameters)

    metadata = {"input": ("input", "input", ""), "hidden": ("hidden", "intermediate", ""),
                "output": ("output", "output", "")}
    metadata |= parameter_metadata(parameters_of(model))
    results = []
    for batch in (5, 5, 7):
        x = torch.randn(batch, 4, requires_grad=True)
        output, hidden, _ = model(x)
        tensors = [("input", 0, x), ("hidden", 0, hidden), ("output", 0, output)]
        parameters = parameters_of(model)
        signature = structure_signature(tensors, parameters)
        results.append(cache.get_or_build(
            signature, "train", lambda: build_graph(counted_discover(tensors, parameters), metadata)
        ))

    assert walks == [3]
    assert [r.built for r in results] == [True, False, False]
    assert [r.new_structure for r in results] == [True, False, False]
    assert len({r.structure_hash for r in results}) == 1
    assert (cache.hits, cache.misses, len(cache)) == (2, 1, 1)

    other_type = cache.get_or_build(
        signature, "eval", lambda: build_graph(counted_discover(tensors, parameters), metadata)
    )
    assert walks == [3, 3] and other_type.built and not other_type.new_structure


def test_structure_signature_tells_structures_apart() -> None:
    x = torch.randn(2, 3, requires_grad=True)
    base = structure_signature([("a", 0, x * 2)], {})
    assert base == structure_signature([("a", 0, torch.randn(9, 3, requires_grad=True) * 3)], {})
    assert base != structure_signature([("a", 0, x + 2)], {})
    assert base != structure_signature([("a", 0, (x * 2).detach())], {})
    assert base != structure_signature([("a", 0, x * 2)], {"p": nn.Parameter(torch.ones(1))})
    assert base != structure_signature([("a", 0, (x * 2).unsqueeze(0))], {})
    assert structure_signature([("a", 0, x * 2)], {"p": nn.Parameter(torch.ones(1), requires_grad=False)}) != (
        structure_signature([("a", 0, x * 2)], {"p": nn.Parameter(torch.ones(1))})
    )


def test_a_tensor_changed_in_place_after_registration_keeps_its_identity() -> None:
    """``out += identity`` in a residual block: with the identity kept at registration, the skip edge goes
    into the tensor computed after the add, not into the branch's output."""
    branch, stem = nn.Linear(4, 4), nn.Linear(4, 4)
    x = torch.randn(3, 4)
    h = stem(x)
    out = branch(h)
    registered = [("h", 0, h, autograd_origin(h)), ("branch", 0, out, autograd_origin(out))]
    out += h
    after = torch.relu(out)
    registered.append(("after", 0, after, autograd_origin(after)))
    assert discover_edges(registered, {}) == [edge("branch", "after"), edge("h", "after"), edge("h", "branch")]
    # read from the tensors now (the old behaviour), the skip edge points into the branch's output
    assert edge("h", "branch") in discover_edges([entry[:3] for entry in registered], {})
    assert discover_edges([entry[:3] for entry in registered], {}) == [edge("branch", "after"), edge("h", "branch")]


def test_a_model_output_is_looked_through_by_what_was_computed_from_it_before_it_was_registered() -> None:
    """``h = tanh(l1(x)); return h, l2(h)``: ``h`` is registered as the model's output after ``l2``'s
    output, which was computed from it: ``l2`` depends on ``l1``, the output on ``l1`` and on nothing else."""
    l1, l2 = nn.Linear(4, 8), nn.Linear(8, 2)
    x = torch.randn(3, 4)
    a = l1(x)
    h = torch.tanh(a)
    b = l2(h)
    tensors = [("l1", 0, a), ("l2", 0, b), ("model[0]", 0, h), ("model[1]", 0, b)]
    assert discover_edges(tensors, {}, outputs={"model[0]", "model[1]"}) == [
        edge("l1", "l2"), edge("l1", "model[0]"), edge("l2", "model[1]")]
    assert edge("model[0]", "l2") in discover_edges(tensors, {})  # without: l1 -> model -> l2 -> model

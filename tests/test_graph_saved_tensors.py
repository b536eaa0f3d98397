"""Edges from registered tensors that do not require grad, found in what autograd saved for backward."""
from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from comgra_ndbg.graph import TensorEdge, discover_edges
from comgra_ndbg.graph import discovery


def edge(source: str, target: str, source_iteration: int = 0, target_iteration: int | None = None) -> TensorEdge:
    target_iteration = source_iteration if target_iteration is None else target_iteration
    return TensorEdge(source, target, source_iteration, target_iteration)


def parameters_of(module: nn.Module, name: str = "model") -> dict[str, torch.Tensor]:
    return {f"{name}.{parameter_name}": p for parameter_name, p in module.named_parameters()}


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture
def dir_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Type names of the autograd nodes discovery calls ``dir`` on (a module-level shadow of the builtin)."""
    calls: list[str] = []

    def counting_dir(node: object) -> list[str]:
        calls.append(type(node).__name__)
        return dir(node)

    monkeypatch.setattr(discovery, "dir", counting_dir, raising=False)
    return calls


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = torch.tanh(self.fc1(x))
        return self.fc2(hidden), hidden


PARAMETER_EDGES = [
    edge("model.fc1.bias", "hidden"),
    edge("model.fc1.weight", "hidden"),
    edge("model.fc2.bias", "output"),
    edge("model.fc2.weight", "output"),
]


def test_input_without_grad_feeds_hidden_before_backward_and_not_after(dir_calls: list[str]) -> None:
    model = MLP()
    x = torch.randn(5, 4)
    output, hidden = model(x)
    loss = output.pow(2).mean()
    tensors = [("input", 0, x), ("hidden", 0, hidden), ("output", 0, output), ("loss", 0, loss)]

    before = discover_edges(tensors, parameters_of(model))
    loss.backward()
    after = discover_edges(tensors, parameters_of(model))

    assert before == sorted(PARAMETER_EDGES + [
        edge("hidden", "output"), edge("input", "hidden"), edge("output", "loss")
    ])
    assert after == sorted(PARAMETER_EDGES + [edge("hidden", "output"), edge("output", "loss")])
    assert not x.requires_grad and x.grad_fn is None
    assert sorted(set(dir_calls)) == ["AddmmBackward0", "MeanBackward0", "PowBackward0", "TBackward0",
                                      "TanhBackward0"]
    assert len(dir_calls) == 2 * 5  # once per node type in each of the two discoveries


def test_integer_class_targets_feed_the_loss_through_nll_loss() -> None:
    model = MLP()
    x = torch.randn(5, 4)
    target = torch.randint(0, 3, (5,))
    output, hidden = model(x)
    loss = F.cross_entropy(output, target)
    assert type(loss.grad_fn).__name__ == "NllLossBackward0"  # cross_entropy = log_softmax + nll_loss
    assert loss.grad_fn._saved_target is target  # saved as is: unpacking gives back the same object

    edges = discover_edges([("input", 0, x), ("hidden", 0, hidden), ("output", 0, output), ("target", 0, target),
                            ("loss", 0, loss)], parameters_of(model))

    assert edges == sorted(PARAMETER_EDGES + [
        edge("hidden", "output"), edge("input", "hidden"), edge("output", "loss"), edge("target", "loss")
    ])


def test_float_regression_target_feeds_mse_loss() -> None:
    fc = nn.Linear(4, 2)
    x, target = torch.randn(6, 4), torch.randn(6, 2)
    prediction = fc(x)
    loss = F.mse_loss(prediction, target)
    edges = discover_edges([("input", 0, x), ("target", 0, target), ("prediction", 0, prediction),
                            ("loss", 0, loss)], parameters_of(fc, "fc"))
    assert edges == [
        edge("fc.bias", "prediction"),
        edge("fc.weight", "prediction"),
        edge("input", "prediction"),
        edge("prediction", "loss"),
        edge("target", "loss"),
    ]


def test_integer_token_ids_feed_the_embedding_and_index_tuples_match() -> None:
    model = nn.ModuleDict({"emb": nn.Embedding(10, 4)})
    tokens = torch.randint(0, 10, (2, 5))
    positions = torch.tensor([4, 0])
    embedded = model["emb"](tokens)
    last = embedded[torch.arange(2), positions]  # IndexBackward0._saved_indices is a tuple of two tensors
    edges = discover_edges([("tokens", 0, tokens), ("embedded", 0, embedded), ("positions", 0, positions),
                            ("last", 0, last)], parameters_of(model))
    assert edges == [
        edge("embedded", "last"),
        edge("model.emb.weight", "embedded"),
        edge("positions", "last"),
        edge("tokens", "embedded"),
    ]


def test_input_used_by_two_branches_feeds_both() -> None:
    model = nn.ModuleDict({"left": nn.Linear(4, 3), "right": nn.Linear(4, 3)})
    x = torch.randn(5, 4)
    left = torch.relu(model["left"](x))
    right = torch.sigmoid(model["right"](x))
    total = left + right
    edges = discover_edges([("input", 0, x), ("left", 0, left), ("right", 0, right), ("total", 0, total)],
                           parameters_of(model))
    assert edges == [
        edge("input", "left"),
        edge("input", "right"),
        edge("left", "total"),
        edge("model.left.bias", "left"),
        edge("model.left.weight", "left"),
        edge("model.right.bias", "right"),
        edge("model.right.weight", "right"),
        edge("right", "total"),
    ]


def test_views_of_the_input_made_inside_the_model_still_match() -> None:
    model = nn.ModuleDict({"flat": nn.Linear(12, 2), "seq": nn.Linear(4, 2)})
    images = torch.randn(5, 3, 4)
    flat = model["flat"](images.view(5, -1))  # AddmmBackward0 saves the (5, 12) view
    per_step = model["seq"](images)  # a 3-d input: the Linear saves a (15, 4) view of it
    saved = per_step.grad_fn.next_functions[0][0]._saved_mat1
    assert saved is not images and saved.shape == (15, 4)
    assert saved.untyped_storage().data_ptr() == images.untyped_storage().data_ptr()
    edges = discover_edges([("images", 0, images), ("flat", 0, flat), ("per_step", 0, per_step)],
                           parameters_of(model))
    assert edges == [
        edge("images", "flat"),
        edge("images", "per_step"),
        edge("model.flat.bias", "flat"),
        edge("model.flat.weight", "flat"),
        edge("model.seq.bias", "per_step"),
        edge("model.seq.weight", "per_step"),
    ]


def test_mask_made_under_no_grad_feeds_the_product() -> None:
    fc = nn.Linear(4, 4)
    x = torch.randn(2, 5, 4)
    hidden = fc(x)
    with torch.no_grad():
        mask = (x[..., 0] > 0).float()
    masked = hidden * mask.unsqueeze(-1)  # MulBackward0._saved_other is a view of the mask
    edges = discover_edges([("input", 0, x), ("hidden", 0, hidden), ("mask", 0, mask), ("masked", 0, masked)],
                           parameters_of(fc, "fc"))
    assert edges == [
        edge("fc.bias", "hidden"),
        edge("fc.weight", "hidden"),
        edge("hidden", "masked"),
        edge("input", "hidden"),
        edge("mask", "masked"),
    ]


def test_equal_values_in_another_storage_do_not_match() -> None:
    fc = nn.Linear(3, 2)
    used = torch.randn(4, 3)
    twin = used.clone()
    out = fc(used)
    edges = discover_edges([("twin", 0, twin), ("used", 0, used), ("out", 0, out)], parameters_of(fc, "fc"))
    assert torch.equal(twin, used)
    assert edges == [edge("fc.bias", "out"), edge("fc.weight", "out"), edge("used", "out")]


def test_registered_slices_of_one_sequence_feed_their_own_iteration() -> None:
    cell = nn.RNNCell(3, 4)
    sequence = torch.randn(3, 2, 3)
    h = torch.zeros(2, 4)
    tensors = [("sequence", 0, sequence)]
    for i in range(3):
        tensors.append(("input", i, sequence[i]))
        h = cell(sequence[i], h)
        tensors.append(("h", i, h))
    edges = discover_edges(tensors, {})
    assert edges == [
        edge("h", "h", 0, 1),
        edge("h", "h", 1, 2),
        edge("input", "h", 0),
        edge("input", "h", 1),
        edge("input", "h", 2),
    ]


def test_detached_copy_feeds_its_consumer_but_not_the_tensor_it_came_from() -> None:
    model = nn.ModuleDict({"fc1": nn.Linear(4, 4), "fc2": nn.Linear(4, 2)})
    x = torch.randn(3, 4, requires_grad=True)
    hidden = torch.tanh(model["fc1"](x))  # TanhBackward0._saved_result shares the detached copy's storage
    frozen_hidden = hidden.detach()
    out = model["fc2"](frozen_hidden)
    edges = discover_edges([("input", 0, x), ("hidden", 0, hidden), ("frozen_hidden", 0, frozen_hidden),
                            ("out", 0, out)], parameters_of(model))
    assert edges == [
        edge("frozen_hidden", "out"),
        edge("input", "hidden"),
        edge("model.fc1.bias", "hidden"),
        edge("model.fc1.weight", "hidden"),
        edge("model.fc2.bias", "out"),
        edge("model.fc2.weight", "out"),
    ]


def test_frozen_weight_saved_by_its_linear_gets_an_edge() -> None:
    model = MLP()
    model.fc2.requires_grad_(False)
    x = torch.randn(5, 4)
    output, hidden = model(x)
    edges = discover_edges([("input", 0, x), ("hidden", 0, hidden), ("output", 0, output)], parameters_of(model))
    # AddmmBackward0 saves weight.t() to pass the gradient to hidden; a bias is never saved.
    assert edges == [
        edge("hidden", "output"),
        edge("input", "hidden"),
        edge("model.fc1.bias", "hidden"),
        edge("model.fc1.weight", "hidden"),
        edge("model.fc2.weight", "output"),
    ]


class Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, h: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(h, scale)
        return h * scale

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        _h, scale = ctx.saved_tensors
        return grad * scale, None


def test_custom_function_saved_tensors_match() -> None:
    fc = nn.Linear(4, 4)
    x = torch.randn(3, 4, requires_grad=True)
    hidden = fc(x)
    scale = torch.rand(4)
    scaled = Scale.apply(hidden, scale)
    edges = discover_edges([("input", 0, x), ("hidden", 0, hidden), ("scale", 0, scale), ("scaled", 0, scaled)],
                           parameters_of(fc, "fc"))
    assert edges == [
        edge("fc.bias", "hidden"),
        edge("fc.weight", "hidden"),
        edge("hidden", "scaled"),
        edge("input", "hidden"),
        edge("scale", "scaled"),
    ]


def test_checkpointed_region_is_not_recomputed_and_its_hooked_saves_are_skipped() -> None:
    model = nn.ModuleDict({"fc": nn.Linear(4, 4), "block": nn.Linear(4, 4)})
    calls: list[int] = []

    def region(h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return model["block"](h) * mask

    x = torch.randn(3, 4)
    with torch.no_grad():
        mask = (torch.randn(3, 4) > 0).float()
    hidden = model["fc"](x)
    out = checkpoint(region, hidden, mask, use_reentrant=False)
    edges = discover_edges([("input", 0, x), ("mask", 0, mask), ("hidden", 0, hidden), ("out", 0, out)],
                           parameters_of(model))
    assert calls == [1]  # unpacking a checkpointed save would have run the region again
    assert edges == [
        edge("hidden", "out"),
        edge("input", "hidden"),
        edge("model.block.bias", "out"),
        edge("model.block.weight", "out"),
        edge("model.fc.bias", "hidden"),
        edge("model.fc.weight", "hidden"),
    ]
    out.sum().backward()
    assert calls == [1, 1] and model["block"].weight.grad is not None


def test_discovery_in_the_first_gradient_hook_still_sees_every_saved_tensor() -> None:
    model = MLP()
    x = torch.randn(5, 4)
    target = torch.randint(0, 3, (5,))
    output, hidden = model(x)
    loss = F.cross_entropy(output, target)
    tensors = [("input", 0, x), ("hidden", 0, hidden), ("output", 0, output), ("target", 0, target),
               ("loss", 0, loss)]
    found: list[list[TensorEdge]] = []

    def on_grad(grad: torch.Tensor) -> None:
        if not found:
            found.append(discover_edges(tensors, parameters_of(model)))

    for _name, _iteration, tensor in tensors:
        if tensor.requires_grad:
            tensor.register_hook(on_grad)
    loss.backward()

    assert found == [sorted(PARAMETER_EDGES + [
        edge("hidden", "output"), edge("input", "hidden"), edge("output", "loss"), edge("target", "loss")
    ])]


def test_without_grad_less_tensors_nothing_saved_is_read(dir_calls: list[str]) -> None:
    model = MLP()
    x = torch.randn(5, 4, requires_grad=True)
    output, hidden = model(x)
    edges = discover_edges([("input", 0, x), ("hidden", 0, hidden), ("output", 0, output)], parameters_of(model))
    assert edges == sorted(PARAMETER_EDGES + [edge("hidden", "output"), edge("input", "hidden")])
    assert dir_calls == []


def test_deep_chain_with_one_input_reads_each_node_once(dir_calls: list[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(200))
    x = torch.randn(2, 4)
    tensors = [("input", 0, x)]
    h = x
    for i, layer in enumerate(layers):
        h = torch.tanh(layer(h))
        tensors.append((f"layer{i:03d}", 0, h))
    visited: list[str] = []
    saved_sources = discovery._Walker._saved_sources

    def counted(walker: discovery._Walker, node: object) -> set[int]:
        visited.append(type(node).__name__)
        return saved_sources(walker, node)

    monkeypatch.setattr(discovery._Walker, "_saved_sources", counted)

    started = time.perf_counter()
    edges = discover_edges(tensors, parameters_of(layers, "layers"))
    elapsed = time.perf_counter() - started

    assert len(edges) == 200 + 2 * 200
    assert edge("input", "layer000") in edges and edge("input", "layer001") not in edges
    assert edge("layer198", "layer199") in edges
    assert sorted(visited) == sorted(["TanhBackward0", "AddmmBackward0", "TBackward0"] * 200)
    assert sorted(dir_calls) == ["AddmmBackward0", "TBackward0", "TanhBackward0"]
    assert elapsed < 2.0

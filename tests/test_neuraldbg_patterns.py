"""NeuralDbg on the patterns real models and loops use, each recorded right: residual adds in place, a module
called twice, a frozen backbone, a GAN with two optimizers, autocast with clipping and a GradScaler,
activation checkpointing, and an output the model also computes with."""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from comgra_ndbg import NeuralDbg, RecorderWarning, analyze, open_recording
from comgra_ndbg.graph import GraphEdge
from zoo.checks import assert_acyclic, edge_lines
from zoo.models import GRUCellLoop, CheckpointedMLP, Discriminator, FineTune, Generator, HiddenAndLogits, ResNet


def recorder_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, RecorderWarning)]


def images(steps: int, batch: int = 4, size: int = 16, classes: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(batch, 3, size, size, generator=g), torch.randint(0, classes, (batch,), generator=g))
            for _ in range(steps)]


def graph_of(folder: Path, trial: str = "t"):
    with open_recording(folder, trial) as rec:
        return rec.graph("train").graph


def test_residual_adds_in_place_link_the_skip_into_the_tensor_after_the_add(tmp_path: Path) -> None:
    """``out += identity`` changes the registered ``bn2`` output in place; the skip must go into the ReLU
    after the add, not into ``bn2`` (``maxpool -> layer1.0.bn2`` was recorded, for every block)."""
    torch.manual_seed(0)
    model = ResNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    with NeuralDbg(model, tmp_path, trial="t"):
        for inputs, targets in images(2):
            optimizer.zero_grad()
            F.cross_entropy(model(inputs), targets).backward()
            optimizer.step()
    edges = edge_lines(graph_of(tmp_path))
    for line in ["model.maxpool -> model.layer1.0.relu#1", "model.layer1.0.bn2 -> model.layer1.0.relu#1",
                 "model.layer2.0.downsample.1 -> model.layer2.0.relu#1", "model.layer2.0.bn2 -> model.layer2.0.relu#1"]:
        assert line in edges
    into_bn2 = [line for line in edges if line.endswith(".bn2")]
    assert into_bn2 == sorted(f"model.{layer}.0.{source} -> model.{layer}.0.bn2" for layer in ("layer1", "layer2")
                              for source in ("conv2", "bn2.parameters"))


def test_a_module_called_twice_is_two_nodes_of_one_module_with_no_cycle(tmp_path: Path) -> None:
    """``self.relu`` of a BasicBlock runs after ``bn1`` and after the add: one node for both calls made the
    cycle ``bn2 -> relu -> conv2 -> bn2``."""
    torch.manual_seed(0)
    model = ResNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    with NeuralDbg(model, tmp_path, trial="t"):
        for inputs, targets in images(2):
            optimizer.zero_grad()
            F.cross_entropy(model(inputs), targets).backward()
            optimizer.step()
    graph = graph_of(tmp_path)
    assert_acyclic(graph)
    relu, again = graph.node("model.layer1.0.relu"), graph.node("model.layer1.0.relu#1")
    assert relu.module == again.module == "model.layer1.0.relu"
    assert {GraphEdge("model.layer1.0.bn1", "model.layer1.0.relu", "forward"),
            GraphEdge("model.layer1.0.relu", "model.layer1.0.conv2", "forward"),
            GraphEdge("model.layer1.0.relu#1", "model.layer2.0.conv1", "forward")} <= set(graph.edges)
    with open_recording(tmp_path, "t") as rec:
        assert rec.kinds("model.layer1.0.relu#1") == ["value", "grad"]


def test_a_recurrent_cell_called_each_time_step_is_a_chain_of_calls(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = GRUCellLoop()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    with NeuralDbg(model, tmp_path, trial="t"):
        for _ in range(2):
            optimizer.zero_grad()
            F.mse_loss(model(torch.randn(4, 3, 4)), torch.randn(4, 1)).backward()
            optimizer.step()
    edges = edge_lines(graph_of(tmp_path))
    assert {"model.cell -> model.cell#1", "model.cell#1 -> model.cell#2", "model.cell#2 -> model.head",
            "model.cell.parameters -> model.cell#2", "input -> model.cell#2"} <= set(edges)


def run_finetune(folder: Path | None, steps: int = 3) -> tuple[FineTune, list[float]]:
    torch.manual_seed(0)
    model = FineTune()
    model.backbone.requires_grad_(False)
    optimizer = torch.optim.Adam(model.head.parameters(), lr=1e-2)
    dbg = NeuralDbg(model, folder, trial="t") if folder is not None else None
    losses = []
    for inputs, targets in images(steps, size=8, classes=3):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    if dbg is not None:
        dbg.close()
    return model, losses


def test_a_frozen_backbone_keeps_its_edges_and_records_no_updates_for_it(tmp_path: Path) -> None:
    """Autograd never reaches a frozen part: its input, modules and parameters were orphans, and its
    parameters got an all-zero update series."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, losses = run_finetune(tmp_path)
    assert recorder_warnings(caught) == []
    bare, bare_losses = run_finetune(None)
    assert losses == bare_losses
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), bare.state_dict().values()))
    assert all(not p.requires_grad for p in model.backbone.parameters())  # put back after the structure pass
    edges = edge_lines(graph_of(tmp_path))
    assert {"input -> model.backbone.0", "model.backbone.0 -> model.backbone.1", "model.backbone.3 -> model.backbone.4",
            "model.backbone.0.parameters -> model.backbone.0", "model.backbone.1.parameters -> model.backbone.1",
            "model.backbone.6 -> model.head.0"} <= set(edges)
    with open_recording(tmp_path, "t") as rec:
        assert rec.kinds("model.backbone.0.weight") == ["value"]  # neither gradient nor all-zero update
        assert rec.kinds("model.head.0.weight") == ["value", "grad", "update"]
        assert rec.kinds("model.backbone.1") == ["value"]


def test_a_backbone_frozen_after_a_backward_pass_records_no_gradient_for_it(tmp_path: Path) -> None:
    """Parameters frozen after a backward pass keep its ``.grad``; ``zero_grad(set_to_none=False)`` zeroes it in
    place at every step, and the optimizer still holds them. No backward pass writes that ``.grad``: it is no
    gradient of any step (recorded as an all-zero gradient, it made a healthy fine-tune "unused parameters",
    confidence 0.98), neither on the steps recorded in full nor on the sentinel steps of the defaults."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 2))
    g = torch.Generator().manual_seed(1)
    inputs = torch.randn(256, 8, generator=g)
    targets = (inputs[:, :2] * 2).tanh()
    F.mse_loss(model(inputs[:32]), targets[:32]).backward()  # the pre-training's last pass
    model[:3].requires_grad_(False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    with NeuralDbg(model, tmp_path, trial="t", optimizer=optimizer):
        for step in range(300):
            batch = slice(step * 32 % 256, step * 32 % 256 + 32)
            loss = F.mse_loss(model(inputs[batch]), targets[batch])
            optimizer.zero_grad(set_to_none=False)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    assert losses[-1] < losses[0] / 2  # the head trains
    with open_recording(tmp_path, "t") as rec:
        for name in ("model.0.weight", "model.0.bias", "model.2.weight", "model.2.bias"):
            assert "grad" not in rec.kinds(name), name
        steps, norms = rec.summary("model.4.parameters", "grad", "l2", tensor="model.4.weight")
        assert len(steps) > 250 and (norms > 0).all()  # the trained layer's gradient at the full and sentinel steps
    assert analyze(tmp_path, trial="t").hypotheses == ()


class _TwoHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(16, 32), nn.ReLU())
        self.cls, self.reg = nn.Linear(32, 4), nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.trunk(x)
        return self.cls(h), self.reg(h)


def test_an_auxiliary_loss_with_its_own_backward_call_reaches_its_head(tmp_path: Path) -> None:
    """``main.backward(retain_graph=True)`` on the first output, then ``aux.backward()`` on the second: the
    second head gets its gradient from the second call only. It is no unused parameter (it was, at 0.90: the
    step's gradients were fingerprinted after the first call alone)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    model, teacher = _TwoHeads(), torch.randn(16, 4, generator=g)
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    with NeuralDbg(model, tmp_path, trial="t", optimizer=optimizer):
        for _ in range(60):
            x = torch.randn(32, 16, generator=g)
            optimizer.zero_grad()
            logits, value = model(x)
            F.cross_entropy(logits, (x @ teacher).argmax(1)).backward(retain_graph=True)
            (0.1 * value.pow(2).mean()).backward()
            optimizer.step()
    assert analyze(tmp_path, trial="t").hypotheses == ()
    with open_recording(tmp_path, "t") as rec:
        steps, norms = rec.summary("model.reg.parameters", "grad", "l2", tensor="model.reg.weight")
        assert len(steps) == 60 and (norms > 0).all()


def train_gan(folder: Path | None, exact: bool, steps: int = 4) -> dict:
    """The DCGAN tutorial's loop: the discriminator's update, then the generator's through D(fake)."""
    torch.manual_seed(0)
    G, D = Generator(), Discriminator()
    optG, optD = torch.optim.Adam(G.parameters(), lr=1e-3), torch.optim.Adam(D.parameters(), lr=1e-3)
    used = []  # D's gradient at each optD.step(), as the optimizer sees it
    optD.register_step_pre_hook(lambda opt, args, kwargs: used.append(D.net[0].weight.grad.clone()))
    dbgs = []
    if folder is not None:
        dbgs = [NeuralDbg(G, folder, trial="G", optimizer=optG if exact else None),
                NeuralDbg(D, folder, trial="D", optimizer=optD if exact else None)]
    d_losses, g_losses = [], []
    for _ in range(steps):
        real = torch.randn(8, 2) + 3
        D.zero_grad()
        err_real = F.binary_cross_entropy_with_logits(D(real), torch.ones(8, 1))
        err_real.backward()
        fake = G(torch.randn(8, 4))
        err_fake = F.binary_cross_entropy_with_logits(D(fake.detach()), torch.zeros(8, 1))
        err_fake.backward()
        optD.step()
        G.zero_grad()
        err_g = F.binary_cross_entropy_with_logits(D(fake), torch.ones(8, 1))
        err_g.backward()
        optG.step()
        d_losses.append((err_real.item() + err_fake.item()) / 2)
        g_losses.append(err_g.item())
    for dbg in dbgs:
        dbg.close()
    return {"used": used, "d": d_losses, "g": g_losses, "state": [p.detach().clone() for p in [*G.parameters(),
                                                                                             *D.parameters()]]}


@pytest.mark.parametrize("exact", [False, True], ids=["steps found", "optimizer given"])
def test_a_gan_records_one_step_per_optimizer_step_of_each_model(tmp_path: Path, exact: bool) -> None:
    """D(fake) in the generator's update is a training pass of D: it opened an extra step of D (8 steps
    for 4 optD.step() calls), also with optimizer= given."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = train_gan(tmp_path, exact)
    assert recorder_warnings(caught) == []
    bare = train_gan(None, exact)
    assert all(torch.equal(a, b) for a, b in zip(run["state"], bare["state"])) and run["d"] == bare["d"]
    with open_recording(tmp_path, "D") as rec:
        assert rec.steps.tolist() == [0, 1, 2, 3] and rec.step_iterations.tolist() == [2, 2, 2, 2]
        np.testing.assert_allclose(rec.kpi("loss")[1], run["d"], rtol=1e-6)  # D's own two losses, not errG
        np.testing.assert_allclose(rec.summary("model.net.0.weight", "grad", "l2")[1],
                                   [float(g.norm()) for g in run["used"]], rtol=1e-5)
    with open_recording(tmp_path, "G") as rec:
        assert rec.steps.tolist() == [0, 1, 2, 3]
        np.testing.assert_allclose(rec.kpi("loss")[1], run["g"], rtol=1e-6)


def train_amp(folder: Path | None, steps: int = 3, accumulate: int = 2) -> dict:
    """bfloat16 autocast, a GradScaler, gradient accumulation and clipping, as AMP loops are written."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)
    used = []
    optimizer.register_step_pre_hook(lambda opt, args, kwargs: used.append(model[0].weight.grad.clone()))
    dbg = NeuralDbg(model, folder, trial="t") if folder is not None else None
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        for _ in range(accumulate):
            x, y = torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y) / accumulate
            scaler.scale(loss).backward()
            losses.append(loss.item())
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.05)
        scaler.step(optimizer)
        scaler.update()
    if dbg is not None:
        dbg.close()
    return {"used": used, "losses": losses, "state": [p.detach().clone() for p in model.parameters()]}


def test_autocast_accumulation_and_clipping_record_the_input_edge_and_the_gradient_the_optimizer_used(
        tmp_path: Path) -> None:
    """Under autocast the input node had no edge (the first layer reads a cast copy), and the gradient was
    the one before clip_grad_norm_ (and before the GradScaler's unscaling)."""
    run, bare = train_amp(tmp_path), train_amp(None)
    assert run["losses"] == bare["losses"] and all(torch.equal(a, b) for a, b in zip(run["state"], bare["state"]))
    assert all(float(g.norm()) < 0.0501 for g in run["used"])  # clipped
    with open_recording(tmp_path, "t") as rec:
        assert rec.steps.tolist() == [0, 1, 2] and rec.step_iterations.tolist() == [2, 2, 2]
        np.testing.assert_allclose(rec.summary("model.0.weight", "grad", "l2")[1],
                                   [float(g.norm()) for g in run["used"]], rtol=1e-5)
        np.testing.assert_allclose(rec.kpi("loss")[1], np.reshape(run["losses"], (3, 2)).mean(axis=1), rtol=1e-6)
    edges = edge_lines(graph_of(tmp_path))
    assert "input -> model.0" in edges and "model -> loss" in edges


def train_checkpointed(folder: Path | None, reentrant: bool | None, steps: int = 3) -> list[float]:
    torch.manual_seed(0)
    model = CheckpointedMLP(reentrant)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    dbg = NeuralDbg(model, folder, trial=f"r{reentrant}") if folder is not None else None
    g = torch.Generator().manual_seed(2)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(torch.randn(8, 6, generator=g)), torch.randint(0, 3, (8,), generator=g))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    if dbg is not None:
        dbg.close()
    return losses


@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non-reentrant"])
def test_activation_checkpointing_records_what_the_plain_model_records(tmp_path: Path, reentrant: bool) -> None:
    """With use_reentrant=True the checkpointed outputs got no gradients and the blocks' nodes were orphans."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        losses = train_checkpointed(tmp_path, reentrant)
    assert recorder_warnings(caught) == []
    assert losses == train_checkpointed(None, reentrant)
    train_checkpointed(tmp_path, None)
    plain, checkpointed = graph_of(tmp_path, "rNone"), graph_of(tmp_path, f"r{reentrant}")
    assert checkpointed.edges == plain.edges
    with open_recording(tmp_path, "rNone") as reference, open_recording(tmp_path, f"r{reentrant}") as rec:
        assert [t.name for t in rec.tensors] == [t.name for t in reference.tensors]
        for tensor in reference.tensors:
            assert rec.kinds(tensor.name) == reference.kinds(tensor.name), tensor.name
            for kind in reference.kinds(tensor.name):
                np.testing.assert_allclose(rec.summary(tensor.name, kind, "l2")[1],
                                           reference.summary(tensor.name, kind, "l2")[1], rtol=1e-5, atol=1e-9,
                                           err_msg=f"{tensor.name} {kind}")


def test_an_output_the_model_also_computes_with_is_a_sink_of_the_graph(tmp_path: Path) -> None:
    """``h = tanh(l1(x)); return h, l2(h)``: the node ``model`` sat between l1 and l2 (a cycle), and
    ``l1 -> l2`` was missing."""
    torch.manual_seed(0)
    model = HiddenAndLogits()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with NeuralDbg(model, tmp_path, trial="t"):
        for _ in range(2):
            optimizer.zero_grad()
            hidden, logits = model(torch.randn(8, 6))
            (F.cross_entropy(logits, torch.randint(0, 3, (8,))) + 0.01 * hidden.pow(2).mean()).backward()
            optimizer.step()
    graph = graph_of(tmp_path)
    assert_acyclic(graph)
    assert edge_lines(graph) == sorted(["input -> model.l1", "model.l1 -> model.l2", "model.l1 -> model",
                                        "model.l2 -> model", "model -> loss", "model.l1.parameters -> model.l1",
                                        "model.l2.parameters -> model.l2"])

"""NeuralDbg without ``loss=``: the tensor ``backward()`` is called on is the loss node and the ``loss`` KPI."""
from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim import optimizer as optim_module

from comgra_ndbg import NeuralDbg, RecorderWarning, open_recording
from comgra_ndbg.graph import GraphEdge
from comgra_ndbg.instrument import patches


def make_mlp(seed: int = 0, dropout: float = 0.0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Dropout(dropout), nn.Linear(16, 3))


def batches(steps: int, batch: int = 8, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, 6, generator=g), torch.randint(0, 3, (batch,), generator=g)) for _ in range(steps)]


def recorder_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, RecorderWarning)]


def focal_loss(logits: torch.Tensor, targets: torch.Tensor, gamma: float = 2.0) -> torch.Tensor:
    """A custom loss function of the kind users write: no module, nothing to hook."""
    log_p = F.log_softmax(logits, dim=-1).gather(1, targets[:, None]).squeeze(1)
    return (-(1 - log_p.exp()) ** gamma * log_p).mean()


@pytest.mark.parametrize("criterion", [F.cross_entropy, focal_loss], ids=["functional", "custom"])
def test_the_tensor_backward_is_called_on_is_the_loss_node_and_kpi(tmp_path: Path, criterion) -> None:
    model = make_mlp()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with NeuralDbg(model, tmp_path, trial="t", summaries=2):
            for inputs, targets in batches(6):
                optimizer.zero_grad()
                loss = criterion(model(inputs), targets)
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
    assert recorder_warnings(caught) == []
    with open_recording(tmp_path, "t") as rec:
        steps, kpi = rec.kpi("loss")
        assert steps.tolist() == [0, 1, 2, 3, 4, 5]  # every step, also those the policy skips
        np.testing.assert_allclose(kpi, losses, rtol=1e-6)
        assert rec.roles["loss"] == "loss" and rec.kinds("loss") == ["value", "grad"]
        np.testing.assert_allclose(rec.summary("loss", "value", "mean")[1], losses[0::2], rtol=1e-6)
        edges = rec.graph("train").graph.edges
        assert GraphEdge("model", "loss", "forward") in edges
        assert [e for e in edges if e.target == "loss"] == [GraphEdge("model", "loss", "forward")]


def test_a_non_finite_loss_is_recorded_at_its_step(tmp_path: Path) -> None:
    model = make_mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = batches(6)
    data[3] = (torch.full((8, 6), float("nan")), data[3][1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with NeuralDbg(model, tmp_path, trial="t"):
            for inputs, targets in data:
                optimizer.zero_grad()
                F.cross_entropy(model(inputs), targets).backward()
                optimizer.step()
    with open_recording(tmp_path, "t") as rec:
        steps, kpi = rec.kpi("loss")
        assert steps.tolist() == [0, 1, 2, 3, 4, 5]
        assert np.isfinite(kpi[:3]).all() and math.isnan(kpi[3])  # the NaN is kept, at its step


def test_gradient_accumulation_gives_one_step_with_the_mean_of_its_losses(tmp_path: Path) -> None:
    model = make_mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = batches(12)
    scaled = []
    with NeuralDbg(model, tmp_path, trial="t"):
        for step in range(3):
            optimizer.zero_grad()
            for inputs, targets in data[4 * step:4 * step + 4]:
                loss = F.cross_entropy(model(inputs), targets) / 4
                loss.backward()
                scaled.append(loss.item())
            optimizer.step()
    with open_recording(tmp_path, "t") as rec:
        assert rec.steps.tolist() == [0, 1, 2]
        np.testing.assert_allclose(rec.kpi("loss")[1], np.reshape(scaled, (3, 4)).mean(axis=1), rtol=1e-6)
        for iteration in range(4):  # the loss of each micro-batch, in its own iteration
            steps, means = rec.summary("loss", "value", "mean", iteration=iteration)
            assert steps.tolist() == [0, 1, 2]
            np.testing.assert_allclose(means, scaled[iteration::4], rtol=1e-6)


def test_two_backward_calls_of_one_pass_are_two_loss_tensors(tmp_path: Path) -> None:
    model = make_mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    values = []
    with NeuralDbg(model, tmp_path, trial="t"):
        for inputs, targets in batches(3):
            optimizer.zero_grad()
            out = model(inputs)
            main, aux = F.cross_entropy(out, targets), out.pow(2).mean()
            main.backward(retain_graph=True)
            aux.backward()
            optimizer.step()
            values.append((main.item() + aux.item()) / 2)
    with open_recording(tmp_path, "t") as rec:
        assert [t.name for t in rec.tensors_of("loss")] == ["loss", "loss#1"]
        np.testing.assert_allclose(rec.kpi("loss")[1], values, rtol=1e-6)


def test_the_unscaled_loss_behind_a_grad_scaler(tmp_path: Path) -> None:
    model = make_mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    losses = []
    with NeuralDbg(model, tmp_path, trial="t"):
        for inputs, targets in batches(4):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(inputs), targets)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            losses.append(loss.item())
    with open_recording(tmp_path, "t") as rec:
        np.testing.assert_allclose(rec.kpi("loss")[1], losses, rtol=1e-6)
        assert GraphEdge("model", "loss", "forward") in rec.graph("train").graph.edges


def test_two_open_instances_take_only_the_losses_computed_from_their_own_model(tmp_path: Path) -> None:
    first, second = make_mlp(seed=0), make_mlp(seed=1)
    opt_first = torch.optim.SGD(first.parameters(), lr=0.1)
    opt_second = torch.optim.SGD(second.parameters(), lr=0.1)
    own_first, own_second, joint = [], [], []
    with NeuralDbg(first, tmp_path, trial="first"), NeuralDbg(second, tmp_path, trial="second"):
        for inputs, targets in batches(4):
            opt_first.zero_grad()
            opt_second.zero_grad()
            loss_first = F.cross_entropy(first(inputs), targets)
            loss_first.backward()
            loss_second = F.cross_entropy(second(inputs), targets)
            loss_second.backward(retain_graph=True)
            agreement = F.mse_loss(second(inputs), first(inputs).detach())  # depends on the second model only
            agreement.backward()
            opt_first.step()
            opt_second.step()
            own_first.append(loss_first.item())
            own_second.append(loss_second.item())
            joint.append(agreement.item())
    with open_recording(tmp_path, "first") as rec:
        np.testing.assert_allclose(rec.kpi("loss")[1], own_first, rtol=1e-6)
    with open_recording(tmp_path, "second") as rec:
        np.testing.assert_allclose(rec.kpi("loss")[1], (np.array(own_second) + joint) / 2, rtol=1e-6)
    assert not patches.installed()


def test_a_backward_call_unrelated_to_the_model_is_not_its_loss(tmp_path: Path) -> None:
    model = make_mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = torch.zeros(3, requires_grad=True)
    with NeuralDbg(model, tmp_path, trial="t"):
        for inputs, targets in batches(3):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(inputs), targets)
            (probe * 2).sum().backward()  # another computation's backward, inside the step
            loss.backward()
            optimizer.step()
    with open_recording(tmp_path, "t") as rec:
        assert [t.name for t in rec.tensors_of("loss")] == ["loss"]
        assert (rec.kpi("loss")[1] > 0.5).all()  # a cross-entropy of 3 classes, not the probe's 0


def run(recorded: bool, tmp_path: Path) -> tuple:
    model = make_mlp(dropout=0.3)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)
    torch.manual_seed(5)
    losses = []

    def loop() -> None:
        for inputs, targets in batches(12):
            optimizer.zero_grad()
            loss = focal_loss(model(inputs), targets)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            losses.append(loss.item())

    if recorded:
        with NeuralDbg(model, tmp_path, trial="t", snapshots=3):
            loop()
    else:
        loop()
    return losses, [p.detach().clone() for p in model.parameters()], optimizer.state_dict(), torch.get_rng_state()


def test_training_is_bit_identical_to_the_bare_loop(tmp_path: Path) -> None:
    (losses_a, params_a, state_a, rng_a), (losses_b, params_b, state_b, rng_b) = (run(False, tmp_path),
                                                                                  run(True, tmp_path))
    assert losses_a == losses_b
    assert all(torch.equal(a, b) for a, b in zip(params_a, params_b))
    assert torch.equal(rng_a, rng_b)
    for key, entry in state_a["state"].items():
        assert all(torch.equal(entry[k], state_b["state"][key][k]) for k in ("exp_avg", "exp_avg_sq"))


def test_patches_are_removed_when_the_last_instance_closes_also_after_an_exception(tmp_path: Path) -> None:
    backward, scale = torch.autograd.backward, torch.amp.GradScaler.scale
    first, second = make_mlp(seed=0), make_mlp(seed=1)
    with pytest.raises(RuntimeError, match="the loop failed"):
        with NeuralDbg(first, tmp_path, trial="a"):
            with NeuralDbg(second, tmp_path, trial="b"):
                assert torch.autograd.backward is not backward and patches.installed()
                F.cross_entropy(second(torch.randn(4, 6)), torch.zeros(4, dtype=torch.long)).backward()
            assert torch.autograd.backward is not backward  # the first instance is still open
            F.cross_entropy(first(torch.randn(4, 6)), torch.zeros(4, dtype=torch.long)).backward()
            raise RuntimeError("the loop failed")
    assert torch.autograd.backward is backward and torch.amp.GradScaler.scale is scale
    assert "scale" not in vars(torch.amp.GradScaler) or vars(torch.amp.GradScaler)["scale"] is scale
    assert not patches.installed()
    assert not optim_module._global_optimizer_pre_hooks and not optim_module._global_optimizer_post_hooks
    for model in (first, second):
        assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
        assert all(not p._post_accumulate_grad_hooks for p in model.parameters())
    for trial in ("a", "b"):
        with open_recording(tmp_path, trial) as rec:
            assert rec.steps.tolist() == [0] and len(rec.kpi("loss")[1]) == 1


def test_the_loss_of_a_compiled_model_is_linked_to_its_output(tmp_path: Path) -> None:
    model = make_mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    with NeuralDbg(model, tmp_path, trial="t"):
        net = torch.compile(model, backend="aot_eager")
        for inputs, targets in batches(3):
            optimizer.zero_grad()
            loss = focal_loss(net(inputs), targets)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    with open_recording(tmp_path, "t") as rec:
        np.testing.assert_allclose(rec.kpi("loss")[1], losses, rtol=1e-6)
        assert rec.kinds("loss") == ["value", "grad"]
        edges = rec.graph("train").graph.edges
        assert [e for e in edges if e.target == "loss"] == [GraphEdge("model", "loss", "forward")]
        assert GraphEdge("model.3", "model", "forward") in edges

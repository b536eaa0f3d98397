"""The per-step hot path: no hook per parameter, the parameters' gradients read once per backward pass, and
the gradient fingerprint that step detection and the loop invariants share."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from comgra_ndbg import NeuralDbg, open_recording
from comgra_ndbg.instrument.steps import gradient_fingerprint


def make_mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(steps)]


def parameter_hooks(model: nn.Module) -> int:
    return sum(len(p._post_accumulate_grad_hooks or {}) + len(p._backward_hooks or {}) for p in model.parameters())


def test_no_step_runs_a_parameter_hook_and_a_recorded_step_after_a_skipped_one_reads_every_gradient(
        tmp_path: Path) -> None:
    """NeuralDbg reads the parameters' gradients where each backward pass ends (the autograd engine's
    callback), so no parameter carries a hook of its own, in recorded steps or skipped ones."""
    model, criterion = make_mlp(), nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    hooks_in_step, first_weight_grads = [], []
    with NeuralDbg(model, tmp_path, trial="t", loss=criterion, optimizer=optimizer, summaries=2, snapshots=None):
        for inputs, targets in batches(6):
            optimizer.zero_grad()
            loss = criterion(model(inputs), targets)
            hooks_in_step.append(parameter_hooks(model))  # the step is open: its policy decision is made
            loss.backward()
            first_weight_grads.append(model[0].weight.grad.clone())
            optimizer.step()
    assert hooks_in_step == [0] * 6
    assert parameter_hooks(model) == 0
    with open_recording(tmp_path, "t") as rec:
        steps, abs_max = rec.summary("model.0.weight", "grad", "abs_max")
        assert steps.tolist() == [0, 2, 4]
        np.testing.assert_allclose(abs_max, [float(first_weight_grads[s].abs().max()) for s in (0, 2, 4)], rtol=1e-6)


@pytest.mark.parametrize("update", ["optimizer", "by hand"])
def test_gradients_of_a_loss_apart_from_the_model_output_are_read_when_its_backward_call_returns(
        tmp_path: Path, update: str) -> None:
    """A backward pass that never reaches the model's output (a penalty on the weights alone) ends without the
    engine callback NeuralDbg puts on that output: its gradients are read when the backward call returns,
    also in a loop that updates by hand and clears ``.grad`` before the step ends at the next pass."""
    model = make_mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    grads = []
    options = {"optimizer": optimizer} if update == "optimizer" else {}
    with NeuralDbg(model, tmp_path, trial="t", summaries=1, snapshots=None, **options):
        for inputs, _ in batches(5):
            optimizer.zero_grad()
            model(inputs)
            penalty = sum((p ** 2).sum() for p in model.parameters())
            penalty.backward()
            grads.append(float(model[2].bias.grad.norm()))
            if update == "optimizer":
                optimizer.step()
            else:
                with torch.no_grad():
                    for p in model.parameters():
                        p -= 0.1 * p.grad
                        p.grad = None
    with open_recording(tmp_path, "t") as rec:
        steps, norms = rec.summary("model.2.bias", "grad", "l2")
        assert steps.tolist() == [0, 1, 2, 3, 4]
        np.testing.assert_allclose(norms, grads, rtol=1e-6)


def test_a_gradient_replaced_by_a_new_tensor_each_step_is_read_each_step(tmp_path: Path) -> None:
    """``zero_grad()`` frees the gradients and the next backward pass makes new ones, often at the freed
    ones' addresses (so the same ``id``) and with the same version: a weak reference, not the ``id``, tells
    them apart, so no step keeps the gradient of the step before."""
    model, criterion = make_mlp(), nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    grads = []
    with NeuralDbg(model, tmp_path, trial="t", loss=criterion, optimizer=optimizer, summaries=1, snapshots=None):
        for inputs, targets in batches(8):
            loss = criterion(model(inputs), targets)  # the step starts with the last step's gradients in place
            optimizer.zero_grad()
            loss.backward()
            grads.append(model[0].weight.grad.clone())
            optimizer.step()
    with open_recording(tmp_path, "t") as rec:
        _, sums = rec.summary("model.0.weight", "grad", "mean")
        np.testing.assert_allclose(sums, [float(g.mean()) for g in grads], rtol=1e-5, atol=1e-9)


def test_gradient_fingerprint_tells_a_new_gradient_an_in_place_change_and_a_cleared_one_apart() -> None:
    a, b = nn.Parameter(torch.ones(3)), nn.Parameter(torch.ones(2))
    empty = gradient_fingerprint([a.grad, b.grad])
    assert empty[1] == (None, None)
    (a.sum() * 2).backward()
    first = gradient_fingerprint([a.grad, b.grad])
    assert first != empty and first[1][1] is None and first[0][1] == id(None)
    assert gradient_fingerprint([a.grad, b.grad]) == first  # nothing changed: equal
    (a.sum() + b.sum()).backward()  # accumulates into a.grad in place, creates b.grad
    second = gradient_fingerprint([a.grad, b.grad])
    assert second[0][0] == first[0][0] and second[1][0] != first[1][0]  # same tensor, new version
    assert second[1][1] is not None
    a.grad.zero_()
    assert gradient_fingerprint([a.grad, b.grad])[1][0] != second[1][0]  # zeroed in place: a new version
    a.grad = None
    assert gradient_fingerprint([a.grad, b.grad])[0][0] == id(None)

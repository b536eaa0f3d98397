"""``native.scalar``: a one-element host tensor's value read from its memory equals ``item()`` for every
floating dtype and view, anything else falls back to ``item()`` (and raises as it does), and the recorder's
KPIs and NeuralDbg's loss go through it."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from comgra_ndbg import NeuralDbg, Recorder, open_recording
from comgra_ndbg.recorder import native

pytestmark = pytest.mark.skipif(native.warm_up() is None, reason="the C++ part cannot be built here")

CASES = [torch.tensor(2.5), torch.tensor([1.25]), torch.tensor(0.1, dtype=torch.float64),
         torch.tensor(-1.5, dtype=torch.half), torch.tensor(1.5, dtype=torch.bfloat16), torch.arange(6.0)[4],
         torch.arange(6.0).reshape(2, 3)[1:, 2:], torch.tensor(2.0, requires_grad=True) * 3,
         torch.tensor(float("nan")), torch.tensor(float("-inf"), dtype=torch.float64), torch.tensor(7),
         torch.tensor(True), torch.tensor(1 + 2j), torch.tensor(3.0).expand(1)]


@pytest.mark.parametrize("tensor", CASES, ids=lambda t: f"{t.dtype}{list(t.shape)}")
def test_the_value_read_from_memory_is_the_value_item_gives(tensor: torch.Tensor) -> None:
    read, expected = native.scalar(tensor), tensor.item()
    assert type(read) is type(expected)
    assert read == expected or (read != read and expected != expected)  # NaN reads as NaN


def test_floating_host_tensors_are_read_by_the_cpp_part_and_others_are_left_to_item() -> None:
    module = native.warm_up()
    assert module.scalar(torch.tensor(0.5)) == 0.5 and module.scalar(torch.tensor([0.5], dtype=torch.half)) == 0.5
    for other in (torch.tensor(7), torch.tensor(1 + 2j), torch.tensor([1.0, 2.0]), torch.ones(0),
                  torch.empty(1, device="meta"), torch._neg_view(torch.tensor(2.0))):
        assert module.scalar(other) is None
    assert native.scalar(torch._neg_view(torch.tensor(2.0))) == -2.0  # the lazily negated view, through item()
    with pytest.raises(RuntimeError, match="cannot be converted to Scalar"):
        native.scalar(torch.tensor([1.0, 2.0]))


def test_without_the_cpp_part_it_is_item() -> None:
    loaded = native._MODULE[0]
    native._MODULE[0] = None
    try:
        assert native.scalar(torch.tensor(2.25)) == 2.25 and native.scalar(torch.tensor(4)) == 4
    finally:
        native._MODULE[0] = loaded


def test_a_step_s_kpis_and_neuraldbg_s_loss_are_read_through_it(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[float] = []
    real = native.scalar

    def counting(tensor: torch.Tensor) -> float:
        reads.append(real(tensor))
        return reads[-1]

    monkeypatch.setattr(native, "scalar", counting)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    with Recorder(tmp_path, "rec", summaries=1, snapshots=None) as rec:
        for step in range(3):
            rec.start_step(step)
            loss = model(torch.randn(5, 4)).square().mean()
            losses.append(loss.item())
            rec.record_kpi("loss", loss)
            rec.finish_step()
    assert reads == losses
    with open_recording(tmp_path, "rec") as recording:
        assert recording.kpi("loss")[1].tolist() == losses
    reads.clear()
    criterion = nn.MSELoss()
    with NeuralDbg(model, tmp_path, trial="nd", loss=criterion, optimizer=optimizer):
        for _ in range(3):
            optimizer.zero_grad()
            criterion(model(torch.randn(5, 4)), torch.randn(5, 3)).backward()
            optimizer.step()
    assert len(reads) >= 3  # every step's loss, read from memory

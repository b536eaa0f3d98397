"""Registration plans (``recorder/plan.py``): a name registered again along its plan records exactly what the
general path records, and any change of the call or of the tensor's kind takes the general path again."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from comgra_ndbg import Recorder, open_recording
from comgra_ndbg.errors import DuplicateTensorError, InvalidArgumentError
from comgra_ndbg.recorder.registration import TensorRegistration
from comgra_ndbg.stats.reducer import summarize
from comgra_ndbg.stats.statistics import derive

STATISTICS = ("mean", "std", "abs_max", "zero_fraction", "dead_fraction", "saturated_fraction")


def count_general_path(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names that went through the general path (``_record_tensor``), in order."""
    general = []
    original = TensorRegistration._record_tensor

    def counted(self, name, *args, **kwargs):
        general.append(name)
        return original(self, name, *args, **kwargs)

    monkeypatch.setattr(TensorRegistration, "_record_tensor", counted)
    return general


def expected(tensor: torch.Tensor, bounds: tuple[float, float] | None) -> dict[str, float]:
    row = summarize(tensor.detach(), batched=True, bounds=bounds)
    return {name: float(values[0]) for name, values in derive(row[None]).items() if name in STATISTICS}


def test_planned_registrations_record_what_the_general_path_records_and_changes_fall_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    general = count_general_path(monkeypatch)
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(6, 5, generator=g, requires_grad=True)
    # per step: batch size, the activation, whether the input requires grad
    plan = [(8, torch.tanh, True), (8, torch.tanh, True), (5, torch.tanh, True), (5, torch.sigmoid, True),
            (5, torch.sigmoid, False), (5, torch.sigmoid, False)]
    values, grads = [], []
    with Recorder(tmp_path, trial="t", snapshots=None) as rec:
        for step, (batch, activation, grad) in enumerate(plan):
            with rec.step(step):
                x = torch.randn(batch, 6, generator=g) * 3
                rec.register_tensor("x", x, role="input")
                h = activation(x @ (weight if grad else weight.detach()))
                rec.register_tensor("h", h)
                bounds = ((-1.0, 1.0) if activation is torch.tanh else (0.0, 1.0)) if grad else None  # from grad_fn
                values.append((h.detach().clone(), bounds))
                if grad:
                    h.retain_grad()
                    (h * torch.arange(5.0)).sum().backward()
                    grads.append(h.grad.clone())
                    rec.record_gradients()
    # general path: step 0 (no plan), 2 (batch size), 3 (autograd node type), 4 (no gradient); planned: 1, 5
    assert general == ["x", "h", "x", "h", "h", "h"]
    with open_recording(tmp_path, "t") as recording:
        for statistic in STATISTICS:
            steps, recorded = recording.summary("h", "value", statistic)
            assert steps.tolist() == list(range(6))
            np.testing.assert_allclose(recorded, [expected(v, b)[statistic] for v, b in values], rtol=1e-6,
                                       err_msg=statistic)  # saturation: NaN (unbounded) on the steps without grad
        steps, recorded = recording.summary("h", "grad", "abs_max")
        assert steps.tolist() == [0, 1, 2, 3]
        np.testing.assert_allclose(recorded, [float(grad.abs().max()) for grad in grads], rtol=1e-6)


def test_planned_names_still_refuse_a_duplicate_and_a_changed_role(tmp_path: Path) -> None:
    with Recorder(tmp_path, trial="t", snapshots=None) as rec:
        with rec.step(0):
            rec.register_tensor("h", torch.ones(4, 3))
        with rec.step(1):
            rec.register_tensor("h", torch.ones(4, 3))
            with pytest.raises(DuplicateTensorError, match="already registered"):
                rec.register_tensor("h", torch.ones(4, 3))
        with rec.step(2):
            with pytest.raises(InvalidArgumentError, match="first registered with role 'intermediate'"):
                rec.register_tensor("h", torch.ones(4, 3), role="output")

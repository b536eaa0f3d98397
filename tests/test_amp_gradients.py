"""Mixed precision with a ``GradScaler``: the recorded gradients are in one unit, the optimizer's. The module
outputs' gradients of ``scaler.scale(loss).backward()`` carry the loss scale (65 536 at first); the
parameters' are read after ``unscale_``, which changes ``.grad`` in place without moving its version counter.
They had been recorded the first scaled and the second unscaled (4.8 decades apart: a healthy AMP loop with
gradient clipping read as "vanishing from the architecture" at confidence 0.96) or, without ``unscale_``, the
second still scaled. Real bf16 autocast runs on the CPU with ``torch.amp.GradScaler("cpu")``."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from comgra_ndbg import NeuralDbg, open_recording
from comgra_ndbg.analysis.api import analyze

STEPS = 120


@pytest.mark.parametrize("clip", [True, False])
def test_scaled_gradients_are_recorded_in_the_optimizers_units(tmp_path: Path, clip: bool) -> None:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    centers = torch.randn(4, 8, generator=g)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    criterion = nn.CrossEntropyLoss()
    scaler = torch.amp.GradScaler("cpu")
    used = []  # the rms of model.2.weight's gradient as the optimizer took it
    with NeuralDbg(model, tmp_path, trial="t", loss=criterion, optimizer=optimizer, detail="full",
                   snapshots=None) as dbg:
        for _ in range(STEPS):
            y = torch.randint(0, 4, (32,), generator=g)
            x = centers[y] + 0.5 * torch.randn(32, 8, generator=g)
            optimizer.zero_grad()
            with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
                loss = criterion(model(x), y)
            scaler.scale(loss).backward()
            if clip:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            scaler.step(optimizer)
            used.append(model[2].weight.grad.double().pow(2).mean().sqrt().item())
            scaler.update()
    with open_recording(dbg.path) as recording:
        steps, loss_grad = recording.summary("loss", "grad", "mean")
        assert len(steps) == STEPS and np.allclose(loss_grad, 1.0)  # d loss / d loss, not the scale
        steps, recorded = recording.summary("model.2.parameters", "grad", "rms", tensor="model.2.weight")
        np.testing.assert_allclose(recorded, used, rtol=1e-5)
        _, output_grad = recording.summary("model.2", "grad", "rms")
        assert np.median(output_grad) < 1.0  # a cross-entropy's output gradient, not × 65 536
    assert analyze(tmp_path / "t", store=False).hypotheses == ()

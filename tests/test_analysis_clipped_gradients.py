"""Gradients clipped to a tiny norm at every step (``clip_grad_norm_(..., 1e-6)``, typed for 1.0) stall
training; the parameters' gradients then look vanishing, but they were larger and were rescaled after the
backward pass: the loop's doing, not the architecture's. A norm pinned at one value every step is the sign."""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from comgra_ndbg import NeuralDbg
from comgra_ndbg.analysis import analyze
from comgra_ndbg.analysis.loading import load_series
from comgra_ndbg.analysis.reading import pinned_gradient_norm
from comgra_ndbg.store.reader import open_recording


def _train(folder: Path, trial: str, max_norm: float | None, steps: int = 200) -> list[float]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    teacher = torch.randn(16, 4, generator=g)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    with NeuralDbg(model, folder, trial=trial, optimizer=optimizer):
        for _ in range(steps):
            x = torch.randn(64, 16, generator=g)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), (x @ teacher).argmax(1))
            loss.backward()
            if max_norm is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            optimizer.step()
            losses.append(loss.item())
    return losses


def _pinned(folder: Path) -> float | None:
    with open_recording(folder) as rec:
        return pinned_gradient_norm(load_series(rec))


def test_a_clip_norm_typed_a_million_times_too_small_is_the_loops_fault(tmp_path: Path) -> None:
    """Without the pinned norm this run reads as vanishing gradients in the architecture, from the first step."""
    losses = _train(tmp_path, "tiny", 1e-6)
    assert min(losses[-20:]) > 0.9 * losses[0]  # training stalled
    assert abs(_pinned(tmp_path / "tiny") / 1e-6 - 1) < 1e-3
    hypotheses = analyze(tmp_path / "tiny", store=False).hypotheses
    assert [(h.type, h.origin) for h in hypotheses] == [("update_stagnation", "loop")]
    assert "max_norm" in hypotheses[0].remedy and "1e-06" in hypotheses[0].remedy


def test_clipping_that_leaves_training_alone_raises_nothing(tmp_path: Path) -> None:
    for trial, max_norm in (("usual", 1.0), ("every_step", 0.05)):  # the second clips every step, and trains
        losses = _train(tmp_path, trial, max_norm)
        assert sum(losses[-20:]) / 20 < 0.5 * losses[0]
        assert analyze(tmp_path / trial, store=False).hypotheses == ()
    assert _pinned(tmp_path / "usual") is None and _pinned(tmp_path / "every_step") is not None

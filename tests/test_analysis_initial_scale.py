"""A signal that explodes in the untrained model's forward pass (step 0, before any update): the origin is the
initialisation, not the optimizer whose first update the huge gradient then wrecks."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from comgra_ndbg import NeuralDbg
from comgra_ndbg.analysis import analyze
from comgra_ndbg.analysis.activation_regime import INITIAL_RMS, activation_events
from comgra_ndbg.analysis.series import build_series
from comgra_ndbg.analysis.synthetic import summary_rows


def _series(hidden_rms: float, input_rms: float = 1.0, first_step: int = 0):
    rows = {("x", "value"): summary_rows(rms=np.full(40, input_rms), start=first_step),
            ("h", "value"): summary_rows(rms=np.full(40, hidden_rms), start=first_step)}
    return build_series(rows, roles={"x": "input", "h": "intermediate"}, kpis={})


def _initial(series) -> list[tuple[str, bool]]:
    return [(e.node, e.at_start) for e in activation_events(series) if e.to_state == "exploding"]


def test_an_activation_far_above_its_inputs_before_the_first_update_explodes_from_the_start() -> None:
    assert _initial(_series(30.0)) == [("h", True)]
    assert _initial(_series(INITIAL_RMS * 0.9)) == []  # under the absolute level
    assert _initial(_series(30.0, input_rms=5.0)) == []  # only 6x the inputs (raw-scale inputs, not the model)
    assert _initial(_series(30.0, first_step=1)) == []  # step 0 not recorded: the first update may have done it


def _rnn_run(folder: Path, trial: str, std: float) -> tuple:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)

    class Regressor(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = nn.RNN(4, 64, nonlinearity="relu", batch_first=True)
            self.head = nn.Linear(64, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.rnn(x)[0][:, -1]).squeeze(1)

    model = Regressor()
    with torch.no_grad():
        nn.init.normal_(model.rnn.weight_hh_l0, std=std)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    criterion = nn.MSELoss()
    with NeuralDbg(model, folder, trial=trial, loss=criterion, optimizer=optimizer, snapshots=None):
        for _ in range(40):
            x = torch.randn(32, 30, 4, generator=g)
            optimizer.zero_grad()
            criterion(model(x), x[:, -10:, 0].mean(1)).backward()
            optimizer.step()
    return analyze(folder / trial, store=False).hypotheses


def test_an_rnn_whose_recurrence_amplifies_at_initialisation_is_named_there(tmp_path: Path) -> None:
    """``weight_hh`` with std 0.2 for 64 units (a gain of about 1.6 per time step): the loss is non-finite
    from step 1, and the first update's size had been read as the optimizer's divergence (0.96)."""
    top = _rnn_run(tmp_path, "amplifies", 0.2)[0]
    assert (top.type, top.origin, top.node, top.onset) == ("exploding", "architecture", "model.rnn", 0)
    assert "before the first update" in top.sentence and "initialisation" in top.remedy
    assert not [h for h in _rnn_run(tmp_path, "healthy", 1 / 64) if h.type == "exploding"]

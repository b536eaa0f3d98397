"""Summary rows read when the step's record is built (``StepRows.finish``), as a device's rows are, equal the
rows read at once, failures included. On the host every result is there at once, so the tests make the
reducer hand nothing over ready and the collected results say they are still travelling."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from comgra_ndbg import Recorder, open_recording
from comgra_ndbg.recorder import step_rows
from comgra_ndbg.stats import collected, reducer
from comgra_ndbg.store import schema


def train(folder: Path, trial: str, *, wide: bool = False) -> None:
    """The explicit Recorder loop over a small MLP; ``wide`` registers a tensor of 10 000 elements too."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = Recorder(folder, trial, summaries=1, snapshots=2)
    rec.track_module("model", model)
    g = torch.Generator().manual_seed(1)
    for step in range(4):
        rec.start_step(step)
        x = torch.randn(5, 6, generator=g)
        rec.register_tensor("input", x, role="input")
        hidden = model[1](model[0](x))
        rec.register_tensor("hidden", hidden)
        rec.register_tensor("unreadable", torch.ones(3, device="meta"))  # refused: a problem logged alike
        if wide:
            rec.register_tensor("wide", torch.tanh(torch.randn(2, 5000, generator=g)))
        loss = model[2](hidden).square().mean()
        rec.register_tensor("loss", loss, role="loss")
        optimizer.zero_grad()
        loss.backward()
        rec.record_gradients()
        optimizer.step()
        rec.finish_step()
    rec.close()


def contents(folder: Path, trial: str) -> tuple[dict, list]:
    with open_recording(folder, trial) as recording:
        rows = {(t.name, kind): recording.summary_rows(t.node, kind, tensor=t.name)
                for t in recording.tensors for kind in recording.kinds(t.name)}
        return rows, [(p.step, p.category, p.subject) for p in recording.problems()]


def test_rows_read_when_the_record_is_built_equal_rows_read_at_once(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    train(tmp_path, "at_once")
    late_reads: list[int] = []
    finishing = []
    original_rows, original_finish = collected.Collected.rows, step_rows.StepRows.finish

    def counting(self: collected.Collected) -> np.ndarray:
        if finishing and self._result is None:
            late_reads.append(len(self))
        return original_rows(self)

    def finish(self: step_rows.StepRows, *args: object) -> object:
        finishing.append(True)
        try:
            return original_finish(self, *args)
        finally:
            finishing.pop()

    with monkeypatch.context() as patch:
        patch.setattr(reducer.Reducer, "take_ready", lambda self: None)
        patch.setattr(reducer.Reducer, "ready", property(lambda self: False))
        patch.setattr(collected.Collected, "travelling", property(lambda self: True))
        patch.setattr(collected.Collected, "rows", counting)
        patch.setattr(step_rows.StepRows, "finish", finish)
        train(tmp_path, "late")
    # the values' and gradients' rows of every step were taken at the end of its gradient set and read as its
    # record was built, with its updates
    assert len(late_reads) >= 8 and min(late_reads) >= 1
    at_once, late = contents(tmp_path, "at_once"), contents(tmp_path, "late")
    assert at_once[0].keys() == late[0].keys() and len(late[0]) >= 12
    for key, (steps, rows) in at_once[0].items():
        np.testing.assert_array_equal(late[0][key][0], steps)
        np.testing.assert_array_equal(late[0][key][1], rows, err_msg=str(key))
    assert late[1] == at_once[1] == [(step, schema.PROBLEM_SKIPPED_TENSOR, "unreadable") for step in range(4)]

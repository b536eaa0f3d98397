"""Statistic tiers: sentinel rows of parameter values and updates at every step, complete ones every k-th step
and, for every parameter at once, at the step where a sentinel moved (real tiny training runs, real files)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from comgra_ndbg import NeuralDbg, Recorder, open_recording
from comgra_ndbg.errors import InvalidArgumentError
from comgra_ndbg.recorder.flight import FlightRecorder, NonFinite
from comgra_ndbg.recorder.tiers import Tiers, as_tiers
from comgra_ndbg.stats.sentinels import is_sentinel

STEPS = 24
QUIET = Tiers(update_factor=1e6)  # only edits and non-finite values move a sentinel: the schedule is exact


def _train(folder, *, detail, edit_at=None, lr_at=None, nan_at=None, steps=STEPS, **options):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(32, 6, generator=g), torch.randint(0, 3, (32,), generator=g)) for _ in range(steps)]
    with NeuralDbg(model, folder, trial="t", optimizer=optimizer, loss=criterion, detail=detail, **options):
        for step, (x, y) in enumerate(batches):
            with torch.no_grad():
                if step == edit_at:
                    model[2].weight.mul_(30.0)
                if step == nan_at:
                    model[0].bias[3] = float("nan")
            if step == lr_at:
                optimizer.param_groups[0]["lr"] *= 1000
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()
    return open_recording(folder / "t")


PARAMETERS = ("model.0.weight", "model.0.bias", "model.2.weight", "model.2.bias")


def _complete_steps(recording, kind):
    """Per parameter tensor: the steps whose ``kind`` row is complete, and the steps that have a row."""
    out = {}
    for name in PARAMETERS:
        steps, rows = recording.summary_rows(name, kind)
        out[name] = (set(steps[~is_sentinel(rows)].tolist()), steps.tolist())
    return out


def test_sentinels_every_step_complete_rows_every_kth_step(tmp_path):
    tiers = Tiers(full_every=5, update_factor=1e6)
    with _train(tmp_path / "tiered", detail=tiers) as tiered, _train(tmp_path / "full", detail="full") as full:
        for kind in ("value", "update"):
            for name, (complete, steps) in _complete_steps(tiered, kind).items():
                assert steps == list(range(STEPS)), (name, kind)
                assert complete == {0, 5, 10, 15, 20}, (name, kind)
        for name in PARAMETERS:
            for kind in ("value", "update"):
                for stat in ("l2", "rms", "min", "max", "abs_max", "nonfinite"):
                    np.testing.assert_allclose(tiered.summary(name, kind, stat)[1], full.summary(name, kind, stat)[1],
                                               rtol=1e-5, atol=1e-9, err_msg=f"{name} {kind} {stat}")
                mean = tiered.summary(name, kind, "mean")[1]
                assert np.isnan(mean[[1, 2, 3, 4, 6, 19]]).all() and np.isfinite(mean[[0, 5, 10]]).all()
            grad = tiered.summary(name, "grad", "mean")[1]
            assert np.isfinite(grad).all()  # gradients stay complete at every step
        assert tiered.config["detail"].startswith("Tiers(full_every=5")
        assert full.config["detail"] == "'full'"


def test_an_edited_weight_makes_every_parameter_complete_at_that_step(tmp_path):
    with _train(tmp_path, detail=QUIET, edit_at=13) as recording:
        for kind in ("value", "update"):
            for name, (complete, _) in _complete_steps(recording, kind).items():
                assert complete == {0, 10, 13, 14, 15, 20}, (name, kind)  # the edit, then hold=2 steps
        assert "changed beyond its update" in recording.step_reasons()[13]
        assert "sentinel" not in recording.step_reasons().get(12, "")
        l2 = recording.summary("model.2.weight", "value", "l2")[1]
        assert l2[13] > 10 * l2[12]  # the sentinel of the step before holds the weight as it was


def test_a_learning_rate_jump_makes_every_update_complete_at_that_step(tmp_path):
    with _train(tmp_path, detail=Tiers(), lr_at=13) as recording:
        reasons = recording.step_reasons()
        assert "updates' size jumped" in reasons[13]
        for name, (complete, _) in _complete_steps(recording, "update").items():
            assert 13 in complete and 12 not in complete, name
        update = recording.summary("model.0.weight", "update", "l2")[1]
        assert update[13] > 100 * update[12]


def test_nonfinite_parameter_gets_exact_counts_at_once(tmp_path):
    with _train(tmp_path, detail=QUIET, nan_at=7, steps=9) as recording:
        steps, rows = recording.summary_rows("model.0.bias", "value")
        assert not is_sentinel(rows[steps.tolist().index(7)])
        assert recording.summary("model.0.bias", "value", "nonfinite")[1][7] == 1
        assert "non-finite" in recording.step_reasons()[7]


def test_flight_ring_keeps_the_sentinel_steps_before_a_trigger(tmp_path):
    torch.manual_seed(0)
    model = nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with Recorder(tmp_path, trial="t", summaries=None, snapshots=None, detail=QUIET,
                  flight_recorder=FlightRecorder(steps=3, after=0, triggers=[NonFinite()])) as rec:
        rec.track_module("model", model)
        for step in range(12):
            with rec.step(step):
                x = torch.randn(8, 4)
                if step == 9:
                    x[0, 0] = float("nan")
                out = rec.register_tensor("out", model(x), role="output")
                optimizer.zero_grad()
                out.square().mean().backward()
                rec.record_gradients()
                optimizer.step()
    with open_recording(tmp_path / "t") as recording:
        assert recording.steps.tolist() == [6, 7, 8, 9]
        steps, rows = recording.summary_rows("model.weight", "update")
        assert steps.tolist() == [6, 7, 8, 9]
        assert is_sentinel(rows).tolist() == [True, True, True, False]  # 9: the NaN reached the update
        assert np.isfinite(recording.summary("model.weight", "value", "l2")[1]).all()


def test_detail_is_checked_at_the_boundary(tmp_path):
    with pytest.raises(InvalidArgumentError, match="detail must be one of"):
        Recorder(tmp_path, trial="a", detail="some")
    with pytest.raises(InvalidArgumentError, match="full_every"):
        Tiers(full_every=0)
    with pytest.raises(InvalidArgumentError, match="update_factor"):
        Tiers(update_factor=0.5)
    assert as_tiers("full") is None and as_tiers("tiered") == Tiers()


def test_the_gui_shows_what_a_sentinel_row_holds(tmp_path):
    from comgra_ndbg.gui.queries import statistics_at, timeline_curves
    from comgra_ndbg.gui.state import ReaderCache, Selection

    _train(tmp_path, detail=QUIET).close()
    cache = ReaderCache(tmp_path)
    selection = Selection(trial="t", step_type="train", step=3, iteration=0, node="model.0.parameters",
                          tensor="model.0.weight", kind="update", stat="mean")
    steps, values = timeline_curves(cache, selection)["train"]
    assert steps.tolist() == [0, 10, 20] and np.isfinite(values).all()  # a line through the complete rows
    steps, values = timeline_curves(cache, Selection(**{**selection.__dict__, "stat": "l2"}))["train"]
    assert steps.tolist() == list(range(STEPS)) and np.isfinite(values).all()
    at_sentinel, at_complete = statistics_at(cache, selection), statistics_at(cache, Selection(
        **{**selection.__dict__, "step": 10}))
    assert "mean" not in at_sentinel and "abs_mean" not in at_sentinel and at_sentinel["l2"] > 0
    assert np.isfinite(at_complete["mean"]) and set(at_sentinel) < set(at_complete)


def test_ranks_with_the_same_sentinel_rows_agree():
    from comgra_ndbg.analysis.ranks import _COMPARED, _close
    from comgra_ndbg.stats.sentinels import sentinel_rows

    rows = sentinel_rows([torch.tensor([1.0, -2.0, 3.0])])[:, _COMPARED]
    moved = sentinel_rows([torch.tensor([1.0, -2.0, 3.5])])[:, _COMPARED]
    assert _close(rows, rows.copy(), 1e-6).all()
    assert not _close(rows, moved, 1e-6).any()


@pytest.mark.parametrize("detail", ["tiered", "full"])
def test_a_layer_frozen_by_requires_grad_is_diagnosed_from_sentinel_rows(tmp_path, detail):
    """No update rows after the freeze: stagnation reads the value rows, sentinel and complete alike."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    criterion, optimizer = nn.CrossEntropyLoss(), torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    with NeuralDbg(model, tmp_path, trial="t", loss=criterion, optimizer=optimizer, detail=detail) as dbg:
        for step in range(80):
            if step == 43:
                model[2].requires_grad_(False)
            x = torch.randn(32, 8, generator=g)
            optimizer.zero_grad()
            criterion(model(x), x[:, :4].argmax(1)).backward()
            optimizer.step()
        top = dbg.diagnose().hypotheses[0]
    assert (top.type, top.node, top.onset) == ("update_stagnation", "model.2.parameters", 44)

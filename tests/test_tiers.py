"""Statistic tiers: parameter values and gradients at every step, updates measured every k-th step, at
snapshot steps and from the step where something changed that changes updates (real tiny training runs,
real files)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.optim import optimizer as optim_module

from comgra_ndbg import NeuralDbg, Recorder, open_recording
from comgra_ndbg.errors import InvalidArgumentError
from comgra_ndbg.recorder.flight import FlightRecorder, NonFinite
from comgra_ndbg.recorder.tiers import Tiers, TierState, as_tiers
from comgra_ndbg.stats.fields import FIELD, NUM_FIELDS
from comgra_ndbg.stats.sentinels import is_sentinel
from tiny_tanh_run import tiny_run

STEPS = 24
QUIET = Tiers(update_factor=1e6, first=0, full_every=10)  # only what changes updates moves the tiers: the schedule is exact


def _train(folder, *, detail, edit_at=None, data_edit_at=None, lr_at=None, nan_at=None, freeze_at=None,
           steps=STEPS, **options):
    model, criterion, optimizer, batches = tiny_run(steps)
    options.setdefault("snapshots", None)
    with NeuralDbg(model, folder, trial="t", optimizer=optimizer, loss=criterion, detail=detail, **options):
        for step, (x, y) in enumerate(batches):
            with torch.no_grad():
                if step == edit_at:
                    model[2].weight.mul_(30.0)
                if step == nan_at:
                    model[0].bias[3] = float("nan")
            if step == data_edit_at:  # no version counter sees this one
                model[2].weight.data.mul_(30.0)
            if step == lr_at:
                optimizer.param_groups[0]["lr"] *= 1000
            if step == freeze_at:
                model[0].requires_grad_(False)
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()
    return open_recording(folder / "t")


PARAMETERS = ("model.0.weight", "model.0.bias", "model.2.weight", "model.2.bias")


def _update_steps(recording, names=PARAMETERS):
    return {name: recording.summary_rows(name, "update")[0].tolist() for name in names}


def test_updates_every_kth_step_values_and_gradients_every_step(tmp_path):
    tiers = Tiers(full_every=5, update_factor=1e6, first=0)
    with _train(tmp_path / "tiered", detail=tiers) as tiered, _train(tmp_path / "full", detail="full") as full:
        for name, steps in _update_steps(tiered).items():
            assert steps == [0, 5, 10, 15, 20], name
        for name in PARAMETERS:
            for kind in ("value", "grad"):
                steps, rows = tiered.summary_rows(name, kind)
                assert steps.tolist() == list(range(STEPS)) and not is_sentinel(rows).any(), (name, kind)
                np.testing.assert_array_equal(rows, full.summary_rows(name, kind)[1], err_msg=f"{name} {kind}")
            full_steps, full_rows = full.summary_rows(name, "update")
            np.testing.assert_array_equal(tiered.summary_rows(name, "update")[1], full_rows[[0, 5, 10, 15, 20]])
        assert tiered.config["detail"].startswith("Tiers(full_every=5")
        assert full.config["detail"] == "'full'"
        assert not any("tiers" in reason for reason in tiered.step_reasons().values())


def test_snapshot_steps_measure_updates_for_their_update_snapshots(tmp_path):
    with _train(tmp_path, detail=Tiers(full_every=7, update_factor=1e6, first=0), snapshots=10) as recording:
        assert _update_steps(recording)["model.0.weight"] == [0, 7, 10, 14, 20, 21]
        assert set(recording.snapshot_steps("model.0.weight", "update").tolist()) == {0, 10, 20}


def test_an_edit_under_no_grad_measures_updates_from_that_step(tmp_path):
    with _train(tmp_path, detail=QUIET, edit_at=13) as recording:
        for name, steps in _update_steps(recording).items():
            assert steps == [0, 10, 13, 14, 15, 20], name  # the edit, then hold=2 steps
        assert "a parameter was changed between steps" in recording.step_reasons()[13]
        assert "tiers" not in recording.step_reasons().get(12, "")
        l2 = recording.summary("model.2.weight", "value", "l2")[1]
        assert l2[13] > 10 * l2[12]


def test_an_edit_no_version_counter_sees_moves_the_values(tmp_path):
    with _train(tmp_path, detail=Tiers(update_factor=4.0, first=0, full_every=10), data_edit_at=13) as recording:
        reasons = recording.step_reasons()
        assert "changed beyond its updates" in reasons[13] and "tiers" not in reasons.get(12, "")
        for name, steps in _update_steps(recording).items():
            # the values of step 13 showed it, so the next steps measure; step 14's show the update of step
            # 13, 30 times the last one measured (step 10), which keeps them measuring one step longer
            assert steps == [0, 10, 14, 15, 16, 20], name


def test_a_learning_rate_change_measures_updates_at_that_step(tmp_path):
    with _train(tmp_path, detail=QUIET, lr_at=13) as recording:
        assert "an optimizer's settings jumped" in recording.step_reasons()[13]
        steps, l2 = recording.summary("model.0.weight", "update", "l2")
        # 16: under NeuralDbg the tiers watch the gradients too, which the 1000x steps threw far (hold 2)
        assert steps.tolist() == [0, 10, 13, 14, 15, 16, 20]
        assert "a parameter gradient jumped" in recording.step_reasons()[14]
        assert l2[2] > 100 * l2[1]  # step 13 against step 10


def test_a_frozen_layer_measures_updates_at_that_step(tmp_path):
    with _train(tmp_path, detail=QUIET, freeze_at=13) as recording:
        assert "requires_grad changed" in recording.step_reasons()[13]
        # the freeze, then hold=2 steps; step 14's values show model.0 stopped moving: 2 steps more
        assert _update_steps(recording)["model.2.weight"] == [0, 10, 13, 14, 15, 16, 20]
        assert _update_steps(recording)["model.0.weight"] == [0, 10]  # frozen, unmoved: no update rows


def test_nonfinite_parameter_values_are_counted_and_measure_updates(tmp_path):
    with _train(tmp_path, detail=QUIET, nan_at=7, steps=10) as recording:
        assert recording.summary("model.0.bias", "value", "nonfinite")[1][7] == 1
        assert "non-finite" in recording.step_reasons()[7] or "changed between steps" in recording.step_reasons()[7]
        assert _update_steps(recording)["model.0.bias"] == [0, 7, 8, 9]


def test_the_first_recorded_steps_measure_whatever_their_numbers():
    """A run continued from a checkpoint at step 1003 measures its first steps too."""
    state = TierState(Tiers(first=3, full_every=10))
    marks = [(0, 0, True)]
    decided = []
    for step in range(1003, 1012):
        decided.append(state.decide(step, marks)[0])
        state.finish(step, marks)
    assert decided == [True, True, True, False, False, False, False, True, False]  # 1003-1005, then 1010


def test_a_parameter_that_stops_moving_measures_updates_without_settings():
    """A learning rate set to 0 where nothing watches the optimizer: the identical value rows say it."""
    state = TierState(Tiers(hold=1, first=0))
    rows = np.zeros((2, NUM_FIELDS))
    rows[:, FIELD["count"]] = 4
    history = []
    for step in range(8):
        due, _ = state.decide(step, [(0, 0, True), (0, 0, True)])
        if step < 5:  # both parameters move until step 5; the second stops there
            rows[:, FIELD["sum"]] += 0.1
        else:
            rows[0, FIELD["sum"]] += 0.1
        rows[:, FIELD["sum_sq"]] = rows[:, FIELD["sum"]] ** 2
        history.append((due, state.observe_values(step, rows.copy())))
        state.finish(step, [(0, 0, True), (0, 0, True)])
    assert [due for due, _ in history] == [True, False, False, False, False, False, True, False]
    assert history[5][1] == "tiers: a parameter stopped changing"
    assert all(reason == "" for i, (_, reason) in enumerate(history) if i != 5)


def test_flight_ring_keeps_the_steps_before_a_trigger(tmp_path):
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
        assert recording.summary_rows("model.weight", "value")[0].tolist() == [6, 7, 8, 9]
        # the ring snapshots every step, and an update snapshot needs the step's start: all are measured
        assert recording.summary_rows("model.weight", "update")[0].tolist() == [6, 7, 8, 9]
        assert recording.snapshot_steps("model.weight", "update").tolist() == [6, 7, 8, 9]
        assert np.isfinite(recording.summary("model.weight", "value", "l2")[1]).all()


def _recorder_loop(folder, tiers, lr_at_step):
    """A Recorder loop (no NeuralDbg) with SGD whose learning rate is ``lr_at_step(step)``."""
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with Recorder(folder, trial="t", snapshots=None, detail=tiers) as rec:
        rec.track_module("model", model)
        for step in range(30):
            optimizer.param_groups[0]["lr"] = lr_at_step(step)
            with rec.step(step):
                optimizer.zero_grad()
                rec.register_tensor("out", model(torch.randn(3, 4)), role="output").square().sum().backward()
                rec.record_gradients()
                optimizer.step()
    return open_recording(folder / "t")


def test_an_optimizers_settings_are_watched_under_the_recorder_api(tmp_path):
    hooks = len(optim_module._global_optimizer_pre_hooks)
    jump = _recorder_loop(tmp_path / "jump", QUIET, lambda step: 0.01 if step < 13 else 0.3)
    with jump:
        assert "an optimizer's settings jumped" in jump.step_reasons()[13]
        steps, l2 = jump.summary("model.weight", "update", "l2")
        assert steps.tolist() == [0, 10, 13, 14, 15, 20]
        assert l2[2] > 5 * l2[1]  # measured at step 13 from before the optimizer's step
    assert len(optim_module._global_optimizer_pre_hooks) == hooks  # removed at close
    schedule = _recorder_loop(tmp_path / "cosine", QUIET, lambda step: 0.05 * (1 + np.cos(np.pi * step / 60)))
    with schedule:
        assert schedule.summary_rows("model.weight", "update")[0].tolist() == [0, 10, 20]
        assert not any("tiers" in reason for reason in schedule.step_reasons().values())


def test_a_recorder_dropped_without_close_takes_its_optimizer_hook_with_it(tmp_path):
    import gc

    hooks = len(optim_module._global_optimizer_pre_hooks)
    rec = Recorder(tmp_path, trial="t", detail="tiered")
    assert len(optim_module._global_optimizer_pre_hooks) == hooks + 1
    del rec
    gc.collect()
    assert len(optim_module._global_optimizer_pre_hooks) == hooks


@pytest.mark.parametrize("jumping_first", [True, False])
def test_two_optimizers_one_of_which_jumps(tmp_path, jumping_first):
    """A copy taken when the second optimizer jumps would show the first one's parameters as unchanged: the
    step is measured only when the jumping optimizer steps first, and the hold measures the steps after."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    first_opt = torch.optim.SGD(model[0].parameters(), lr=0.05)
    second_opt = torch.optim.SGD(model[2].parameters(), lr=0.05)
    jumping = first_opt if jumping_first else second_opt
    with Recorder(tmp_path, trial="t", snapshots=None, detail=QUIET) as rec:
        rec.track_module("model", model)
        for step in range(20):
            if step == 13:
                jumping.param_groups[0]["lr"] = 0.5
            with rec.step(step):
                first_opt.zero_grad()
                second_opt.zero_grad()
                rec.register_tensor("out", model(torch.randn(16, 4)), role="output").square().mean().backward()
                rec.record_gradients()
                first_opt.step()
                second_opt.step()
    with open_recording(tmp_path / "t") as recording:
        steps, l2 = recording.summary("model.0.weight", "update", "l2")
        assert steps.tolist() == ([0, 10, 13, 14, 15] if jumping_first else [0, 10, 14, 15])
        assert (l2 > 0).all()  # no update of a parameter that moved reads as zero


def test_the_first_steps_measure_their_updates(tmp_path):
    with _recorder_loop(tmp_path, Tiers(first=5, full_every=10, update_factor=1e6), lambda step: 0.1) as recording:
        assert recording.summary_rows("model.weight", "update")[0].tolist() == [0, 1, 2, 3, 4, 10, 20]


def test_detail_is_checked_at_the_boundary(tmp_path):
    with pytest.raises(InvalidArgumentError, match="detail must be one of"):
        Recorder(tmp_path, trial="a", detail="some")
    with pytest.raises(InvalidArgumentError, match="full_every"):
        Tiers(full_every=0)
    with pytest.raises(InvalidArgumentError, match="update_factor"):
        Tiers(update_factor=0.5)
    with pytest.raises(InvalidArgumentError, match="first"):
        Tiers(first=-1)
    assert as_tiers("full") is None and as_tiers("tiered") == Tiers()


def test_the_gui_shows_updates_where_they_were_measured(tmp_path):
    from comgra_ndbg.gui.panels import missing_statistics_text
    from comgra_ndbg.gui.queries import statistics_at, timeline_curves
    from comgra_ndbg.gui.state import ReaderCache, Selection

    _train(tmp_path, detail=QUIET).close()
    cache = ReaderCache(tmp_path)
    selection = Selection(trial="t", step_type="train", step=3, iteration=0, node="model.0.parameters",
                          tensor="model.0.weight", kind="update", stat="l2")
    steps, values = timeline_curves(cache, selection)["train"]
    assert steps.tolist() == [0, 10, 20] and np.isfinite(values).all()  # a line through the measured steps
    steps, values = timeline_curves(cache, Selection(**{**selection.__dict__, "kind": "value"}))["train"]
    assert steps.tolist() == list(range(STEPS)) and np.isfinite(values).all()
    assert statistics_at(cache, Selection(**{**selection.__dict__, "step": 10}))["l2"] > 0
    assert statistics_at(cache, selection) is None  # step 3: not measured
    text = missing_statistics_text(cache, Selection(**{**selection.__dict__, "step": 13}), "whole batch")
    assert text.endswith("nearest 10 and 20.")
    value = Selection(**{**selection.__dict__, "kind": "value", "step": 99})
    assert "nearest" not in missing_statistics_text(cache, value, "whole batch")


@pytest.mark.parametrize("detail", ["tiered", "full"])
def test_a_layer_frozen_by_requires_grad_is_diagnosed_with_either_detail(tmp_path, detail):
    """No update rows after the freeze: stagnation reads the value rows."""
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


def test_neuraldbg_defaults_to_the_tiers_and_the_recorder_to_full(tmp_path):
    model = nn.Linear(3, 2)
    with NeuralDbg(model, tmp_path, trial="n") as dbg:
        model(torch.randn(4, 3)).sum().backward()
    with Recorder(tmp_path, trial="r") as rec:
        rec.track_module("model", model)
    with open_recording(dbg.path) as tiered, open_recording(rec.path) as full:
        assert tiered.config["detail"] == repr(Tiers()) and full.config["detail"] == "'full'"


def test_a_module_tracked_between_steps_has_its_missing_gradients_watched(tmp_path):
    """The series the tiers read a step's parameter gradients from are kept once every parameter has one: a
    module tracked later (its layer unused here, so its gradients are missing) is watched as well, never
    read against the series of the parameters tracked before it."""
    import warnings

    from comgra_ndbg.errors import RecorderWarning

    torch.manual_seed(0)
    used, unused = nn.Linear(4, 2), nn.Linear(4, 2)
    optimizer = torch.optim.SGD(used.parameters(), lr=0.05)
    with warnings.catch_warnings(record=True) as caught, Recorder(tmp_path, trial="t", snapshots=None,
                                                                  detail=QUIET) as rec:
        warnings.simplefilter("always")
        rec.use_sentinels()  # as NeuralDbg: the tiers watch the gradients of the steps recorded in full
        rec.track_module("used", used)
        for step in range(8):
            if step == 4:
                rec.track_module("unused", unused)
            with rec.step(step):
                optimizer.zero_grad()
                rec.register_tensor("out", used(torch.randn(8, 4)), role="output").square().mean().backward()
                optimizer.step()
    assert not [w for w in caught if issubclass(w.category, RecorderWarning)]
    with open_recording(tmp_path / "t") as recording:
        reasons = recording.step_reasons()
    assert not any("got no gradient" in reasons[step] for step in range(4))
    assert "tiers: a parameter's requires_grad changed" in reasons[4]  # the new parameters' marks, first
    assert all("a parameter that requires grad got no gradient" in reasons[step] for step in range(5, 8))

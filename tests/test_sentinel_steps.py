"""Sentinel steps: between the steps the tiers measure, NeuralDbg records only every parameter's value and
gradient (light steps, no module hooks), and measures everything again where those rows move (real tiny
training runs, real files)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from comgra_ndbg import NeuralDbg, open_recording
from comgra_ndbg.analysis.api import analyze
from comgra_ndbg.errors import InvalidArgumentError
from comgra_ndbg.instrument.light_steps import LIGHT_AFTER
from comgra_ndbg.recorder.sentinel_steps import SENTINEL_REASON
from comgra_ndbg.recorder.tiers import Tiers, TierState
from comgra_ndbg.stats.fields import FIELD, NUM_FIELDS
from tiny_tanh_run import tiny_run

STEPS = 70
PARAMETERS = ("model.0.weight", "model.0.bias", "model.2.weight", "model.2.bias")
QUIET = Tiers(update_factor=1e6, full_every=10)  # values never move the tiers here: the schedule is exact


def _train(folder, *, detail="tiered", scale_grad_at=None, nan_grad_at=None, edit_at=None, lr_at=None,
           steps=STEPS, strided_grads=False, nan_input_at=None, scale_input_from=None, **options):
    model, criterion, optimizer, batches = tiny_run(steps)
    options.setdefault("snapshots", None)
    with NeuralDbg(model, folder, trial="t", optimizer=optimizer, loss=criterion, detail=detail, **options):
        for step, (x, y) in enumerate(batches):
            if step == edit_at:
                with torch.no_grad():
                    model[0].weight.mul_(1.5)
            if step == lr_at:
                optimizer.param_groups[0]["lr"] *= 100
            if scale_input_from is not None and step >= scale_input_from:
                x = x * 10.0  # an unnormalised batch from here on
            if step == nan_input_at:
                x = x.clone()
                x[3, 1] = float("nan")
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            if step == scale_grad_at:
                loss = loss * 1000.0  # every gradient of this step 1000x: a jump the sentinels see
            loss.backward()
            if step == nan_grad_at:
                model[2].bias.grad[0] = float("nan")
            if strided_grads:  # the same values, laid out column-major: not a contiguous array
                for layer in (model[0], model[2]):
                    layer.weight.grad = layer.weight.grad.t().contiguous().t()
            optimizer.step()
    return model, open_recording(folder / "t")


def _measured(recording):
    """Steps whose module outputs were recorded (everything measured)."""
    return recording.summary_rows("model.1", "value")[0].tolist()


def _schedule(after=()):
    """Steps measured in full: the first LIGHT_AFTER, each 10th and the one after it, and ``after``."""
    base = set(range(LIGHT_AFTER)) | {s for s in range(STEPS) if s % 10 == 0} | {s + 1 for s in range(STEPS)
                                                                                if s % 10 == 0}
    return sorted((base | set(after)) & set(range(STEPS)))


def test_sentinel_steps_record_parameters_only_between_measured_steps(tmp_path):
    _, recording = _train(tmp_path, detail=QUIET)
    with recording:
        measured = _measured(recording)
        assert measured == _schedule()
        reasons = recording.step_reasons()
        sentinels = sorted(set(range(STEPS)) - set(measured))
        assert sentinels and all(reasons[s] == SENTINEL_REASON for s in sentinels)
        for name in PARAMETERS:
            for kind in ("value", "grad"):
                assert recording.summary_rows(name, kind)[0].tolist() == list(range(STEPS)), (name, kind)
        for name in ("model.0", "model.2", "loss", "target"):
            assert recording.summary_rows(name, "value")[0].tolist() == measured, name
        assert recording.summary_rows("input", "value")[0].tolist() == list(range(STEPS))  # data faults show
        assert recording.summary_rows("model.0", "grad")[0].tolist() == measured
        assert set(recording.summary_rows("model.0.weight", "update")[0].tolist()) <= set(measured)
        loss_steps, _ = recording.kpi("loss")
        assert loss_steps.tolist() == list(range(STEPS))  # the loss KPI at every step


def test_sentinel_rows_are_the_rows_a_full_recording_has(tmp_path):
    _, recording = _train(tmp_path / "tiered", detail=QUIET)
    _, full = _train(tmp_path / "full", detail="full")
    with recording, full:
        sentinels = sorted(set(range(STEPS)) - set(_measured(recording)))
        for name in PARAMETERS:
            for kind in ("value", "grad"):
                steps, rows = recording.summary_rows(name, kind)
                full_steps, full_rows = full.summary_rows(name, kind)
                assert steps.tolist() == full_steps.tolist()
                # the same statistics; a float32 sum's last bit may differ where the CPU's vectorisation of the
                # kernel that also copies the values (the full steps') differs from the one that does not
                np.testing.assert_allclose(rows[sentinels], full_rows[sentinels], rtol=1e-6, atol=0,
                                           err_msg=f"{name} {kind}")
        steps, rows = recording.summary_rows("input", "value")
        np.testing.assert_array_equal(rows, full.summary_rows("input", "value")[1])


def _spy_on_the_single_call(monkeypatch) -> list:
    """What ``summarize_with_gradients`` returned at each sentinel step (a range: the single kernel call)."""
    from comgra_ndbg.recorder.parameters import ParameterTracker

    returned = []
    original = ParameterTracker.summarize_with_gradients
    monkeypatch.setattr(ParameterTracker, "summarize_with_gradients",
                        lambda self, reducer, grads: returned.append(original(self, reducer, grads)) or returned[-1])
    return returned


def test_a_sentinel_step_summarises_values_and_gradients_in_one_call(tmp_path, monkeypatch):
    returned = _spy_on_the_single_call(monkeypatch)
    _, recording = _train(tmp_path, detail=QUIET)
    with recording:
        sentinels = set(range(STEPS)) - set(_measured(recording))
    assert len(returned) == len(sentinels)
    assert all(isinstance(rows, range) and len(rows) == 2 * len(PARAMETERS) for rows in returned)


def test_strided_gradients_are_summarised_apart_from_the_values_with_the_same_rows(tmp_path, monkeypatch):
    """Gradients the single kernel call cannot read in place (here: column-major) take the general path,
    with the rows a full recording has."""
    fused = _spy_on_the_single_call(monkeypatch)
    _, recording = _train(tmp_path / "tiered", detail=QUIET, strided_grads=True)
    assert fused and all(rows is None for rows in fused)
    _, full = _train(tmp_path / "full", detail="full", strided_grads=True)
    with recording, full:
        sentinels = sorted(set(range(STEPS)) - set(_measured(recording)))
        for name in PARAMETERS:
            for kind in ("value", "grad"):
                rows, full_rows = recording.summary_rows(name, kind)[1], full.summary_rows(name, kind)[1]
                np.testing.assert_allclose(rows[sentinels], full_rows[sentinels], rtol=1e-6, err_msg=f"{name} {kind}")


def test_training_under_sentinel_steps_is_bit_identical_to_bare(tmp_path):
    recorded, recording = _train(tmp_path, detail=QUIET)
    recording.close()
    bare, criterion, optimizer, batches = tiny_run(STEPS)
    for x, y in batches:
        optimizer.zero_grad()
        criterion(bare(x), y).backward()
        optimizer.step()
    for a, b in zip(recorded.parameters(), bare.parameters()):
        assert torch.equal(a, b)


def test_a_gradient_jump_at_a_sentinel_step_measures_the_next_steps(tmp_path):
    _, recording = _train(tmp_path, detail=QUIET, scale_grad_at=45)
    with recording:
        measured = _measured(recording)
        # 46 and 47 held by the jump at 45, 48 by the jump back down at 46 (and the gradients after the 1000x
        # step may go on moving)
        assert {42, 43, 44, 45}.isdisjoint(measured) and {46, 47, 48} <= set(measured)
        assert set(measured) - set(_schedule()) <= set(range(46, 60))
        reasons = recording.step_reasons()
        assert reasons[45].startswith(SENTINEL_REASON) and "a parameter gradient jumped" in reasons[45]
        assert reasons[44] == SENTINEL_REASON


def test_a_nonfinite_gradient_at_a_sentinel_step_measures_the_next_steps(tmp_path):
    _, recording = _train(tmp_path, detail=QUIET, nan_grad_at=53)
    with recording:
        measured = _measured(recording)
        assert 53 not in measured and {54, 55} <= set(measured)
        assert "a non-finite parameter gradient" in recording.step_reasons()[53]
        steps, rows = recording.summary_rows("model.2.bias", "grad")
        assert rows[steps.tolist().index(53), FIELD["nan"]] == 1


def test_a_nan_input_at_a_sentinel_step_is_the_one_root_of_what_follows(tmp_path):
    """The NaN input's gradients turn the parameters NaN in the update of that very step: the analysis reads
    the non-finite gradient rows the sentinel step recorded (not the finite ones measured before it), so the
    parameters' non-finite values at the next step follow from the input instead of standing as roots of
    their own, each claiming the failure."""
    _, recording = _train(tmp_path, detail=QUIET, nan_input_at=53)
    with recording:
        assert recording.step_reasons()[53].startswith(SENTINEL_REASON)
        steps, rows = recording.summary_rows("model.2.bias", "grad")
        assert rows[steps.tolist().index(53), FIELD["nan"]] > 0
    diagnosis = analyze(tmp_path / "t", store=False)
    assert [(h.type, h.origin, h.node, h.onset) for h in diagnosis.hypotheses] == [
        ("nonfinite_data", "data", "input", 53)]


def test_inputs_scaled_at_a_sentinel_step_stop_the_interpolation_of_the_outputs_across_them(tmp_path):
    """The tiers watch parameters, not inputs: a batch scaled 10x at a sentinel step moves no sentinel, and the
    module outputs, measured again at step 60, were interpolated across the gap from the last measurement
    before the change, so their change seemed to begin part-way through it (saturation at step 58, which
    the interpolation made up). The inputs' own rows, recorded at every step, now mark the step they moved
    at, and the outputs are held from the last measurement to the first after it, as across any gap where
    something moved: the change is dated where it was measured."""
    _, recording = _train(tmp_path, detail=QUIET, scale_input_from=53)
    with recording:
        assert recording.step_reasons()[53] == SENTINEL_REASON
        assert 60 in _measured(recording) and not {53, 54, 55, 56, 57, 58, 59} & set(_measured(recording))
    diagnosis = analyze(tmp_path / "t", store=False)
    assert [(e.family, e.node, e.onset) for e in diagnosis.events if 50 <= e.onset <= 60] == [
        ("activation_regime", "model.1", 60)]


def test_a_parameter_edited_between_steps_is_measured_at_that_step(tmp_path):
    _, recording = _train(tmp_path, detail=QUIET, edit_at=56)
    with recording:
        measured = _measured(recording)
        assert {56, 57, 58} <= set(measured)
        assert "changed between steps" in recording.step_reasons()[56]
        assert 56 in recording.summary_rows("model.0.weight", "update")[0].tolist()


def test_a_learning_rate_jump_at_a_sentinel_step_measures_its_update_there(tmp_path):
    _, recording = _train(tmp_path / "tiered", detail=QUIET, lr_at=45)
    _, full = _train(tmp_path / "full", detail="full", lr_at=45)
    with recording, full:
        reasons = recording.step_reasons()
        assert reasons[45].startswith(SENTINEL_REASON) and "an optimizer's settings jumped" in reasons[45]
        assert {46, 47} <= set(_measured(recording)) and 45 not in _measured(recording)
        for name in PARAMETERS:
            steps, rows = recording.summary_rows(name, "update")
            assert 45 in steps.tolist() and 44 not in steps.tolist()
            full_steps, full_rows = full.summary_rows(name, "update")
            np.testing.assert_array_equal(rows[steps.tolist().index(45)], full_rows[45], err_msg=name)


def test_without_sentinels_every_step_records_its_module_outputs(tmp_path):
    _, recording = _train(tmp_path, detail=Tiers(update_factor=1e6, sentinels=False))
    with recording:
        assert _measured(recording) == list(range(STEPS))
        assert SENTINEL_REASON not in recording.step_reasons().values()


def test_snapshot_steps_are_never_sentinel_steps(tmp_path):
    _, recording = _train(tmp_path, detail=Tiers(update_factor=1e6, full_every=25), snapshots=7)
    with recording:
        measured = set(_measured(recording))
        assert {s for s in range(STEPS) if s % 7 == 0} <= measured
        assert {s for s in range(LIGHT_AFTER, STEPS) if s % 7 and (s - 1) % 7 and s % 25 and (s - 1) % 25}.isdisjoint(
            measured)


def test_tiers_check_their_new_settings():
    with pytest.raises(InvalidArgumentError, match="gradient_factor"):
        Tiers(gradient_factor=1.0)
    with pytest.raises(InvalidArgumentError, match="sentinels"):
        Tiers(sentinels="yes")


def _grad_rows(norms, nan=None):
    rows = np.zeros((len(norms), NUM_FIELDS))
    rows[:, FIELD["sum_sq"]] = np.square(norms)
    if nan is not None:
        rows[nan, FIELD["nan"]] = 1
    return rows


def test_gradient_drift_rules():
    state = TierState(Tiers(first=0))
    assert state.observe_gradients(10, _grad_rows([1.0, 2.0])) == ""
    assert state.observe_gradients(11, _grad_rows([5.0, 0.5])) == ""  # within 10x either way
    assert state.observe_gradients(12, _grad_rows([5.0, 0.04])) == "tiers: a parameter gradient jumped"
    assert state.due(13, []) and state.due(14, []) and not state.due(15, [])
    assert state.observe_gradients(20, _grad_rows([500.0, 0.04])) == ""  # not consecutive: nothing to compare
    assert state.observe_gradients(21, _grad_rows([500.0, 0.0])) == "tiers: a parameter gradient jumped"
    assert state.observe_gradients(22, _grad_rows([500.0, 1.0], nan=0)) == "tiers: a non-finite parameter gradient"
    assert state.observe_gradients(23, None) == "" and state.observe_gradients(24, _grad_rows([1.0, 1.0])) == ""
    # another number of parameters at the next step: nothing to compare with, whatever the norms
    assert state.observe_gradients(25, _grad_rows([1000.0, 1000.0, 1000.0])) == ""
    assert state.observe_gradients(26, _grad_rows([1000.0, 1000.0, 1e6])) == "tiers: a parameter gradient jumped"


def test_the_gui_names_the_nearest_measured_steps_at_a_sentinel_step(tmp_path):
    from comgra_ndbg.gui.panels import missing_statistics_text
    from comgra_ndbg.gui.queries import statistics_at, timeline_curves
    from comgra_ndbg.gui.state import ReaderCache, Selection

    _train(tmp_path, detail=QUIET)[1].close()
    cache = ReaderCache(tmp_path)
    selection = Selection(trial="t", step_type="train", step=45, iteration=0, node="model.1", tensor="model.1",
                          kind="value", stat="mean")
    assert statistics_at(cache, selection) is None
    text = missing_statistics_text(cache, selection, "whole batch")
    assert "sentinel steps" in text and text.endswith("nearest 41 and 50.")
    steps, values = timeline_curves(cache, selection)["train"]
    assert steps.tolist() == _schedule() and np.isfinite(values).all()  # a line through the measured steps
    weight = Selection(**{**selection.__dict__, "node": "model.0.parameters", "tensor": "model.0.weight",
                          "kind": "grad", "stat": "l2"})
    assert statistics_at(cache, weight)["l2"] > 0  # the sentinels: parameters at every step


class _WithAux(nn.Module):
    """A body and an auxiliary head whose loss term the loop may drop (``use_aux``)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
        self.aux = nn.Linear(6, 1)
        self.use_aux = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.body(x)
        return out + 0.01 * self.aux(x) if self.use_aux else out


def _aux_loop(folder, drop_at=None, eval_at=None, detail=QUIET):
    torch.manual_seed(0)
    model, criterion = _WithAux(), nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    with NeuralDbg(model, folder, trial="t", optimizer=optimizer, loss=criterion, detail=detail, snapshots=None):
        for step in range(STEPS):
            x, y = torch.randn(32, 6, generator=g), torch.randint(0, 3, (32,), generator=g)
            model.use_aux = drop_at is None or step < drop_at
            if step == eval_at:
                model.eval()  # left on: every later training pass runs in eval() mode
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()
    return open_recording(folder / "t")


def test_a_parameter_left_without_gradient_keeps_the_steps_full(tmp_path):
    with _aux_loop(tmp_path, drop_at=44) as recording:
        measured = recording.summary_rows("model.body.1", "value")[0].tolist()
        reasons = recording.step_reasons()
        assert any(reasons[s].startswith(SENTINEL_REASON) for s in range(LIGHT_AFTER, 44))
        assert set(range(45, STEPS)) <= set(measured)
        # the missing gradient ends it, not the values' drift: the auxiliary layer's updates are at float32's
        # resolution, which is no stop
        assert "got no gradient" in reasons[44], reasons[44]
        assert not any("stopped changing" in reason for reason in reasons.values())
        assert not any(reasons[s].startswith(SENTINEL_REASON) for s in range(45, STEPS))


def test_training_left_in_eval_mode_goes_back_to_the_full_path(tmp_path):
    """A pass in eval() mode that builds a graph ends the sentinel step: from there the full path sees the
    loop exactly as it does without sentinel steps."""
    with _aux_loop(tmp_path / "a", eval_at=44) as recording, \
            _aux_loop(tmp_path / "b", eval_at=44, detail=Tiers(update_factor=1e6, sentinels=False)) as full:
        reasons = recording.step_reasons()
        assert any(reasons[s].startswith(SENTINEL_REASON) for s in range(LIGHT_AFTER, 44))
        assert [s for s in reasons if s >= 44] == [s for s in full.step_reasons() if s >= 44]
        assert not any(reasons[s].startswith(SENTINEL_REASON) for s in reasons if s >= 44)
        assert [(e.step, e.message) for e in recording.log("invariant") if e.step >= 44] == \
            [(e.step, e.message) for e in full.log("invariant") if e.step >= 44]
        assert recording.kpi("loss")[0].tolist() == full.kpi("loss")[0].tolist()


class _TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.t, self.b, self.c = nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3), nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return self.b(self.t(self.a(x))) + self.c(z)


def _train_two_inputs(folder, detail):
    torch.manual_seed(0)
    model, criterion = _TwoInputs(), nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    with NeuralDbg(model, folder, trial="t", optimizer=optimizer, loss=criterion, detail=detail, snapshots=None):
        for _ in range(STEPS):
            x, z, y = torch.randn(32, 6, generator=g), torch.randn(32, 4, generator=g), torch.randint(0, 3, (32,),
                                                                                                      generator=g)
            optimizer.zero_grad()
            criterion(model(x, z), y).backward()
            optimizer.step()
    return open_recording(folder / "t")


def test_a_sentinel_step_hands_on_its_collected_rows_with_the_rows_a_full_recording_has(tmp_path, monkeypatch):
    """The usual sentinel step writes the reducer's collected rows as they are (inputs, values, gradients), with
    the series in that order: every row, two inputs' included, equals a full recording's."""
    from comgra_ndbg.recorder.sentinel_steps import SentinelSteps
    from comgra_ndbg.stats.reducer import Reducer

    collected, handed = [], []
    collect, rows_of = Reducer.collect, SentinelSteps._sentinel_rows
    monkeypatch.setattr(Reducer, "collect", lambda self: collected.append(collect(self)) or collected[-1])
    monkeypatch.setattr(SentinelSteps, "_sentinel_rows",
                        lambda self, step: handed.append((rows_of(self, step), collected[-1])) or handed[-1][0])
    tiered = _train_two_inputs(tmp_path / "tiered", QUIET)
    monkeypatch.undo()
    full = _train_two_inputs(tmp_path / "full", "full")
    with tiered, full:
        sentinels = sorted(set(range(STEPS)) - set(tiered.summary_rows("model.a", "value")[0].tolist()))
        assert len(handed) == len(sentinels) > 20
        assert all(sentinel.rows.data is rows for sentinel, rows in handed)  # no copy, no reordering
        for name in ("a.weight", "a.bias", "b.weight", "b.bias", "c.weight", "c.bias"):
            for kind in ("value", "grad"):
                rows, full_rows = tiered.summary_rows(f"model.{name}", kind)[1], full.summary_rows(f"model.{name}",
                                                                                                   kind)[1]
                # the same statistics; a float32 sum's last bit may differ where the CPU's vectorisation of the
                # kernel that also copies the values (the full steps') differs from the one that does not
                np.testing.assert_allclose(rows[sentinels], full_rows[sentinels], rtol=1e-6, atol=0,
                                           err_msg=f"{name} {kind}")
        for name in ("input[0]", "input[1]"):
            steps, rows = tiered.summary_rows(name, "value")
            assert steps.tolist() == list(range(STEPS))
            np.testing.assert_array_equal(rows, full.summary_rows(name, "value")[1], err_msg=name)

"""Defects an independent fuzz of the public API found, one test each (real recorders, real files): malformed
``bounds`` that destroyed the whole recording, tiny float32 values whose Σx² underflowed, a meta-device
parameter that cost the other tensors their rows, a parameter replaced mid-run recorded from the old tensor,
a closed recording that answered with empty arrays, untyped errors, a ``range`` policy built element by
element, and a NaN input from the first step blamed on the architecture."""
from __future__ import annotations

import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from comgra_ndbg import NeuralDbg, Recorder, open_recording
from comgra_ndbg.analysis.api import analyze
from comgra_ndbg.errors import InvalidArgumentError, RecorderStateError
from comgra_ndbg.recorder.policy import as_policy
from comgra_ndbg.store import schema


def _quietly() -> warnings.catch_warnings:
    manager = warnings.catch_warnings()
    manager.__enter__()
    warnings.simplefilter("ignore")
    return manager


@pytest.mark.parametrize("bounds", [5, (1.0,), ("a", "b"), (1.0, 0.0), (0.5, 0.5), (0.0, float("nan")),
                                    (0.0, float("inf")), "bogus", (True, 2)])
def test_malformed_bounds_are_refused_at_the_call_and_the_recording_keeps_every_step(tmp_path: Path,
                                                                                       bounds: object) -> None:
    """``bounds=5`` was accepted, the tensor skipped with a warning, and the bad value kept in the catalog
    failed every later write: close() lost all three steps, every tensor and KPI with them."""
    with Recorder(tmp_path, trial="t") as rec:
        for step in range(3):
            rec.start_step(step)
            rec.register_tensor("good", torch.randn(8, 4), role="input")
            with pytest.raises(InvalidArgumentError, match="bounds of 'act'"):
                rec.register_tensor("act", torch.rand(8, 4), bounds=bounds)
            rec.record_kpi("loss", 1.0 / (step + 1))
            rec.finish_step()
    with open_recording(tmp_path, "t") as recording:
        assert recording.steps.tolist() == [0, 1, 2]
        assert recording.summary("good", "value", "count")[0].tolist() == [0, 1, 2]
        assert recording.kpi("loss")[1].tolist() == [1.0, 0.5, pytest.approx(1 / 3)]


def test_bounds_as_a_list_are_a_pair_and_give_the_rows_and_snapshots_of_the_tuple(tmp_path: Path) -> None:
    x = torch.rand(8, 4)
    with Recorder(tmp_path, trial="t", snapshots=1) as rec:
        rec.start_step(0)
        rec.register_tensor("as_list", x, bounds=[0, 1])
        rec.register_tensor("as_tuple", x, bounds=(0.0, 1.0))
        rec.finish_step()
    with open_recording(tmp_path, "t") as recording:
        for stat in ("saturated_fraction", "mean", "rms"):
            assert recording.summary("as_list", "value", stat)[1] == recording.summary("as_tuple", "value", stat)[1]
        assert list(recording.snapshot_steps("as_list", "value")) == list(recording.snapshot_steps("as_tuple", "value")) == [0]


@pytest.mark.parametrize("scale", [1e-20, 1e-24, 1e-30])
def test_tiny_float32_values_are_recorded_with_their_rms(tmp_path: Path, scale: float) -> None:
    """The float32 squares of a vanishing gradient of 1e-24 underflow: its rms, std and l2 read 0."""
    x = scale * torch.randn(64, 32, generator=torch.Generator().manual_seed(0))
    with Recorder(tmp_path, trial="t") as rec:
        rec.start_step(0)
        rec.register_tensor("x", x)
        rec.finish_step()
    with open_recording(tmp_path, "t") as recording:
        for stat, expected in (("rms", x.double().pow(2).mean().sqrt()), ("std", x.double().std(unbiased=False)),
                               ("l2", x.double().norm())):
            assert recording.summary("x", "value", stat)[1][0] == pytest.approx(float(expected), rel=1e-6, abs=0)


def test_a_meta_parameter_is_left_out_alone_and_logged(tmp_path: Path) -> None:
    """A tracked module with a parameter on the meta device failed every step's parameter pass, and step 0
    lost the other tensors' rows with it."""
    healthy = nn.Linear(4, 4)
    model = nn.ModuleDict({"healthy": healthy, "lazy": nn.Linear(4, 4, device="meta")})
    manager = _quietly()
    try:
        with Recorder(tmp_path, trial="t") as rec:
            rec.track_module("model", model)
            for step in range(3):
                rec.start_step(step)
                x = torch.randn(2, 4)
                rec.register_tensor("input", x, role="input")
                rec.register_tensor("out", healthy(x))
                rec.finish_step()
    finally:
        manager.__exit__(None, None, None)
    with open_recording(tmp_path, "t") as recording:
        assert recording.summary("input", "value", "count")[0].tolist() == [0, 1, 2]
        assert recording.summary("model.healthy.weight", "value", "count")[0].tolist() == [0, 1, 2]
        assert "model.lazy.weight" not in [t.name for t in recording.tensors]
        skipped = {p.subject for p in recording.problems() if p.category == schema.PROBLEM_SKIPPED_TENSOR}
        assert skipped == {"model.lazy.weight", "model.lazy.bias"}


@pytest.mark.parametrize("detail", ["full", "tiered"])
def test_a_parameter_replaced_mid_run_is_recorded_from_the_new_tensor(tmp_path: Path, detail: str) -> None:
    """``model[2].weight = nn.Parameter(...)`` (a head re-initialised): the recording kept the old object,
    values frozen, gradients and updates gone, without a word."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    values, grads = [], []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with NeuralDbg(model, tmp_path, trial="t", optimizer=optimizer, detail=detail) as dbg:
            for step in range(60):
                if step == 40:
                    model[2].weight = nn.Parameter(torch.full((2, 8), 3.0))
                    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
                values.append(model[2].weight.detach().double().pow(2).mean().sqrt().item())
                optimizer.zero_grad()
                F.cross_entropy(model(torch.randn(6, 4)), torch.randint(0, 2, (6,))).backward()
                grads.append(model[2].weight.grad.double().pow(2).mean().sqrt().item())
                optimizer.step()
    messages = [str(w.message) for w in caught]
    assert any("'model.2.weight' was assigned a new tensor before step 40" in m for m in messages)
    assert not any("invariant" in m.lower() or "loop" in m.lower() for m in messages), messages
    with open_recording(dbg.path) as recording:
        steps, recorded = recording.summary("model.2.parameters", "value", "rms", tensor="model.2.weight")
        assert steps.tolist() == list(range(60))
        np.testing.assert_allclose(recorded, values, rtol=1e-6)
        steps, recorded = recording.summary("model.2.parameters", "grad", "rms", tensor="model.2.weight")
        assert steps.tolist() == list(range(60))
        np.testing.assert_allclose(recorded, grads, rtol=1e-6)
        assert [(e.step, e.subject) for e in recording.log(schema.LOG_REPLACED)] == [(40, "model.2.weight")]
        assert recording.log("invariant") == []


def test_a_parameter_added_to_a_tracked_module_is_logged_as_not_recorded(tmp_path: Path) -> None:
    model = nn.Linear(3, 3)
    manager = _quietly()
    try:
        with Recorder(tmp_path, trial="t") as rec:
            rec.track_module("m", model)
            for step in range(3):
                if step == 1:
                    model.scale = nn.Parameter(torch.ones(3))
                rec.start_step(step)
                rec.register_tensor("x", torch.randn(2, 3))
                rec.finish_step()
    finally:
        manager.__exit__(None, None, None)
    with open_recording(tmp_path, "t") as recording:
        [entry] = recording.log(schema.LOG_REPLACED)
        assert (entry.step, entry.subject) == (1, "m.scale") and "not recorded" in entry.message
        assert recording.summary("m.weight", "value", "count")[0].tolist() == [0, 1, 2]


def test_a_closed_recording_refuses_reads_instead_of_answering_with_nothing(tmp_path: Path) -> None:
    with Recorder(tmp_path, trial="t") as rec:
        for step in range(3):
            rec.start_step(step)
            rec.register_tensor("x", torch.full((4, 3), float(step)), role="input")
            rec.record_kpi("loss", float(step))
            rec.finish_step()
    with open_recording(tmp_path, "t") as recording:
        assert recording.summary("x", "value", "mean")[1].tolist() == [0.0, 1.0, 2.0]
    for read in (lambda: recording.summary("x", "value", "mean"), lambda: recording.kpi("loss"),
                 lambda: recording.snapshot_steps("x"), recording.refresh):
        with pytest.raises(RecorderStateError, match="was closed"):
            read()
    assert repr(recording) == "Recording(trial='t', closed)"
    recording.close()  # twice: nothing more happens


@pytest.mark.parametrize("modules", [5, 3.5, nn.Linear(2, 2)])
def test_modules_of_the_wrong_type_get_a_typed_error(tmp_path: Path, modules: object) -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    with pytest.raises(InvalidArgumentError, match="modules= takes"):
        NeuralDbg(model, tmp_path, trial="t", modules=modules)


def test_a_range_policy_is_kept_as_a_range() -> None:
    """``snapshots=range(0, 10**9, 200)`` was a frozenset of five million steps: seconds and 380 MiB at
    construction, and a longer range a raw MemoryError."""
    began = time.perf_counter()
    policy = as_policy(range(0, 2**62, 1000), name="snapshots")
    assert time.perf_counter() - began < 0.1
    assert policy.could_record(10**15) and not policy.could_record(10**15 + 1)
    assert repr(policy) == "StepList(range(0, 4611686018427387904, 1000))"
    assert [s for s in range(40) if as_policy(range(30, 5, -10), name="snapshots").could_record(s)] == [10, 20, 30]
    with pytest.raises(Exception, match="negative"):
        as_policy(range(-10, 10, 5), name="snapshots")


def test_a_nan_input_from_the_first_step_is_blamed_on_the_data(tmp_path: Path) -> None:
    torch.manual_seed(0)
    with Recorder(tmp_path, trial="t") as rec:
        for step in range(60):
            rec.start_step(step)
            x = torch.randn(8, 3)
            x[0, 0] = float("nan")
            rec.register_tensor("x", x, role="input")
            h = torch.tanh(x @ torch.ones(3, 4))
            rec.register_tensor("h", h)
            loss = h.pow(2).mean()
            rec.register_tensor("loss", loss, role="loss")
            rec.record_kpi("loss", loss)
            rec.finish_step()
    top = analyze(tmp_path / "t", store=False).hypotheses[0]
    assert (top.type, top.origin, top.node) == ("nonfinite_data", "data", "x")

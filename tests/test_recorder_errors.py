"""Wrong calls to the Recorder: each raises a typed error whose message says what to do.

Also what is *not* an error: a tensor changing shape between steps, and NaN/Inf values.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from comgra_ndbg import (ComgraError, DuplicateTensorError, InvalidArgumentError, InvalidTensorError, Recorder,
                         RecorderStateError, RecorderWarning, RecordingExistsError, open_recording)
from comgra_ndbg.store.results import write_results


@pytest.fixture
def rec(tmp_path: Path) -> Recorder:
    recorder = Recorder(tmp_path, trial="t")
    yield recorder
    recorder.close()


@pytest.fixture
def in_step(rec: Recorder) -> Recorder:
    rec.start_step(0)
    return rec


# ---- non-tensors ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [[1.0, 2.0], np.ones(3), None, 3.5], ids=["list", "numpy", "None", "float"])
def test_a_non_tensor_is_refused_with_the_fix(in_step: Recorder, value: object) -> None:
    with pytest.raises(InvalidTensorError, match=r"needs a torch\.Tensor.*torch\.as_tensor") as info:
        in_step.register_tensor("x", value)
    assert "'x'" in str(info.value) and type(value).__name__ in str(info.value)
    assert isinstance(info.value, TypeError) and isinstance(info.value, ComgraError)
    in_step.register_tensor("x", torch.ones(2))  # the failed call did not take the name


# ---- call order ---------------------------------------------------------------------------------------------------
def test_register_outside_a_step(rec: Recorder) -> None:
    with pytest.raises(RecorderStateError, match=r"register_tensor\('x'\) outside a step; call start_step"):
        rec.register_tensor("x", torch.ones(2))
    with rec.step(0):
        pass
    with pytest.raises(RecorderStateError, match="start_step"):  # between steps as well
        rec.register_tensor("x", torch.ones(2))


def test_finish_step_without_start(rec: Recorder) -> None:
    with pytest.raises(RecorderStateError, match=r"finish_step\(\) without start_step\(\).*start_step\(step\)"):
        rec.finish_step()


def test_start_step_while_a_step_is_open(in_step: Recorder) -> None:
    with pytest.raises(RecorderStateError, match=r"start_step\(1\) while step 0 is still open.*finish_step\(\)"):
        in_step.start_step(1)
    assert in_step.current_step == 0


def test_the_same_step_number_twice(rec: Recorder) -> None:
    with rec.step(3):
        pass
    with pytest.raises(RecorderStateError, match=r"step 3 was already started.*unique.*global step counter"):
        rec.start_step(3)
    with rec.step(4):  # the recorder carries on
        rec.register_tensor("x", torch.ones(1))


def test_the_same_name_twice_in_one_iteration(in_step: Recorder) -> None:
    in_step.register_tensor("x", torch.ones(2))
    with pytest.raises(DuplicateTensorError, match=r"'x' was already registered in iteration 0 of step 0.*"
                                                   r"own name.*start_iteration\(\)") as info:
        in_step.register_tensor("x", torch.zeros(2))
    assert isinstance(info.value, ValueError)


def test_the_same_name_in_two_iterations_is_fine(tmp_path: Path) -> None:
    with Recorder(tmp_path, trial="t") as rec:
        with rec.step(0):
            for k in range(2):
                rec.start_iteration()
                rec.register_tensor("h", torch.full((2,), float(k)))
                rec.finish_iteration()
    with open_recording(tmp_path, "t") as recording:
        assert recording.summary("h", iteration=1)[1].tolist() == [1.0]


def test_duplicates_are_refused_on_skipped_steps_too(tmp_path: Path) -> None:
    with Recorder(tmp_path, trial="t", summaries=[0], snapshots=None) as rec:
        with rec.step(0):
            rec.register_tensor("x", torch.ones(2))
        rec.start_step(1)
        assert not rec.is_recording
        rec.register_tensor("x", torch.ones(2))
        with pytest.raises(DuplicateTensorError, match="'x'"):
            rec.register_tensor("x", torch.ones(2))
        with pytest.raises(InvalidTensorError):
            rec.register_tensor("y", [1, 2])
        rec.finish_step()


# ---- bad values ---------------------------------------------------------------------------------------------------
def test_unknown_role_lists_the_roles(in_step: Recorder) -> None:
    with pytest.raises(InvalidArgumentError, match=r"role of 'x' must be one of \[.*'input'.*'intermediate'.*"
                                                   r"got 'activation'"):
        in_step.register_tensor("x", torch.ones(2), role="activation")


@pytest.mark.parametrize("name", ["", None, 5], ids=["empty", "None", "int"])
def test_bad_names(in_step: Recorder, name: object) -> None:
    with pytest.raises(InvalidArgumentError, match="names must be non-empty strings"):
        in_step.register_tensor(name, torch.ones(2))


def test_an_unhashable_name_is_a_typed_error_too(in_step: Recorder) -> None:
    with pytest.raises(InvalidArgumentError, match="non-empty strings"):
        in_step.register_tensor(["x"], torch.ones(2))


@pytest.mark.parametrize("step", [-1, True, False, 1.0, "3", None])
def test_bad_step_numbers(rec: Recorder, step: object) -> None:
    with pytest.raises(InvalidArgumentError, match=r"step must be a non-negative int, got"):
        rec.start_step(step)
    assert rec.current_step is None
    rec.start_step(7)  # nothing was left half-open
    assert rec.current_step == 7


def test_numpy_integer_steps_are_accepted(tmp_path: Path) -> None:
    with Recorder(tmp_path, trial="t") as rec:
        with rec.step(np.int64(5)):
            rec.register_tensor("x", torch.ones(1))
    with open_recording(tmp_path, "t") as recording:
        assert recording.steps.tolist() == [5]


@pytest.mark.parametrize("step_type", ["", 3])
def test_bad_step_type(rec: Recorder, step_type: object) -> None:
    with pytest.raises(InvalidArgumentError, match="step_type must be a non-empty str"):
        rec.start_step(0, step_type)
    assert rec.current_step is None
    rec.start_step(0, "train")  # the refused call did not use up the step number


def test_a_name_reregistered_with_another_role(tmp_path: Path) -> None:
    with Recorder(tmp_path, trial="t") as rec:
        with rec.step(0):
            rec.register_tensor("x", torch.ones(2), role="input")
        with rec.step(1):
            with pytest.raises(InvalidArgumentError, match=r"'x' was first registered with role 'input'.*now with "
                                                           r"role 'output'.*keep one role"):
                rec.register_tensor("x", torch.ones(2), role="output")
            rec.register_tensor("y", torch.ones(2))
        with rec.step(2):
            with pytest.raises(InvalidArgumentError, match="node 'other'"):
                rec.register_tensor("x", torch.ones(2), role="input", node="other")
    with open_recording(tmp_path, "t") as recording:
        assert recording.roles["x"] == "input"
        assert recording.summary("x")[0].tolist() == [0]
        assert recording.summary("y")[0].tolist() == [1]


def test_kpi_values(in_step: Recorder) -> None:
    with pytest.raises(InvalidTensorError, match=r"KPI 'loss' must be a scalar, got a tensor of shape \(2, 3\).*"
                                                 r"\.mean\(\)"):
        in_step.record_kpi("loss", torch.ones(2, 3))
    for value in ("0.5", None, [1.0], True):
        with pytest.raises(InvalidTensorError, match="KPI 'loss' must be a number or a one-element tensor"):
            in_step.record_kpi("loss", value)
    with pytest.raises(InvalidArgumentError, match="non-empty"):
        in_step.record_kpi("", 1.0)
    in_step.record_kpi("loss", torch.ones(1, 1))  # one element is fine


def test_record_kpi_before_any_step(rec: Recorder) -> None:
    with pytest.raises(RecorderStateError, match=r"record_kpi\('loss'\) before any step; call start_step"):
        rec.record_kpi("loss", 1.0)


def test_a_note_must_be_text(rec: Recorder) -> None:
    with pytest.raises(InvalidArgumentError, match="a note must be a str"):
        rec.add_note(42)


# ---- closed recorder and existing trials ----------------------------------------------------------------------
def test_calls_on_a_closed_recorder(tmp_path: Path) -> None:
    rec = Recorder(tmp_path, trial="t")
    with rec.step(0):
        pass
    rec.close()
    calls = {
        "start_step": lambda: rec.start_step(1),
        "finish_step": rec.finish_step,
        "register_tensor": lambda: rec.register_tensor("x", torch.ones(1)),
        "record_kpi": lambda: rec.record_kpi("loss", 1.0),
        "record_gradients": rec.record_gradients,
        "track_module": lambda: rec.track_module("m", nn.Linear(1, 1)),
        "add_note": lambda: rec.add_note("late"),
        "start_iteration": rec.start_iteration,
    }
    for call, fn in calls.items():
        with pytest.raises(RecorderStateError, match=r"on a closed recorder; create a new Recorder") as info:
            fn()
        assert call.split("_")[0] in str(info.value), call
    rec.close()
    rec.flush()


def test_an_existing_trial_is_kept_unless_overwrite_is_asked_for(tmp_path: Path) -> None:
    """Replacing a trial's steps needs an explicit overwrite=True: mode='w' alone once deleted a killed run."""
    with Recorder(tmp_path, trial="t") as rec:
        for step in range(3):
            with rec.step(step):
                rec.register_tensor("old", torch.ones(1))
    for mode in ("w-", "w"):
        with pytest.raises(RecordingExistsError, match=r"trial 't' already has a recording.*mode='a' to continue "
                                                       r"it.*overwrite=True to delete it") as info:
            Recorder(tmp_path, trial="t", mode=mode)
        assert isinstance(info.value, FileExistsError)
    with open_recording(tmp_path, "t") as recording:
        assert recording.steps.tolist() == [0, 1, 2]
    with Recorder(tmp_path, trial="t", mode="w", overwrite=True) as rec:
        with rec.step(10):
            rec.register_tensor("new", torch.zeros(1))
    with open_recording(tmp_path, "t") as recording:
        assert recording.steps.tolist() == [10]
        assert [t.name for t in recording.tensors] == ["new"]


@pytest.mark.parametrize("trial", ["..", ".", "a/b", "/tmp", "x\\y", "  ", 5])
def test_a_trial_must_name_one_folder_inside_the_group(tmp_path: Path, trial: object) -> None:
    group = tmp_path / "group"
    group.mkdir()
    (group / "notes.txt").write_text("mine")
    for mode in ("w-", "w"):
        with pytest.raises(InvalidArgumentError, match="trial"):
            Recorder(group, trial=trial, mode=mode)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["group", "notes.txt"]


def test_mode_w_replaces_only_a_recording(tmp_path: Path) -> None:
    """A trial folder holding anything but the files of a recording is never deleted, even with mode='w'."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("print('mine')")
    with pytest.raises(RecordingExistsError, match=r"not part of a recording \(train.py\).*nothing was deleted"):
        Recorder(tmp_path, trial="src", mode="w")
    assert (tmp_path / "src" / "train.py").read_text() == "print('mine')"
    with Recorder(tmp_path, trial="t") as rec:
        with rec.step(0):
            rec.register_tensor("x", torch.ones(1))
    write_results(tmp_path / "t", {}, num_steps=1, last_step=0)
    (tmp_path / "t" / "seg-00000007-L0.h5.tmp").write_bytes(b"left by a killed process")
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == ["analysis.json", "recording.h5",
                                                                  "seg-00000007-L0.h5.tmp"]
    with Recorder(tmp_path, trial="t", mode="w", overwrite=True) as rec:
        with rec.step(5):
            rec.register_tensor("y", torch.ones(1))
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == ["recording.h5"]


def test_a_file_where_the_group_folder_should_be(tmp_path: Path) -> None:
    (tmp_path / "runs").write_text("not a folder")
    with pytest.raises(InvalidArgumentError, match=r"runs is a file, not a folder"):
        Recorder(tmp_path / "runs", trial="t")
    (tmp_path / "group").mkdir()
    (tmp_path / "group" / "t").write_text("not a folder")
    with pytest.raises(InvalidArgumentError, match=r"t is a file, not a folder"):
        Recorder(tmp_path / "group", trial="t", mode="w")
    assert (tmp_path / "group" / "t").read_text() == "not a folder"


def test_another_trial_in_the_same_group_is_fine(tmp_path: Path) -> None:
    for trial in ("a", "b"):
        with Recorder(tmp_path, trial=trial) as rec:
            with rec.step(0):
                rec.register_tensor("x", torch.ones(1))
    with open_recording(tmp_path, "a") as recording:
        assert recording.trials == ["a", "b"]


@pytest.mark.parametrize("kwargs, words", [
    (dict(num_samples=-1), "num_samples must be an int >= 0"),
    (dict(max_elements=0), "max_elements must be an int >= 1"),
    (dict(num_samples=2.5), "num_samples must be an int"),
    (dict(saturation_margin=0.5), r"saturation_margin must be in \[0, 0.5\)"),
])
def test_bad_constructor_arguments(tmp_path: Path, kwargs: dict, words: str) -> None:
    with pytest.raises(InvalidArgumentError, match=words):
        Recorder(tmp_path, trial="t", **kwargs)
    assert not (tmp_path / "t").exists()


# ---- modules, gradients, iterations -------------------------------------------------------------------------
def test_track_module_errors(rec: Recorder) -> None:
    with pytest.raises(InvalidTensorError, match=r"track_module\('m', \.\.\.\) needs a torch\.nn\.Module, got dict"):
        rec.track_module("m", {"weight": torch.ones(1)})
    rec.track_module("m", nn.Linear(2, 2))
    with pytest.raises(InvalidArgumentError, match=r"already tracked as 'm'; give each module its own name"):
        rec.track_module("m", nn.Linear(2, 2))
    with pytest.raises(InvalidArgumentError, match="non-empty"):
        rec.track_module("", nn.Linear(2, 2))
    rec.start_step(0)
    with pytest.raises(RecorderStateError, match=r"track_module\('n'\) was called inside step 0; call it before"):
        rec.track_module("n", nn.Linear(2, 2))


def test_record_gradients_twice_with_the_same_set(in_step: Recorder) -> None:
    in_step.record_gradients("aux")
    with pytest.raises(DuplicateTensorError, match=r"gradient set 'grad:aux' was already recorded in step 0.*"
                                                   r"gradient_set name"):
        in_step.record_gradients("aux")
    in_step.record_gradients()
    with pytest.raises(DuplicateTensorError, match="'grad'"):
        in_step.record_gradients(None)


def test_record_gradients_outside_a_step(rec: Recorder) -> None:
    with pytest.raises(RecorderStateError, match=r"record_gradients\(\) outside a step; call start_step"):
        rec.record_gradients()


def test_iteration_call_order(in_step: Recorder) -> None:
    with pytest.raises(RecorderStateError, match=r"finish_iteration\(\) without start_iteration\(\) in step 0"):
        in_step.finish_iteration()
    assert in_step.start_iteration() == 0
    with pytest.raises(RecorderStateError, match=r"start_iteration\(\) while iteration 0 of step 0 is open; "
                                                 r"call finish_iteration\(\) first"):
        in_step.start_iteration()
    in_step.finish_iteration()
    assert in_step.start_iteration() == 1


def test_iterations_outside_a_step(rec: Recorder) -> None:
    with pytest.raises(RecorderStateError, match=r"start_iteration outside a step; call start_step"):
        rec.start_iteration()
    with pytest.raises(RecorderStateError, match=r"finish_iteration outside a step"):
        rec.finish_iteration()


def test_an_error_leaves_the_step_usable(tmp_path: Path) -> None:
    with Recorder(tmp_path, trial="t") as rec:
        with rec.step(0):
            rec.register_tensor("x", torch.full((2,), 2.0))
            for bad in (lambda: rec.register_tensor("x", torch.ones(2)),
                        lambda: rec.register_tensor("y", "text"),
                        lambda: rec.register_tensor("y", torch.ones(2), role="nope"),
                        lambda: rec.record_kpi("k", torch.ones(3))):
                with pytest.raises(ComgraError):
                    bad()
            rec.register_tensor("y", torch.full((3,), 5.0))
            rec.record_kpi("k", 1.0)
    with open_recording(tmp_path, "t") as recording:
        assert recording.summary("x")[1].tolist() == [2.0]
        assert recording.summary("y")[1].tolist() == [5.0]
        assert recording.kpi("k")[1].tolist() == [1.0]


# ---- not errors -----------------------------------------------------------------------------------------------
def test_shape_change_between_steps_is_recorded_faithfully(tmp_path: Path) -> None:
    """Variable sequence lengths are common: a tensor may change shape from one step to the next."""
    g = torch.Generator().manual_seed(0)
    sequences = {0: torch.randn(4, 3, 8, generator=g), 1: torch.randn(4, 5, 8, generator=g),
                 2: torch.randn(2, 5, 8, generator=g)}
    with warnings.catch_warnings():
        warnings.simplefilter("error", RecorderWarning)
        with Recorder(tmp_path, trial="t", snapshots=1, num_samples=8) as rec:
            for step, seq in sequences.items():
                with rec.step(step):
                    rec.register_tensor("seq", seq, role="input")
    with open_recording(tmp_path, "t") as recording:
        for step, seq in sequences.items():
            snap = recording.snapshot(step, "seq")
            assert snap.shape == tuple(seq.shape)
            np.testing.assert_array_equal(snap.dense(), seq.numpy())
            assert len(snap.sample_index) == seq.shape[0]
        assert recording.summary("seq", "value", "count")[1].tolist() == [96.0, 160.0, 80.0]
        rows = recording.summary_rows("seq")[1]
        from comgra_ndbg.store.schema import FIELD
        assert rows[:, FIELD["units"]].tolist() == [24.0, 40.0, 40.0]
        np.testing.assert_allclose(recording.summary("seq", "value", "mean")[1],
                                   [s.double().mean().item() for s in sequences.values()], rtol=1e-6,
                                   atol=1e-6)  # float32 sums: a mean near 0 is off by ~eps32 x mean |x|


def test_nan_and_inf_values_are_recorded_not_raised(tmp_path: Path) -> None:
    x = torch.tensor([[float("nan"), 1.0, float("inf")], [float("-inf"), 0.0, 2.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error", RecorderWarning)
        with Recorder(tmp_path, trial="t", snapshots=1) as rec:
            with rec.step(0):
                assert rec.register_tensor("x", x) is x
                rec.register_tensor("all_nan", torch.full((3,), float("nan")))
                rec.record_kpi("loss", float("inf"))
                rec.record_kpi("loss_tensor", torch.tensor(float("nan")))
    with open_recording(tmp_path, "t") as recording:
        assert recording.summary("x", "value", "nan")[1].tolist() == [1.0]
        assert recording.summary("x", "value", "inf")[1].tolist() == [2.0]
        assert recording.summary("x", "value", "mean")[1].tolist() == [1.0]
        assert recording.summary("all_nan", "value", "nan")[1].tolist() == [3.0]
        assert np.isnan(recording.summary("all_nan", "value", "mean")[1][0])
        assert np.isposinf(recording.kpi("loss")[1][0]) and np.isnan(recording.kpi("loss_tensor")[1][0])

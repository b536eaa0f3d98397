"""One test per defect of the integrity issue ("nothing lost, nothing silent"), each failing before its fix.

The numbers follow the issue: 1 flight-recorder triggers, 2 a tensor that cannot be summarised, 3 input that
destroyed the recording at close, 4 NeuralDbg on a frozen model, 5 silent or raw damage, 6 snapshot shapes of
rank >= 9, 7 untyped errors and values lost to float32, 8 a full disk, 9 overwriting, resuming and the
writer's state. The storage faults themselves are exercised more widely in ``test_storage_faults.py``.
"""
from __future__ import annotations

import gc
import os
import re
import warnings
import weakref
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from torch import nn

from comgra_ndbg import (CorruptRecordingError, InvalidArgumentError, NeuralDbg, Recorder, RecorderWarning,
                         RecordingExistsError, check, open_recording)
from comgra_ndbg.cli import main
from comgra_ndbg.recorder.flight import FlightRecorder, LossSpike, NonFinite
from comgra_ndbg.stats.reducer import Reducer
from comgra_ndbg.store import schema
from comgra_ndbg.store.catalog import Catalog
from recording_faults import chunk_offset, files_of, flip_byte, record, record_and_die


def recorder_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, RecorderWarning)]


# ---- 1. triggers are independent --------------------------------------------------------------------------------
def test_1_the_nonfinite_trigger_fires_at_the_first_nan_while_a_loss_spike_still_holds(tmp_path: Path) -> None:
    """The README's triggers: the loss jumps at step 12 and stays high, the first NaN comes at step 20. The loss
    spike firing first must not keep the non-finite trigger from firing (it once held every trigger)."""
    losses = [1.0] * 12 + [50.0 * 2 ** k for k in range(8)] + [float("nan")] * 4
    flight = FlightRecorder(steps=3, after=2, triggers=[NonFinite(), LossSpike(factor=10, window=8, min_history=4)])
    with Recorder(tmp_path, trial="t", summaries=None, snapshots=None, flight_recorder=flight) as rec:
        for step, loss in enumerate(losses):
            with rec.step(step):
                rec.register_tensor("h", torch.full((4, 2), loss))
                rec.record_kpi("loss", loss)
    with open_recording(tmp_path) as recording:
        marks = [(t.step, t.reason.split(" ")[0]) for t in recording.triggers]
        assert (12, "loss") in marks
        assert (20, "non-finite") in marks  # the first NaN, caught although the spike still held
        assert {17, 18, 19, 20} <= set(recording.steps.tolist())  # the ring before the NaN is in the file


# ---- 2. one bad tensor is skipped alone -------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [torch.ones(4, 3, device="meta"),
                                 torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])],
                         ids=["meta", "nested"])
def test_2_a_tensor_that_cannot_be_summarised_is_skipped_alone_counted_and_reported(tmp_path: Path,
                                                                                   bad: torch.Tensor) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Recorder(tmp_path, trial="t", snapshots=2) as rec:
            for step in range(6):
                with rec.step(step):
                    rec.register_tensor("good", torch.full((4, 3), float(step)))
                    rec.register_tensor("bad", bad)
                    rec.register_tensor("later", torch.full((4, 3), -float(step)))
    with open_recording(tmp_path) as recording:
        assert recording.steps.tolist() == list(range(6))  # nothing else was lost, at any step
        assert recording.summary("good", stat="mean")[1].tolist() == [0, 1, 2, 3, 4, 5]
        assert recording.summary("later", stat="mean")[1].tolist() == [0, -1, -2, -3, -4, -5]
        assert recording.snapshot_steps("later").tolist() == [0, 2, 4]
        problems = recording.problems()
        assert [(p.step, p.category, p.subject) for p in problems] == [
            (step, schema.PROBLEM_SKIPPED_TENSOR, "bad") for step in range(6)]
    messages = recorder_warnings(caught)
    assert len(messages) == 2 and "'bad' (value) was skipped at step 0" in messages[0]
    assert "'bad' (skipped_tensor) 6 times, steps 0–5" in messages[1]  # counted per tensor, never hidden


def test_2_a_reducer_whose_host_copy_fails_loses_that_row_only_and_stays_usable() -> None:
    reducer = Reducer()
    reducer.add(torch.ones(3, device="meta"))  # queued on the device; its values cannot reach the host
    good = reducer.add(torch.arange(4.0))
    rows = reducer.collect()
    assert list(reducer.failed) == [0] and "meta" in reducer.failed[0]
    assert rows[0, schema.FIELD["count"]] == 0 and rows[good, schema.FIELD["sum"]] == 6.0
    reducer.add(torch.ones(2))  # the next step's rows are unaffected by the failure
    assert reducer.collect()[0, schema.FIELD["sum"]] == 2.0 and not reducer.failed


# ---- 3. input the file cannot hold is refused at the call ----------------------------------------------------
NUL = "a\0b"


@pytest.mark.parametrize("call", ["note", "tensor name", "node", "kpi", "step type", "gradient set", "module",
                                  "decided type", "sample category"])
def test_3_a_nul_character_is_refused_at_the_call_and_the_recording_survives(tmp_path: Path, call: str) -> None:
    rec = Recorder(tmp_path, trial="t", summaries=1, snapshots=1)
    for step in range(3):
        if step == 1 and call == "step type":
            with pytest.raises(InvalidArgumentError, match="NUL"):
                rec.start_step(step, NUL)
        rec.start_step(step, None if call in ("decided type", "sample category") else "train")
        x = rec.register_tensor("x", torch.full((2, 2), float(step), requires_grad=True))
        if step == 1:
            with pytest.raises(InvalidArgumentError, match="NUL"):
                {"note": lambda: rec.add_note(NUL),
                 "tensor name": lambda: rec.register_tensor(NUL, torch.ones(2)),
                 "node": lambda: rec.register_tensor("y", torch.ones(2), node=NUL),
                 "kpi": lambda: rec.record_kpi(NUL, 1.0),
                 "step type": lambda: rec.add_note(NUL),  # refused above, before the step began
                 "gradient set": lambda: rec.record_gradients(NUL),
                 "module": lambda: rec.track_module(NUL, nn.Linear(1, 1)),
                 "decided type": lambda: rec.decide_step(NUL),
                 "sample category": lambda: rec.decide_step("a", sample_categories=["ok", NUL]),
                 }[call]()
        x.sum().backward()
        if rec.current_step is not None and rec._step_type is None:
            rec.decide_step("train")
        rec.finish_step()
    rec.close()
    with open_recording(tmp_path) as recording:
        assert recording.is_complete and recording.steps.tolist() == [0, 1, 2]
        assert recording.summary("x", stat="mean")[1].tolist() == [0.0, 1.0, 2.0]


def test_3_a_step_beyond_int64_is_refused_at_the_call_and_the_recording_survives(tmp_path: Path) -> None:
    with Recorder(tmp_path, trial="t") as rec:
        with rec.step(0):
            rec.register_tensor("x", torch.ones(2))
        with pytest.raises(InvalidArgumentError, match=r"does not fit the recording's int64 step numbers"):
            rec.start_step(2**63)
        with rec.step(2**63 - 1):
            rec.register_tensor("x", torch.ones(2))
    with open_recording(tmp_path) as recording:
        assert recording.steps.tolist() == [0, 2**63 - 1]


# ---- 4. NeuralDbg on a model without trainable parameters ---------------------------------------------------------
def test_4_a_frozen_backbone_records_one_step_per_training_pass_and_keeps_nothing_alive(tmp_path: Path) -> None:
    torch.manual_seed(0)
    backbone = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 4))
    backbone.requires_grad_(False)
    head = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(head.parameters(), lr=0.1)
    inputs = []
    with NeuralDbg(backbone, tmp_path, trial="t", snapshots=None) as dbg:
        for _ in range(12):
            x = torch.randn(5, 6)
            inputs.append(weakref.ref(x))
            loss = head(backbone(x)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            del x, loss
        gc.collect()
        alive = [ref() is not None for ref in inputs[:-2]]
        assert dbg.steps == 12
    assert not any(alive)  # the open step used to keep every pass's tensors (about 2.5 MiB a step)
    with open_recording(tmp_path) as recording:
        assert recording.steps.tolist() == list(range(12))
        assert recording.step_iterations.tolist() == [1] * 12  # not one step of twelve iterations
        assert recording.summary("model.2", stat="count")[0].tolist() == list(range(12))


# ---- 5. damage is never silent or raw ----------------------------------------------------------------------------
def test_5_a_damaged_merged_segment_is_reported_with_the_steps_it_held(tmp_path: Path) -> None:
    rec = record(tmp_path, steps=40, flush_every=2, close=False, fanout=4)  # merged files of 8 and 2 steps
    trial = tmp_path / "t"
    merged = sorted(p for p in trial.glob("seg-*-L2.h5"))[0]
    with open(merged, "r+b") as f:  # the merged file loses its end: its index and attributes
        f.truncate(merged.stat().st_size // 3)
    with pytest.raises(CorruptRecordingError) as info:
        open_recording(trial)
    text = str(info.value)
    assert merged.name in text and "cannot be read" in text and "steps before step 32" in text
    assert f"comgra-ndbg check {trial} --salvage" in text
    with open_recording(trial, damaged="skip") as recording:  # the rest stays readable, and says what is not
        assert recording.steps.tolist() == list(range(32, 40))
        [damage] = recording.damage
        assert damage.kind == "unreadable" and damage.file == merged and damage.between == (-1, 32)
    rec._writer._lock.release(False)


def test_5_a_deleted_segment_leaves_a_reported_gap(tmp_path: Path) -> None:
    record(tmp_path, steps=12, flush_every=3, close=False)
    trial = tmp_path / "t"
    (trial / "seg-00000002-L0.h5").unlink()
    with pytest.raises(CorruptRecordingError, match=r"segment files are missing \(deleted\?\) steps between 2 and 6 "
                                                    r"\(sequences 2\)"):
        open_recording(trial)
    report = check(trial)
    assert not report.ok and [d.kind for d in report.trials[0].damage] == ["missing"]


def test_5_a_truncated_recording_says_it_is_damaged_not_that_it_is_empty(tmp_path: Path) -> None:
    record(tmp_path, steps=6)
    final = tmp_path / "t" / schema.FINAL_NAME
    with open(final, "r+b") as f:
        f.truncate(final.stat().st_size // 2)
    with pytest.raises(CorruptRecordingError, match=r"recording.h5: the file cannot be read.*--salvage"):
        open_recording(tmp_path)
    with pytest.raises(CorruptRecordingError, match=r"recording.h5: the file cannot be read"):
        open_recording(final)


def test_5_flipped_data_bytes_give_one_sentence_in_the_cli_and_a_non_zero_exit(tmp_path: Path, capsys) -> None:
    record(tmp_path, steps=6)
    final = tmp_path / "t" / schema.FINAL_NAME
    flip_byte(final, chunk_offset(final, schema.SUMMARY_DATA, 2) + 8)  # series 2's summaries
    for command in (["export", str(tmp_path), "--to", "csv", "--out", str(tmp_path / "x")],
                    ["explain", str(tmp_path)]):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and err.count("\n") == 1
        assert "is damaged" in err and "at steps 0–5" in err and "--salvage" in err
    assert main(["check", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "trial t: DAMAGED (1 finding)" in out
    assert re.search(r"recording.h5: summaries at steps 0–5 of '[\w.]+ \(value\)' \(data fails its checksum\)", out)


def test_5_a_foreign_segment_is_left_out_and_reported(tmp_path: Path) -> None:
    record(tmp_path, "t", steps=8)
    record(tmp_path, "other", steps=8, close=False)
    stray = tmp_path / "t" / "seg-00000005-L0.h5"
    os.link(tmp_path / "other" / "seg-00000001-L0.h5", stray)  # copied in by mistake
    with pytest.raises(CorruptRecordingError, match=r"seg-00000005-L0.h5: a file of another recording"):
        open_recording(tmp_path, "t")
    with open_recording(tmp_path, "t", damaged="skip") as recording:
        assert recording.steps.tolist() == list(range(8))  # not merged in: no step twice
        assert [d.kind for d in recording.damage] == ["foreign"]


def test_5_every_recorded_dataset_carries_a_checksum(tmp_path: Path) -> None:
    record(tmp_path, steps=6)
    unprotected = []

    def visit(name: str, obj: object) -> None:
        if isinstance(obj, h5py.Dataset) and obj.size:
            if obj.dtype.kind == "O":
                protected = schema.ATTR_CHECKSUM in obj.attrs
            else:
                protected = obj.fletcher32
            if not protected:
                unprotected.append(name)

    with h5py.File(tmp_path / "t" / schema.FINAL_NAME, "r") as f:
        f.visititems(visit)
        assert f.id.get_create_plist().get_version()[0] >= 2  # superblock with a checksum
    assert unprotected == []


# ---- 6. snapshot shapes of any rank -------------------------------------------------------------------------------
@pytest.mark.parametrize("rank", [9, 11])
def test_6_snapshot_shapes_of_rank_nine_and_more_are_kept(tmp_path: Path, rank: int) -> None:
    shape = (2,) + (1,) * (rank - 2) + (3,)
    value = torch.arange(6.0).reshape(shape)
    with Recorder(tmp_path, trial="t", snapshots=1) as rec:
        with rec.step(0):
            rec.register_tensor("x", value)
            rec.register_tensor("small", torch.ones(2, 2))
    with open_recording(tmp_path) as recording:
        snap = recording.snapshot(0, "x")
        assert snap.shape == shape
        np.testing.assert_array_equal(snap.dense(), value.numpy())
        assert recording.snapshot(0, "small").shape == (2, 2)


# ---- 7. typed errors, and float64 values kept -----------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, words", [
    (dict(flush_every_seconds="5"), "flush_every_seconds must be a number > 0"),
    (dict(flush_every_seconds=float("nan")), "flush_every_seconds must be a number > 0"),
    (dict(flush_every_steps=0), "flush_every_steps must be an int >= 1"),
    (dict(saturation_margin="0.1"), r"saturation_margin must be in \[0, 0.5\)"),
    (dict(record_updates="yes"), "record_updates must be True or False"),
])
def test_7_bad_settings_are_refused_at_the_constructor(tmp_path: Path, kwargs: dict, words: str) -> None:
    with pytest.raises(InvalidArgumentError, match=words):
        Recorder(tmp_path, trial="t", **kwargs)
    assert not (tmp_path / "t").exists()


def test_7_bad_paths_and_trial_names_get_typed_errors(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match=r"path must be the folder to record into.*got NoneType"):
        Recorder(None)
    with pytest.raises(InvalidArgumentError, match=r"trial name is 300 bytes long.*keep it to 200 bytes"):
        Recorder(tmp_path, trial="x" * 300)
    (tmp_path / "file").write_text("")
    with pytest.raises(InvalidArgumentError, match=r"cannot write into .*pass a folder you can write to"):
        Recorder(tmp_path / "file" / "below", trial="t")


def test_7_a_read_only_folder_gets_a_typed_error(tmp_path: Path, read_only_folder: Path) -> None:
    with pytest.raises(InvalidArgumentError, match=r"cannot write into .*(Read-only|Permission denied).*pass a folder "
                                                   r"you can write to"):
        Recorder(read_only_folder, trial="t")


def test_7_add_dependency_refuses_names_that_were_never_registered(tmp_path: Path) -> None:
    with Recorder(tmp_path, trial="t") as rec:
        with rec.step(0):
            rec.register_tensor("a", torch.ones(2))
            with pytest.raises(InvalidArgumentError, match=r"no tensor 'typo' was registered in this trial"):
                rec.add_dependency("a", "typo")
            rec.register_tensor("b", torch.ones(2))
            rec.add_dependency("a", "b")


def test_7_float64_values_near_1e300_are_kept_and_an_overflowing_sum_is_logged(tmp_path: Path) -> None:
    value = torch.tensor([[1e300, -2e300], [3e-300, 0.0]], dtype=torch.float64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Recorder(tmp_path, trial="t", snapshots=1) as rec:
            with rec.step(0):
                rec.register_tensor("big", value)
    with open_recording(tmp_path) as recording:
        snap = recording.snapshot(0, "big")
        assert snap.values.dtype == np.float64
        np.testing.assert_array_equal(snap.dense(), value.numpy())  # not inf
        assert recording.summary("big", stat="max")[1].tolist() == [1e300]
        [problem] = recording.problems()
        assert problem.category == schema.PROBLEM_OVERFLOW and problem.subject == "big"
        assert "std, rms and l2 are not recorded" in problem.message
    assert any("overflows float64" in m for m in recorder_warnings(caught))



def test_7_an_overflowing_sum_on_a_planned_step_is_logged_at_that_step(tmp_path: Path) -> None:
    """A step of the same shape as the ones before (the planned registration, the packed parameter passes)
    whose sum of squares overflows is logged at that step: values far apart (the exact recompute's sum),
    values close together (the kernel's sums around a shift, rebuilt without overflow until the last
    addition), and an update of a tracked parameter."""
    layer = torch.nn.Linear(2, 2).double()
    g = torch.Generator().manual_seed(0)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        with Recorder(tmp_path, trial="t", snapshots=None) as rec:
            rec.track_module("layer", layer)
            for step in range(4):
                with rec.step(step):
                    scale = 1e300 if step == 2 else 1.0
                    rec.register_tensor("h", torch.tensor([[scale, -2.0 * scale]], dtype=torch.float64))
                    close = 1e154 if step == 1 else 1.0
                    rec.register_tensor("g", close * (1 + 1e-3 * torch.randn(8, 16, generator=g, dtype=torch.float64)))
                    if step == 3:
                        with torch.no_grad():
                            layer.weight[0, 0] = 1e250
    with open_recording(tmp_path) as recording:
        problems = [(p.step, p.subject) for p in recording.problems() if p.category == schema.PROBLEM_OVERFLOW]
    assert problems == [(1, "g"), (2, "h"), (3, "layer.weight")]

# ---- 8. a full disk ----------------------------------------------------------------------------------------------
def test_8_a_full_disk_is_reported_at_once_leaves_no_temporary_file_and_drops_nothing_silently(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The write fails midway through a real file (as ENOSPC does): reported at the step it happens, the
    partial file removed, the steps kept and written once space is back."""
    real_write = Catalog.write
    full = {"on": False}

    def write(self: Catalog, f: h5py.File) -> None:
        real_write(self, f)
        if full["on"]:
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(Catalog, "write", write)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rec = Recorder(tmp_path, trial="t", flush_every_steps=2, flush_every_seconds=1e9)
        for step in range(12):
            full["on"] = 4 <= step < 8
            with rec.step(step):
                rec.register_tensor("x", torch.full((2, 2), float(step)))
            if step in (4, 5):
                rec._writer._job is None or rec._writer._job.thread.join()
                assert not any(p.name.endswith(schema.TEMP_SUFFIX) for p in (tmp_path / "t").iterdir())
        rec.close()
    messages = recorder_warnings(caught)
    assert "No space left on device (ENOSPC)" in messages[0] and "free space on that disk" in messages[0]
    with open_recording(tmp_path) as recording:
        assert recording.steps.tolist() == list(range(12))  # kept and written once space came back
        storage = [p for p in recording.problems() if p.category == schema.PROBLEM_STORAGE]
        assert storage and all("kept in memory" in p.message for p in storage)
    assert files_of(tmp_path / "t") == [schema.FINAL_NAME]


# ---- 9. overwriting, resuming and the writer's state ----------------------------------------------------------------
def test_9_mode_w_keeps_a_killed_runs_steps_unless_overwrite_is_asked_for(tmp_path: Path) -> None:
    record_and_die(tmp_path)
    with pytest.raises(RecordingExistsError, match=r"overwrite=True"):
        Recorder(tmp_path, trial="t", mode="w")
    with open_recording(tmp_path) as recording:
        assert recording.steps.tolist() == list(range(23))
        assert recording.state == "killed"


def test_9_a_killed_trial_is_continued_after_its_last_step(tmp_path: Path, capsys) -> None:
    record_and_die(tmp_path, steps=23, flush_every=5)  # flushed through step 22, then the process ended
    assert main(["info", str(tmp_path)]) == 0
    assert "killed (its writer stopped without closing" in capsys.readouterr().out
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Recorder(tmp_path, trial="t", mode="a") as rec:
            assert rec.resume_after == 22
            for step in range(20, 30):  # restarted from a checkpoint at step 20
                with rec.step(step):
                    rec.register_tensor("x", torch.full((2, 3), float(step)))
                    rec.record_kpi("loss", float(step))
    assert any("continued after step 22" in m for m in recorder_warnings(caught))
    with open_recording(tmp_path) as recording:
        assert recording.is_complete and recording.state == "finished"
        assert recording.steps.tolist() == list(range(30))  # each step once
        assert recording.kpi("loss")[0].tolist() == list(range(30))
        assert recording.summary("x", stat="mean")[1].tolist() == [float(s) for s in range(30)]
        [resumed] = recording.log(schema.LOG_RESUMED)
        assert resumed.step == 22 and "killed before" in resumed.message
    assert main(["info", str(tmp_path)]) == 0
    assert "complete" in capsys.readouterr().out


@pytest.fixture
def read_only_folder(tmp_path: Path):
    """A folder nobody may write into: permission bits where they bind (not root), else a read-only mount."""
    folder = tmp_path / "ro"
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)
        return
    if os.system(f"mount -t tmpfs -o ro,size=1m tmpfs {folder} 2>/dev/null") != 0:
        pytest.skip("running as root where mounting is not allowed: no folder is read-only to root")
    try:
        yield folder
    finally:
        os.system(f"umount {folder}")

"""Continuing a trial (``mode="a"``, ``NeuralDbg(resume=True)``), replacing one (``overwrite=True``), and
telling live, finished and killed trials apart by the writer's lock."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from comgra_ndbg import InvalidArgumentError, NeuralDbg, Recorder, RecordingExistsError, check, open_recording
from comgra_ndbg.cli import main
from comgra_ndbg.store import schema
from comgra_ndbg.store.lock import read_lock
from recording_faults import REPO, files_of, read_everything, record, record_and_die


def test_a_finished_trial_is_continued_and_consolidated_again(tmp_path: Path) -> None:
    record(tmp_path, steps=10)
    before = read_everything(tmp_path)
    record(tmp_path, steps=6, mode="a", first=10)
    after = read_everything(tmp_path)
    assert after["steps"] == list(range(16))
    assert after["kpi"]["loss"][0] == list(range(16))
    for key, value in before.items():  # what was there is unchanged
        if isinstance(key, tuple) and key[0] == "snapshot":
            assert after[key] == value
    assert files_of(tmp_path / "t") == [schema.FINAL_NAME]
    with open_recording(tmp_path) as recording:
        assert recording.is_complete and [e.step for e in recording.log(schema.LOG_RESUMED)] == [9]
    assert check(tmp_path).ok


def test_continuing_with_nothing_new_keeps_the_recording_as_it_was(tmp_path: Path) -> None:
    record(tmp_path, steps=5)
    before = read_everything(tmp_path)
    with Recorder(tmp_path, trial="t", mode="a") as rec:
        assert rec.resume_after == 4
    after = read_everything(tmp_path)
    assert after["steps"] == before["steps"] and after["kpi"] == before["kpi"]
    assert files_of(tmp_path / "t") == [schema.FINAL_NAME]


def test_mode_a_on_a_new_trial_simply_records(tmp_path: Path) -> None:
    with Recorder(tmp_path, trial="new", mode="a") as rec:
        assert rec.resume_after is None
        with rec.step(0):
            rec.register_tensor("x", torch.ones(2))
    with open_recording(tmp_path) as recording:
        assert recording.steps.tolist() == [0] and recording.log() == []


def test_steps_already_recorded_are_not_recorded_twice_after_a_checkpoint_restart(tmp_path: Path) -> None:
    record_and_die(tmp_path, steps=12, flush_every=4)  # steps 0-11 on disk
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Recorder(tmp_path, trial="t", mode="a") as rec:
            for step in range(8, 14):  # the checkpoint was taken at step 8
                with rec.step(step):
                    rec.register_tensor("x", torch.full((2, 3), -1.0))  # differs from the first run's
                    rec.record_kpi("loss", -1.0)
                    rec.add_note(f"rerun {step}")
                rec.record_kpi("late", 1.0)  # between steps: belongs to the step just finished
    assert sum("not recorded again" in str(w.message) for w in caught) == 1
    with open_recording(tmp_path) as recording:
        steps, means = recording.summary("x", stat="mean")
        assert steps.tolist() == list(range(14))
        assert means.tolist() == [float(s) for s in range(12)] + [-1.0, -1.0]  # the first run's where it had them
        assert recording.kpi("loss")[0].tolist() == list(range(14))
        assert recording.kpi("late")[0].tolist() == [12, 13]
        assert [n.text for n in recording.notes] == [f"rerun {s}" for s in range(8, 14)]  # notes are kept


def test_a_live_trial_can_be_neither_continued_nor_replaced(tmp_path: Path) -> None:
    rec = record(tmp_path, steps=4, close=False)
    with open_recording(tmp_path) as recording:
        assert recording.state == "live"
    lock = read_lock(tmp_path / "t")
    assert lock.pid == os.getpid() and lock.held and lock.last_sequence == 1
    with pytest.raises(RecordingExistsError, match=rf"being written by process {os.getpid()}"):
        Recorder(tmp_path, trial="t", mode="a")
    with pytest.raises(RecordingExistsError, match="being written"):
        Recorder(tmp_path, trial="t", mode="w", overwrite=True)
    rec.close()
    assert read_lock(tmp_path / "t") is None
    with open_recording(tmp_path) as recording:
        assert recording.state == "finished" and recording.steps.tolist() == [0, 1, 2, 3]


def test_info_tells_live_finished_and_killed_trials_apart(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    record(tmp_path, "finished", steps=3)
    record_and_die(tmp_path, "killed", steps=3, flush_every=1)
    script = textwrap.dedent(f"""
        import sys, time, torch
        from comgra_ndbg import Recorder
        rec = Recorder({str(tmp_path)!r}, "live", flush_every_steps=1, flush_every_seconds=1e9)
        with rec.step(0):
            rec.register_tensor("x", torch.ones(2))
        rec.flush()
        print("ready", flush=True)
        time.sleep(60)
    """)
    live = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert live.stdout.readline().strip() == "ready"
        assert main(["info", str(tmp_path)]) == 0
        out = capsys.readouterr().out
        assert "trial finished: 3 recorded steps 0–2, complete" in out
        assert "trial killed: 3 recorded steps 0–2, killed (its writer stopped without closing" in out
        assert "trial live: 1 recorded step (0), live (still being written)" in out
    finally:
        live.kill()
        live.wait()
    deadline = time.monotonic() + 10
    while read_lock(tmp_path / "live").held and time.monotonic() < deadline:
        time.sleep(0.05)
    with open_recording(tmp_path, "live") as recording:
        assert recording.state == "killed"  # the same trial once its process is gone


def test_neuraldbg_resume_numbers_steps_on_after_the_last_recorded_one(tmp_path: Path) -> None:
    def run(dbg_kwargs: dict, passes: int) -> None:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with NeuralDbg(model, tmp_path, trial="t", optimizer=optimizer, **dbg_kwargs):
            for _ in range(passes):
                optimizer.zero_grad()
                model(torch.randn(3, 4)).pow(2).mean().backward()
                optimizer.step()

    run({}, 5)
    run({"resume": True}, 3)
    with open_recording(tmp_path) as recording:
        assert recording.steps.tolist() == list(range(8))
    run({"resume": True, "first_step": 6}, 4)  # restarted from a checkpoint at step 6
    with open_recording(tmp_path) as recording:
        assert recording.steps.tolist() == list(range(10))
        assert len(recording.log(schema.LOG_RESUMED)) == 2
    with pytest.raises(InvalidArgumentError, match="resume=True continues the trial"):
        NeuralDbg(nn.Linear(1, 1), tmp_path, trial="t", resume=True, mode="w")
    with pytest.raises(RecordingExistsError, match="resume=True"):
        NeuralDbg(nn.Linear(1, 1), tmp_path, trial="t")

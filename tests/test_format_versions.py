"""Recordings of older format versions, written by the code of their time (``tests/data/format_v1``,
``tests/data/format_v2``): they read, check and continue as they were recorded, and the fields their rows
lack (the sample spread, added in version 3) derive NaN, never 0.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from comgra_ndbg import Recorder, check, open_recording
from comgra_ndbg.store import schema

DATA = Path(__file__).resolve().parent / "data"
OLD = {1: DATA / "format_v1", 2: DATA / "format_v2"}
OLD_FIELDS = 14  # versions 1 and 2: STAT_FIELDS up to saturated_units
SPREAD = slice(schema.FIELD["spread_count"], schema.FIELD["spread_dev_sq"] + 1)
X_SPREAD = 13.5 / 55  # x = [[0, 1, 2], [3, 4, 5]] × (step + 1): each unit deviates by ±1.5 from its mean


def x_at(step: int) -> torch.Tensor:
    """The input every fixture step registered (batch 2, units 3)."""
    return torch.arange(6.0).reshape(2, 3) * (step + 1)


@pytest.mark.parametrize("version", OLD)
def test_old_recordings_stay_readable_with_the_sample_spread_unknown(version: int) -> None:
    folder = OLD[version]
    with open_recording(folder, "finished") as recording:
        assert recording.is_complete and recording.steps.tolist() == list(range(6))
        assert recording.step_types == ["even", "odd"] and recording.problems() == []
        np.testing.assert_array_equal(recording.snapshot(4, "x").dense(), x_at(4).numpy())
        assert recording.summary("x", stat="mean")[1].tolist() == [2.5 * (s + 1) for s in range(6)]
        assert [n.text for n in recording.notes] == [f"v{version} fixture"]
        assert recording.profile().is_empty  # profiles came with version 4
        for name in ("x", "y"):
            steps, rows = recording.summary_rows(name)
            assert rows.shape == (6, schema.NUM_FIELDS) and (rows[:, SPREAD] == 0).all()
            assert rows[:, schema.FIELD["units"]].tolist() == [3 if name == "x" else 2] * 6  # batched tensors
            for stat in ("sample_spread", "sample_spread_rms"):
                assert np.isnan(recording.summary(name, stat=stat)[1]).all(), (name, stat)
        sample_rows = recording.snapshot(4, "x").sample_rows
        assert sample_rows.shape == (2, schema.NUM_FIELDS) and (sample_rows[:, SPREAD] == 0).all()
        with h5py.File(recording.files[0], "r") as f:
            assert int(f.attrs[schema.ATTR_FORMAT_VERSION]) == version
            assert f[schema.SUMMARY_DATA].shape[1] == f[schema.SAMPLE_STATS].shape[1] == OLD_FIELDS
    with open_recording(folder, "killed") as recording:
        assert recording.steps.tolist() == list(range(6))
        assert recording.state == {1: "incomplete", 2: "killed"}[version]  # version 2 left its writer's lock
        assert np.isnan(recording.summary("x", stat="sample_spread")[1]).all()
    assert check(folder).ok


@pytest.mark.parametrize("version", OLD)
def test_an_old_trial_can_be_continued_into_version_3_files(version: int, tmp_path: Path) -> None:
    """The merge pads the old rows: the spread stays unknown for the old steps and is recorded for the new."""
    shutil.copytree(OLD[version] / "killed", tmp_path / "killed")
    with Recorder(tmp_path, trial="killed", mode="a") as rec:
        assert rec.resume_after == 5
        for step in range(6, 9):
            with rec.step(step, "even" if step % 2 == 0 else "odd"):
                rec.register_tensor("x", x_at(step), role="input")
    with open_recording(tmp_path, "killed") as recording:
        assert recording.is_complete and recording.steps.tolist() == list(range(9))
        assert recording.summary("x", stat="mean")[1].tolist() == [2.5 * (s + 1) for s in range(9)]
        assert recording.step_types == ["even", "odd"]
        steps, spread = recording.summary("x", stat="sample_spread")
        assert steps.tolist() == list(range(9)) and np.isnan(spread[:6]).all()
        np.testing.assert_allclose(spread[6:], X_SPREAD, rtol=1e-12)
        with h5py.File(tmp_path / "killed" / schema.FINAL_NAME, "r") as f:
            assert int(f.attrs[schema.ATTR_FORMAT_VERSION]) == schema.FORMAT_VERSION == 4
            assert f[schema.SUMMARY_DATA].shape[1] == schema.NUM_FIELDS
    assert check(tmp_path).ok


def test_a_new_recording_of_the_same_run_has_the_spread_the_old_ones_lack(tmp_path: Path) -> None:
    with Recorder(tmp_path, "t", snapshots=None) as rec:
        for step in range(3):
            with rec.step(step):
                rec.register_tensor("x", x_at(step), role="input")
    with open_recording(tmp_path, "t") as recording:
        np.testing.assert_allclose(recording.summary("x", stat="sample_spread")[1], X_SPREAD, rtol=1e-12)
        np.testing.assert_allclose(recording.summary("x", stat="sample_spread_rms")[1],
                                   [1.5 * (s + 1) for s in range(3)], rtol=1e-12)

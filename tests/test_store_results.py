"""Analysis results beside a recording: atomic replacement, staleness, non-finite floats, bad files."""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from comgra_ndbg.errors import RecordingFormatError
from comgra_ndbg.store.results import RESULTS_NAME, read_results, results_path, write_results


def test_round_trip_keyed_by_step_count(tmp_path: Path) -> None:
    assert read_results(tmp_path) is None
    path = write_results(tmp_path, {"x": [1, (2, 3)], "bad": float("nan"), "big": float("-inf")}, num_steps=40,
                         last_step=39)
    assert path == tmp_path / RESULTS_NAME
    stored = read_results(tmp_path, num_steps=40)
    assert (stored.num_steps, stored.last_step, stored.stale) == (40, 39, False)
    assert stored.diagnosis == {"x": [1, [2, 3]], "bad": "nan", "big": "-inf"}
    assert read_results(tmp_path, num_steps=41).stale


def test_replacement_leaves_no_temporary_file(tmp_path: Path) -> None:
    write_results(tmp_path, {"n": 1}, num_steps=1, last_step=0)
    write_results(tmp_path, {"n": 2}, num_steps=2, last_step=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == [RESULTS_NAME]
    assert read_results(tmp_path).diagnosis == {"n": 2}


def test_a_single_file_recording_gets_a_sibling_results_file(tmp_path: Path) -> None:
    h5 = tmp_path / "run.h5"
    h5.write_bytes(b"")
    assert results_path(h5) == tmp_path / "run.analysis.json"


def test_unreadable_or_foreign_files_raise_a_format_error(tmp_path: Path) -> None:
    (tmp_path / RESULTS_NAME).write_text("{not json")
    with pytest.raises(RecordingFormatError, match="run comgra_ndbg.analyze"):
        read_results(tmp_path)
    (tmp_path / RESULTS_NAME).write_text(json.dumps({"format": "other", "format_version": 1}))
    with pytest.raises(RecordingFormatError, match="not an analysis file"):
        read_results(tmp_path)


def test_results_are_written_with_the_mode_of_a_plain_new_file(tmp_path: Path) -> None:
    """Not mkstemp's 0600: whoever may read the recording may read its analysis."""
    previous = os.umask(0o022)
    try:
        path = write_results(tmp_path, {"n": 1}, num_steps=1, last_step=0)
        assert stat.S_IMODE(path.stat().st_mode) == 0o644
        os.umask(0o077)
        path = write_results(tmp_path, {"n": 2}, num_steps=1, last_step=0)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    finally:
        os.umask(previous)

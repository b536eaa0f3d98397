"""The size cap of merged files (``max_file_bytes``): merges never hold more than the cap, a recording larger
than it closes into several files, and those read exactly like the one file the same run makes without a
cap, also after a crash in the middle of ``close()`` and when the trial is continued."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import h5py
import numpy as np
import pytest

from comgra_ndbg import CorruptRecordingError, InvalidArgumentError, Recorder, RecorderWarning, check, open_recording
from comgra_ndbg.gui.state import ReaderCache
from comgra_ndbg.store import consolidate as consolidate_module
from comgra_ndbg.store import schema
from comgra_ndbg.store import segment as segment_module
from comgra_ndbg.store import writer as writer_module
from comgra_ndbg.store.live import FINAL_LEVEL, list_live_segments
from comgra_ndbg.store.merger import BackgroundMerger, Segment, group_under_cap
from comgra_ndbg.store.segment import parse_segment_name, read_segment, segment_name
from recording_faults import REPO, read_everything, record

CAP = 100_000  # array bytes; the run below holds about 360 kB in flushes of 13-17 kB (every 4 steps)
STEPS = 100


def _files(trial: Path) -> list[str]:
    return sorted(p.name for p in trial.iterdir())


def _live(trial: Path) -> list[str]:
    """The names of the files that hold the trial, oldest first."""
    return [path.name for *_, path in list_live_segments(trial)]


def _array_bytes(path: Path) -> int:
    """What a merge of this file holds in memory (``SegmentContent.nbytes`` of its content)."""
    with h5py.File(path, "r") as f:
        return read_segment(f).nbytes


def _attr(path: Path, name: str) -> object:
    with h5py.File(path, "r") as f:
        return f.attrs.get(name)


def _without_resume_row(everything: dict) -> dict:
    return {**everything, "log": [row for row in everything["log"] if row[1] != schema.LOG_RESUMED]}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The run recorded without a cap: one ``recording.h5``."""
    folder = tmp_path_factory.mktemp("uncapped")
    record(folder, steps=STEPS, max_file_bytes=None)
    assert _files(folder / "t") == [schema.FINAL_NAME]
    return read_everything(folder)


def test_a_recording_above_the_cap_closes_into_several_files_that_read_as_the_uncapped_one(
        tmp_path: Path, reference: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    merged_inputs: list[int] = []
    real_merge = writer_module.merge_files

    def counting_merge(directory: Path, inputs: list[Segment], level: int, *args: object, **options: object):
        merged_inputs.append(sum(segment.nbytes for segment in inputs))
        return real_merge(directory, inputs, level, *args, **options)

    monkeypatch.setattr(writer_module, "merge_files", counting_merge)
    record(tmp_path, steps=STEPS, max_file_bytes=CAP)
    trial = tmp_path / "t"
    names = _live(trial)
    assert sorted(names) == _files(trial)  # nothing else is left in the folder
    assert len(names) >= 4 and names[-1] == schema.FINAL_NAME
    assert all(parse_segment_name(name) is not None for name in names[:-1])
    assert merged_inputs and max(merged_inputs) <= CAP  # no merge, background or final, held more than the cap
    sizes = [_array_bytes(trial / name) for name in names]
    assert max(sizes) <= CAP
    assert len(names) <= 2 * sum(sizes) // CAP + 1  # neighbours were merged up to the cap, not left small
    parts = [int(v) for v in _attr(trial / schema.FINAL_NAME, schema.ATTR_PARTS)]
    assert parts == [sequence for sequence, _, _ in list_live_segments(trial)]
    assert read_everything(tmp_path) == reference
    with open_recording(tmp_path) as recording:
        assert recording.is_complete and recording.state == "finished" and len(recording.files) == len(names)
    with open_recording(trial / schema.FINAL_NAME) as recording:  # the complete file stands for all of them
        assert recording.is_complete and recording.steps.tolist() == list(range(STEPS))
    report = check(tmp_path)
    assert report.ok and report.trials[0].state == "finished" and report.trials[0].steps == STEPS
    assert f"{STEPS} readable steps in {len(names)} files" in str(report)
    cache = ReaderCache(tmp_path)
    try:
        recording = cache.recording("t")
        assert recording.is_complete and recording.kpi("loss")[0].tolist() == reference["kpi"]["loss"][0]
    finally:
        cache.close()


def test_a_recording_under_the_cap_keeps_its_single_file(tmp_path: Path, reference: dict) -> None:
    record(tmp_path, steps=STEPS)  # the default cap, far above this run
    assert _files(tmp_path / "t") == [schema.FINAL_NAME]
    assert _attr(tmp_path / "t" / schema.FINAL_NAME, schema.ATTR_PARTS) is None
    assert read_everything(tmp_path) == reference


_KILLED_IN_CLOSE = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, os.path.join({repo!r}, "tests"))
    from comgra_ndbg.store import consolidate
    from recording_faults import record

    def then_die(write):
        def write_then_die(path, *args, **options):
            write(path, *args, **options)  # renamed into place: its inputs are still on disk
            if path.name == {victim!r} or (path.name.endswith("-L{final}.h5") and {victim!r} == "part"):
                os._exit(0)
        return write_then_die

    consolidate.write_segment = then_die(consolidate.write_segment)  # a merge
    consolidate.write_file = then_die(consolidate.write_file)  # one file put in place with new attributes
    record(__import__("pathlib").Path({folder!r}), steps={steps}, max_file_bytes={cap})
    raise SystemExit("close() never wrote the file it was to die after")
""")


@pytest.mark.parametrize("victim", ["part", schema.FINAL_NAME])
def test_a_kill_between_writing_a_merged_file_and_deleting_its_inputs_loses_nothing(
        tmp_path: Path, reference: dict, victim: str) -> None:
    code = _KILLED_IN_CLOSE.format(repo=str(REPO), victim=victim, final=FINAL_LEVEL, folder=str(tmp_path),
                                   steps=STEPS, cap=CAP)
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=120,
                   env={**os.environ, "PYTHONPATH": str(REPO)})
    trial = tmp_path / "t"
    live = {path.name for *_, path in list_live_segments(trial)}
    assert set(_files(trial)) - live - {schema.LOCK_NAME}  # the inputs are still there, covered
    assert read_everything(tmp_path) == reference
    consolidated = victim == schema.FINAL_NAME  # killed after the last file was in place: only cleanup was left
    report = check(tmp_path)
    assert report.ok and report.trials[0].state == ("finished" if consolidated else "killed")
    with open_recording(tmp_path) as recording:
        assert recording.is_complete == consolidated
    Recorder(tmp_path, "t", mode="a", max_file_bytes=CAP).close()  # continued with nothing new: consolidated
    assert not set(_files(trial)) - {path.name for *_, path in list_live_segments(trial)}
    with open_recording(tmp_path) as recording:
        assert recording.is_complete and recording.state == "finished"
    assert _without_resume_row(read_everything(tmp_path)) == reference


def _record_twice(folder: Path, first_cap: int | None, second_cap: int | None) -> None:
    """60 steps, closed, then the trial continued for 60 more (``mode="a"``), each with its own cap."""
    record(folder, steps=60, max_file_bytes=first_cap)
    record(folder, steps=60, first=60, mode="a", max_file_bytes=second_cap)


@pytest.fixture(scope="module")
def continued_reference(tmp_path_factory: pytest.TempPathFactory) -> dict:
    folder = tmp_path_factory.mktemp("continued")
    _record_twice(folder, None, None)
    assert _files(folder / "t") == [schema.FINAL_NAME]
    return read_everything(folder)


def test_a_continued_trial_above_the_cap_closes_into_parts_again(tmp_path: Path, continued_reference: dict) -> None:
    _record_twice(tmp_path, CAP, CAP)
    trial = tmp_path / "t"
    names = _live(trial)
    assert sorted(names) == _files(trial)
    assert len(names) >= 4 and names[-1] == schema.FINAL_NAME
    parts = [int(v) for v in _attr(trial / schema.FINAL_NAME, schema.ATTR_PARTS)]
    assert parts == [sequence for sequence, _, _ in list_live_segments(trial)]
    everything = read_everything(tmp_path)
    assert everything["steps"] == list(range(120)) and everything == continued_reference
    assert check(tmp_path).ok


def test_a_continued_old_final_file_above_the_cap_is_renamed_into_a_part_not_copied(
        tmp_path: Path, continued_reference: dict) -> None:
    """A recording closed without a cap (or by a version before it) and continued with one: its old
    ``recording.h5``, larger than the cap, becomes a part by a rename, never read into memory."""
    record(tmp_path, steps=60, max_file_bytes=None)
    old = tmp_path / "t" / schema.FINAL_NAME
    assert _array_bytes(old) > CAP
    inode, sequence = old.stat().st_ino, int(_attr(old, schema.ATTR_SEQUENCE))
    record(tmp_path, steps=60, first=60, mode="a", max_file_bytes=CAP)
    part = tmp_path / "t" / segment_name(sequence, FINAL_LEVEL)
    assert part.stat().st_ino == inode  # the same file, renamed
    assert _live(tmp_path / "t")[0] == part.name
    with open_recording(tmp_path) as recording:
        assert recording.is_complete and recording.state == "finished"
    assert read_everything(tmp_path) == continued_reference
    assert check(tmp_path).ok


# ---- the background merges' policy, with a merge that only adds sizes ------------------------------------
def _merger(cap: float, fanout: int = 4) -> tuple[BackgroundMerger, list[list[Segment]], dict[Path, list[int]]]:
    """A merger whose merge only records its inputs and which flushes each merged file holds."""
    merges: list[list[Segment]] = []
    covers: dict[Path, list[int]] = {}

    def merge(inputs: list[Segment], level: int) -> Segment:
        merges.append(list(inputs))
        path = Path(f"merged-{inputs[-1].sequence}-L{level}")
        covers[path] = [flush for s in inputs for flush in covers.get(s.path, [s.sequence])]
        return Segment(inputs[-1].sequence, path, sum(s.nbytes for s in inputs))

    return BackgroundMerger(merge, fanout, cap), merges, covers


def test_background_merges_hold_at_most_the_cap_and_join_neighbours_only() -> None:
    rng = np.random.default_rng(0)
    merger, merges, covers = _merger(cap=100)
    sizes = rng.integers(1, 40, size=300).tolist() + [150] + rng.integers(1, 40, size=100).tolist()
    for sequence, size in enumerate(sizes, start=1):
        merger.add(Segment(sequence, Path(f"seg-{sequence}"), int(size)))
        merger.wait()
    assert len(merges) > 20 and all(sum(s.nbytes for s in inputs) <= 100 and len(inputs) >= 2 for inputs in merges)
    for inputs in merges:  # every merge joins files holding consecutive flushes
        flushes = [flush for s in inputs for flush in covers.get(s.path, [s.sequence])]
        assert flushes == list(range(flushes[0], flushes[-1] + 1))
    left = merger.drain()
    assert [flush for s in left for flush in covers.get(s.path, [s.sequence])] == list(range(1, len(sizes) + 1))
    assert sum(s.nbytes for s in left) == sum(sizes)
    assert Segment(301, Path("seg-301"), 150) in left  # above the cap on its own: kept as it is
    assert len(left) <= 2 * sum(sizes) // 100 + 4 * 3  # merged up to about the cap, a few small ones waiting


def test_without_a_cap_the_background_merges_take_whole_levels() -> None:
    merger, merges, _ = _merger(cap=float("inf"))
    for sequence in range(1, 17):
        merger.add(Segment(sequence, Path(f"seg-{sequence}"), 1000))
        merger.wait()
    assert [len(inputs) for inputs in merges] == [4, 4, 4, 4, 4]  # four of level 0, then four of level 1
    assert len(merger.drain()) == 1


def test_close_groups_the_files_left_into_runs_under_the_cap() -> None:
    segments = [Segment(i, Path(f"s{i}"), n) for i, n in enumerate([60, 30, 20, 150, 10, 10, 95, 5], start=1)]
    runs = group_under_cap(segments, 100)
    assert [[s.sequence for s in run] for run in runs] == [[1, 2], [3], [4], [5, 6], [7, 8]]
    assert [s for run in runs for s in run] == segments


def test_a_merge_running_while_files_are_added_keeps_the_cap() -> None:
    gate = threading.Event()
    merges: list[list[Segment]] = []

    def slow_merge(inputs: list[Segment], level: int) -> Segment:
        gate.wait(timeout=10)
        merges.append(list(inputs))
        return Segment(inputs[-1].sequence, Path(f"m{inputs[-1].sequence}-{level}"), sum(s.nbytes for s in inputs))

    merger = BackgroundMerger(slow_merge, 2, 50)
    for sequence in range(1, 9):
        merger.add(Segment(sequence, Path(f"seg-{sequence}"), 20))
    gate.set()
    merger.wait()
    assert merges and all(sum(s.nbytes for s in inputs) <= 50 for inputs in merges)
    assert sum(s.nbytes for s in merger.drain()) == 160


@pytest.mark.parametrize("value", [0, -5, 1.5, "256MB", True])
def test_max_file_bytes_must_be_a_positive_int_or_none(tmp_path: Path, value: object) -> None:
    with pytest.raises(InvalidArgumentError, match="max_file_bytes must be a positive int"):
        Recorder(tmp_path, "t", max_file_bytes=value)
    assert not (tmp_path / "t").exists()


def test_files_of_a_closed_recording_seal_every_file_adopted_before_them() -> None:
    """A trial killed in the middle of ``close()`` and continued: a level-2 file, a part of level 99, then
    level-0 files. The level-2 file must never be merged with newer files across the part."""
    merger, merges, _ = _merger(cap=1000, fanout=2)
    merger.adopt(Segment(8, Path("seg-8-L2"), 10), 2)
    merger.adopt(Segment(12, Path(segment_name(12, FINAL_LEVEL)), 10), FINAL_LEVEL, sealed=True)
    for sequence in range(13, 21):
        merger.add(Segment(sequence, Path(f"seg-{sequence}"), 10))
        merger.wait()
    assert merges and all(inputs[0].sequence >= 13 for inputs in merges)
    assert [s.sequence for s in merger.drain()][:2] == [8, 12]


def test_a_deleted_part_of_a_closed_recording_is_reported_and_the_rest_salvaged(tmp_path: Path) -> None:
    record(tmp_path, steps=STEPS, max_file_bytes=CAP)
    trial = tmp_path / "t"
    first = next(path for *_, path in list_live_segments(trial))
    with h5py.File(first, "r") as f:
        lost = sorted(set(f[schema.STEPS_STEP][()].tolist()))
    first.unlink()
    with pytest.raises(CorruptRecordingError, match="missing"):
        open_recording(trial)
    with open_recording(trial, damaged="skip") as recording:  # never a shorter recording that reads as complete
        assert not recording.is_complete and recording.steps.tolist() == list(range(lost[-1] + 1, STEPS))
    report = check(tmp_path, salvage=True)
    assert not report.ok and [d.kind for d in report.trials[0].damage] == ["missing"]
    with open_recording(report.trials[0].salvaged) as salvaged:
        assert salvaged.is_complete and salvaged.steps.tolist() == list(range(lost[-1] + 1, STEPS))


def test_neuraldbg_passes_the_cap_to_its_recorder(tmp_path: Path) -> None:
    import torch

    from comgra_ndbg import NeuralDbg

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with NeuralDbg(model, tmp_path, trial="t", optimizer=optimizer, snapshots=2, flush_every_steps=2,
                   flush_every_seconds=1e9, max_file_bytes=20_000, invariants=False) as dbg:
        for _ in range(30):
            loss = model(torch.randn(4, 8)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    assert dbg.recorder._writer.max_file_bytes == 20_000
    names = _live(tmp_path / "t")
    assert len(names) >= 3 and names[-1] == schema.FINAL_NAME
    with open_recording(tmp_path) as recording:
        assert recording.is_complete and recording.steps.tolist() == list(range(30))


def test_a_full_disk_in_the_middle_of_close_is_reported_and_the_next_writer_finishes_it(
        tmp_path: Path, reference: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    rec = record(tmp_path, steps=STEPS, max_file_bytes=CAP, close=False)
    real_write = segment_module.write_file
    writes: list[str] = []

    def full_after_one(path: Path, data: object) -> None:
        writes.append(path.name)
        if len(writes) > 1:
            raise OSError(28, "No space left on device")
        real_write(path, data)

    monkeypatch.setattr(segment_module, "write_file", full_after_one)
    monkeypatch.setattr(consolidate_module, "write_file", full_after_one)
    with pytest.warns(RecorderWarning, match="consolidating .* failed .*No space left on device"):
        rec.close()
    monkeypatch.undo()
    trial = tmp_path / "t"
    assert len(writes) == 2 and not [name for name in _files(trial) if name.endswith(schema.TEMP_SUFFIX)]
    assert read_everything(tmp_path) == reference  # one part written, the rest as it was: every step once
    with open_recording(tmp_path) as recording:
        assert not recording.is_complete and recording.state == "incomplete"
    Recorder(tmp_path, "t", mode="a", max_file_bytes=CAP).close()
    with open_recording(tmp_path) as recording:
        assert recording.is_complete and recording.state == "finished"
    after = read_everything(tmp_path)
    assert {**after, "log": None} == {**reference, "log": None}
    assert [row for row in after["log"] if row not in reference["log"]] == [
        row for row in after["log"] if row[1] in (schema.LOG_RESUMED, schema.PROBLEM_STORAGE)]


def test_a_cap_below_every_file_leaves_each_flush_a_part_of_its_own(tmp_path: Path, reference: dict) -> None:
    record(tmp_path, steps=STEPS, max_file_bytes=1)
    trial = tmp_path / "t"
    names = _live(trial)
    assert len(names) == STEPS // 4 and sorted(names) == _files(trial)  # a flush every 4 steps, nothing merged
    assert all(int(_attr(trial / name, schema.ATTR_LEVEL)) in (0, FINAL_LEVEL) for name in names)
    assert read_everything(tmp_path) == reference
    with open_recording(tmp_path) as recording:
        assert recording.is_complete

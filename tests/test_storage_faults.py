"""Storage faults, each with its outcome asserted: truncation, flipped bytes in data and in metadata, a
deleted or foreign segment, a full disk (a real size-limited file system where this machine allows
mounting one, an injected ENOSPC, and ``RLIMIT_FSIZE``), a read-only folder; kill -9 at random moments is
in ``test_store_crash.py``. Recordings written by format version 1 stay readable and can be continued.

The rule every test checks: the outcome is either the recorded data, exactly, or a typed error
(``CorruptRecordingError``) that names the file and the steps; never different data without a word, never
a raw exception; and what is not damaged stays readable (``damaged="skip"``, ``check --salvage``).
"""
from __future__ import annotations

import errno
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from comgra_ndbg import CorruptRecordingError, Recorder, RecorderWarning, check, open_recording
from comgra_ndbg.store import schema
from comgra_ndbg.store import segment as segment_module
from comgra_ndbg.store import writer as writer_module
from recording_faults import REPO, chunk_offset, files_of, flip_byte, read_everything, record, record_and_die

V1 = Path(__file__).resolve().parent / "data" / "format_v1"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A finished recording and everything it holds."""
    folder = tmp_path_factory.mktemp("reference")
    record(folder, steps=12)
    return folder / "t" / schema.FINAL_NAME, read_everything(folder)


def _copy(source: Path, folder: Path) -> Path:
    (folder / "t").mkdir(parents=True)
    target = folder / "t" / source.name
    shutil.copyfile(source, target)
    return target


# ---- flipped bytes in data ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dataset, what", [
    (schema.SUMMARY_DATA, "summaries"), (schema.VALUE_POOL, "snapshot"), (schema.SAMPLE_STATS, "snapshot"),
    (schema.STEPS_ITERATIONS, "rows of its steps table"), (schema.KPI_VALUE, "rows of its kpi table"),
    (schema.SNAP_SHAPE, "snapshot"),
])
def test_a_flipped_data_byte_is_caught_named_and_salvaged_around(tmp_path: Path, reference: tuple[Path, dict],
                                                                  dataset: str, what: str) -> None:
    source, expected = reference
    damaged = _copy(source, tmp_path)
    flip_byte(damaged, chunk_offset(damaged, dataset) + 3)
    with pytest.raises(CorruptRecordingError, match=rf"{damaged.name}: .*--salvage"):
        read_everything(tmp_path)  # strict: never different data without a word
    report = check(tmp_path, salvage=True)
    [trial] = report.trials
    assert not report.ok and len(trial.damage) == 1 and trial.damage[0].kind == "checksum"
    assert what in trial.damage[0].what and trial.damage[0].steps  # exactly which steps
    salvaged = read_everything(tmp_path, "t-salvaged")
    assert check(tmp_path, "t-salvaged").ok  # a clean recording of everything readable
    lost = set(trial.damage[0].steps)
    assert set(salvaged["steps"]) == set(expected["steps"]) - (lost if "steps table" in what else set())
    kept = [key for key in expected if isinstance(key, tuple) and key[0] == "summary"]
    survivors = sum(salvaged.get(key) == expected[key] for key in kept)
    assert survivors >= len(kept) - 1  # at most the damaged tensor's summaries differ
    [log] = [e for e in salvaged["log"] if e[1] == schema.PROBLEM_DAMAGE]
    assert "lost when the recording was salvaged" in log[3]


def test_flipped_text_fails_its_checksum(tmp_path: Path, reference: tuple[Path, dict]) -> None:
    source, _ = reference
    damaged = _copy(source, tmp_path)
    data = damaged.read_bytes()
    offset = data.index(b"note at 7")
    flip_byte(damaged, offset + 5)  # the note now reads differently; HDF5 itself cannot tell
    with pytest.raises(CorruptRecordingError, match=r"its notes table was unreadable.*fails its checksum"):
        open_recording(tmp_path).notes
    with open_recording(tmp_path, damaged="skip") as recording:
        assert recording.notes == [] and [d.what for d in recording.damage] == [
            "its notes table was unreadable and is left out"]


def test_every_single_byte_flip_is_harmless_or_caught_never_silent(tmp_path: Path,
                                                                   reference: tuple[Path, dict]) -> None:
    """Flip one byte at 160 places spread over a whole recording file (superblock, object headers, B-trees,
    heaps, chunks, attributes), in a separate process (a crash of HDF5 would show as its exit code): every
    read either equals the original or raises a typed error."""
    source, _ = reference
    script = textwrap.dedent(f"""
        import json, shutil, sys
        from pathlib import Path
        sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
        from recording_faults import flip_byte, read_everything
        from comgra_ndbg import ComgraError
        source, folder = Path({str(source)!r}), Path({str(tmp_path)!r})
        expected = read_everything(source.parent)
        size = source.stat().st_size
        outcomes = {{}}
        for k in range(160):
            offset = (k * size) // 160 + k % 7
            target = folder / str(k) / "t" / source.name
            target.parent.mkdir(parents=True)
            shutil.copyfile(source, target)
            flip_byte(target, offset)
            print(offset, flush=True)
            try:
                outcome = "equal" if read_everything(target.parent) == expected else "silent"
            except ComgraError:
                outcome = "caught"
            except BaseException as error:
                outcome = f"raw {{type(error).__name__}}: {{error}}"
            outcomes[offset] = outcome
            shutil.rmtree(target.parent.parent)
        print(json.dumps(outcomes))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, f"HDF5 crashed at offset {done.stdout.split()[-1:]}: {done.stderr[-2000:]}"
    outcomes = json.loads(done.stdout.splitlines()[-1])
    bad = {offset: outcome for offset, outcome in outcomes.items() if outcome not in ("equal", "caught")}
    assert bad == {}
    assert list(outcomes.values()).count("caught") >= 80  # most bytes matter, and all of those are caught


# ---- truncation ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("keep", [0.0, 0.1, 0.5, 0.9, 0.999])
def test_a_truncated_file_is_named_and_the_other_files_stay_readable(tmp_path: Path, keep: float) -> None:
    rec = record(tmp_path, steps=16, flush_every=4, close=False)
    trial = tmp_path / "t"
    victim = trial / "seg-00000002-L0.h5"  # steps 4-7
    with open(victim, "r+b") as f:
        f.truncate(int(victim.stat().st_size * keep))
    with pytest.raises(CorruptRecordingError, match=r"seg-00000002-L0.h5: the file cannot be read steps between 3 "
                                                    r"and 8"):
        open_recording(trial)
    with open_recording(trial, damaged="skip") as recording:
        assert recording.steps.tolist() == [0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15]
    [damage] = check(trial, salvage=True).trials[0].damage
    assert damage.kind == "unreadable" and damage.between == (3, 8)
    with open_recording(tmp_path, "t-salvaged") as salvaged:
        assert salvaged.is_complete and salvaged.steps.tolist() == [0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15]
    rec._writer._lock.release(False)


# ---- deleted and foreign segments --------------------------------------------------------------------------------
def test_a_deleted_newest_segment_of_a_killed_trial_is_noticed_through_the_lock(tmp_path: Path) -> None:
    record_and_die(tmp_path, steps=20, flush_every=5)
    trial = tmp_path / "t"
    newest = max(p for p in trial.iterdir() if p.name.startswith("seg-"))
    newest.unlink()
    with pytest.raises(CorruptRecordingError, match=r"segment files are missing \(deleted\?\) steps after step 14"):
        open_recording(trial)
    with pytest.raises(CorruptRecordingError):
        Recorder(tmp_path, trial="t", mode="a")  # a damaged trial is repaired first, never continued


def test_a_foreign_merged_file_cannot_hide_the_trials_own_steps(tmp_path: Path) -> None:
    record(tmp_path, "t", steps=8, flush_every=2, close=False)
    record(tmp_path, "u", steps=8, flush_every=2, close=False, fanout=2)
    foreign = max((tmp_path / "u").glob("seg-*-L2.h5"))
    shutil.copyfile(foreign, tmp_path / "t" / foreign.name)  # its covers claim our sequences
    with open_recording(tmp_path, "t", damaged="skip") as recording:
        assert recording.steps.tolist() == list(range(8))
        assert [d.kind for d in recording.damage] == ["foreign"]
    assert [d.kind for d in check(tmp_path, "t").trials[0].damage] == ["foreign"]


# ---- a full disk ----------------------------------------------------------------------------------------------
def _train(rec: Recorder, steps: range) -> None:
    for step in steps:
        with rec.step(step):
            rec.register_tensor("x", torch.randn(64, 256))
            rec.record_kpi("loss", float(step))


@pytest.fixture
def small_filesystem(tmp_path: Path):
    """A 3 MiB file system (tmpfs), where this process may mount one; skipped where it may not (CI)."""
    folder = tmp_path / "small"
    folder.mkdir()
    if os.geteuid() != 0 or os.system(f"mount -t tmpfs -o size=3m tmpfs {folder} 2>/dev/null") != 0:
        pytest.skip("mounting a size-limited file system needs root and a system that allows it; the "
                    "injected-ENOSPC and RLIMIT_FSIZE tests cover the same path")
    try:
        yield folder
    finally:
        os.system(f"umount -l {folder}")


def test_a_real_full_disk_keeps_training_and_every_step_once_space_is_back(small_filesystem: Path) -> None:
    filler = small_filesystem / "filler"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rec = Recorder(small_filesystem, trial="t", flush_every_steps=2, flush_every_seconds=1e9, snapshots=None)
        _train(rec, range(4))
        rec.flush()
        free = shutil.disk_usage(small_filesystem).free
        filler.write_bytes(b"\0" * (free - 4096))  # the disk is full now
        _train(rec, range(4, 10))
        rec.flush()  # fails too, and waits for the background write: no partial file may stay
        assert not any(p.name.endswith(schema.TEMP_SUFFIX) for p in (small_filesystem / "t").iterdir())
        filler.unlink()  # space is back
        _train(rec, range(10, 12))
        rec.close()
    messages = [str(w.message) for w in caught if issubclass(w.category, RecorderWarning)]
    assert "No space left on device (ENOSPC)" in messages[0]
    with open_recording(small_filesystem) as recording:
        assert recording.steps.tolist() == list(range(12)) and recording.is_complete
        assert recording.problems() and {p.category for p in recording.problems()} == {schema.PROBLEM_STORAGE}
    assert files_of(small_filesystem / "t") == [schema.FINAL_NAME]


def test_a_file_size_limit_fails_writes_midway_and_is_reported_not_fatal(tmp_path: Path) -> None:
    """``RLIMIT_FSIZE`` makes a write fail past a size (EFBIG) in the middle of a real HDF5 file, like a full
    disk, without needing a mount."""
    script = textwrap.dedent(f"""
        import resource, signal, warnings, torch
        from comgra_ndbg import Recorder
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing us
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            rec = Recorder({str(tmp_path)!r}, "t", flush_every_steps=1, flush_every_seconds=1e9, snapshots=1,
                           max_elements=65536)
            resource.setrlimit(resource.RLIMIT_FSIZE, (60_000, resource.RLIM_INFINITY))
            for step in range(6):
                with rec.step(step):
                    rec.register_tensor("x", torch.randn(256, 256) if step >= 3 else torch.ones(4), batched=False)
            resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
            rec.close()
        print([str(w.message) for w in caught][0])
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "File too large" in done.stdout and "kept in memory" in done.stdout
    with open_recording(tmp_path) as recording:
        assert recording.steps.tolist() == list(range(6)) and recording.is_complete
        assert any("File too large" in p.message for p in recording.problems())
    assert files_of(tmp_path / "t") == [schema.FINAL_NAME]


def test_injected_enospc_in_every_write_loses_only_what_is_reported(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    def full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rec = Recorder(tmp_path, trial="t", flush_every_steps=1, flush_every_seconds=1e9, snapshots=None)
        _train(rec, range(3))
        rec.flush()
        monkeypatch.setattr(writer_module, "write_segment", full)
        _train(rec, range(3, 6))
        rec.close()  # the disk never recovers: these steps are lost, and the report says which
    messages = [str(w.message) for w in caught if issubclass(w.category, RecorderWarning)]
    assert any("3 recorded steps were lost (steps 3–5): they could not be written when the recorder closed" in m
               for m in messages), messages
    with open_recording(tmp_path) as recording:
        assert recording.steps.tolist() == [0, 1, 2] and recording.state == "incomplete"


def test_a_folder_that_turns_read_only_mid_run_is_reported_and_training_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The file system is remounted read-only for a while (a remount cannot be done under a writer that holds
    a file open, so the EROFS its writes then get is injected at the one place files are created)."""
    real_open, read_only = os.open, {"on": False}

    def open_file(path: object, flags: int, *args: object) -> int:
        if read_only["on"] and str(path).endswith(schema.TEMP_SUFFIX):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(segment_module.os, "open", open_file)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rec = Recorder(tmp_path, trial="t", flush_every_steps=1, flush_every_seconds=1e9, snapshots=None)
        _train(rec, range(2))
        rec.flush()
        read_only["on"] = True
        _train(rec, range(2, 4))
        rec.flush()
        read_only["on"] = False
        _train(rec, range(4, 5))
        rec.close()
    messages = [str(w.message) for w in caught if issubclass(w.category, RecorderWarning)]
    assert "Read-only file system" in messages[0] and "kept in memory" in messages[0]
    with open_recording(tmp_path) as recording:
        assert recording.steps.tolist() == list(range(5)) and recording.is_complete


# ---- format version 1 -----------------------------------------------------------------------------------------
def test_version_1_recordings_written_by_the_previous_code_stay_readable(tmp_path: Path) -> None:
    with open_recording(V1, "finished") as recording:
        assert recording.is_complete and recording.steps.tolist() == list(range(6))
        assert recording.step_types == ["even", "odd"] and recording.problems() == []
        np.testing.assert_array_equal(recording.snapshot(4, "x").dense(), np.arange(6.0).reshape(2, 3) * 5)
        assert recording.summary("x", stat="mean")[1].tolist() == [2.5 * (s + 1) for s in range(6)]
        assert [n.text for n in recording.notes] == ["v1 fixture"]
        with h5py.File(recording.files[0], "r") as f:
            assert int(f.attrs[schema.ATTR_FORMAT_VERSION]) == 1
    with open_recording(V1, "killed") as recording:
        assert recording.steps.tolist() == list(range(6)) and recording.state == "incomplete"
    assert check(V1).ok


def test_a_version_1_trial_can_be_continued_into_version_2_files(tmp_path: Path) -> None:
    shutil.copytree(V1 / "killed", tmp_path / "killed")
    with Recorder(tmp_path, trial="killed", mode="a") as rec:
        assert rec.resume_after == 5
        for step in range(6, 9):
            with rec.step(step, "even" if step % 2 == 0 else "odd"):
                rec.register_tensor("x", torch.arange(6.0).reshape(2, 3) * (step + 1), role="input")
    with open_recording(tmp_path, "killed") as recording:
        assert recording.is_complete and recording.steps.tolist() == list(range(9))
        assert recording.summary("x", stat="mean")[1].tolist() == [2.5 * (s + 1) for s in range(9)]
        assert recording.step_types == ["even", "odd"]
    assert check(tmp_path).ok


def test_the_storage_fault_helpers_damage_what_they_say(tmp_path: Path, reference: tuple[Path, dict]) -> None:
    source, _ = reference
    copy = _copy(source, tmp_path)
    before = copy.read_bytes()
    flip_byte(copy, 100)
    after = copy.read_bytes()
    assert [i for i in range(len(before)) if before[i] != after[i]] == [100] and after[100] == before[100] ^ 0xFF
    assert resource.RLIMIT_FSIZE and signal.SIGXFSZ


# ---- what the GUI shows -------------------------------------------------------------------------------------------
def test_the_gui_shows_damage_as_sentences_and_keeps_showing_what_is_readable(tmp_path: Path) -> None:
    from dash import html

    from comgra_ndbg.gui import ids, tabs
    from comgra_ndbg.gui.app import _page, create_app
    from comgra_ndbg.gui.callbacks import update_selection
    from comgra_ndbg.gui.state import ReaderCache

    rec = record(tmp_path, "partly", steps=16, flush_every=4, close=False)
    (tmp_path / "partly" / "seg-00000002-L0.h5").unlink()
    record(tmp_path, "lost", steps=4)
    final = tmp_path / "lost" / schema.FINAL_NAME
    with open(final, "r+b") as f:
        f.truncate(100)
    cache = ReaderCache(tmp_path)
    assert cache.trials == ["partly"] and list(cache.unreadable) == ["lost"]
    page = _page(cache, source=str(tmp_path), interval_ms=1000, has_custom=False)
    banners = [c.children for c in page.children if isinstance(c, html.Div) and c.className == "message error"]
    assert len(banners) == 1 and banners[0].startswith("Trial 'lost' cannot be shown: the recording at")
    assert "Traceback" not in banners[0] and "--salvage" in banners[0]
    store = update_selection(cache, None, None, None)["store"]
    shown = tabs.notes_tab(cache, store, ids.TAB_NOTES)
    texts = [c.children for c in shown.children if isinstance(c, html.Div)]
    assert texts[0] == ("Damaged: segment files: segment files are missing (deleted?) steps between 3 and 8 "
                        "(sequences 2) (no file holds these sequences, though later ones exist)")
    assert cache.recording("partly").steps.tolist() == [0, 1, 2, 3] + list(range(8, 16))
    with pytest.raises(CorruptRecordingError, match="recording.h5: the file cannot be read"):
        create_app(tmp_path / "lost")  # nothing readable: the CLI prints this sentence and exits with 2
    rec._writer._lock.release(False)


def test_check_of_a_live_trial_while_its_writer_merges_finds_no_damage(tmp_path: Path) -> None:
    """Merges delete their inputs while check() reads them: a vanished file is a stale listing, not damage."""
    import threading

    rec = Recorder(tmp_path, trial="t", flush_every_steps=1, flush_every_seconds=1e9, snapshots=None)
    rec._writer.fanout = rec._writer._merger.fanout = 2
    done = threading.Event()

    def train() -> None:
        _train(rec, range(60))
        done.set()

    worker = threading.Thread(target=train)
    worker.start()
    reports = []
    while not done.is_set():
        reports.append(check(tmp_path) if any((tmp_path / "t").glob("seg-*.h5")) else None)
    worker.join()
    rec.close()
    checked = [r for r in reports if r is not None]
    assert checked and all(r.ok for r in checked), next(str(r) for r in checked if not r.ok)

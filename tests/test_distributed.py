"""Distributed runs: one recording per rank, read as one trial, checked across ranks.

The first test trains a real two-rank DDP job (gloo on the CPU, ``tests/ddp_run.py``); the others build
rank recordings in-process (the rank from ``RANK``/``WORLD_SIZE``, which is how a recorder created before
``init_process_group`` finds it) and call the pure cross-rank checks on hand-made arrays.
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from torch import nn

from comgra_ndbg import Recorder, analyze, open_recording
from comgra_ndbg.analysis.ranks import RankRun, RankThresholds, check_ranks, rank_diagnosis
from comgra_ndbg.cli import main
from comgra_ndbg.errors import InvalidArgumentError, RecordingExistsError, UnknownSeriesError
from comgra_ndbg.recorder.distributed import detect_rank, is_ddp_wrapped, shared_trial_name
from comgra_ndbg.store import schema
from comgra_ndbg.store.ranks import RANKS_FILE, rank_folders
from comgra_ndbg.store.reader import list_trials

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- a real two-process DDP run -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ddp_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("ddp")
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "ddp_run.py"), str(folder), str(_free_port())],
                          env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return folder


def test_healthy_ddp_run_records_both_ranks_in_sync(ddp_runs: Path) -> None:
    assert sorted(list_trials(ddp_runs)) == ["desync", "healthy", "partial", "stall"]  # one per run, not per rank
    assert sorted(p.name for p in (ddp_runs / "healthy").iterdir()) == ["rank0", "rank1", RANKS_FILE]
    with open_recording(ddp_runs, "healthy") as recording:
        assert (recording.rank, recording.ranks, recording.world_size, recording.ddp_wrapped) == (0, [0, 1], 2, True)
        with recording.with_rank(1) as other:
            assert other.rank == 1 and other.config["rank"] == 1 and other.config["world_size"] == 2
            assert other.steps.tolist() == recording.steps.tolist() == [0, 1, 2, 3]
            for tensor in ("model.0.weight", "model.2.bias"):  # the same names with and without the wrapper
                mine, theirs = recording.summary_rows(tensor), other.summary_rows(tensor)
                np.testing.assert_array_equal(mine[1], theirs[1])  # bit for bit: DDP keeps them equal
            assert recording.kpi("loss")[1].tolist() != other.kpi("loss")[1].tolist()  # own data shards
    diagnosis = analyze(ddp_runs, trial="healthy")
    assert diagnosis.hypotheses == ()  # no false alarm, across ranks or within rank 0
    assert not [e for e in diagnosis.events if e.family == "rank_consistency"]


def test_parameter_edited_on_one_rank_is_a_desync(ddp_runs: Path) -> None:
    with open_recording(ddp_runs, "desync") as recording:
        rank0, rank1 = recording.summary_rows("model.0.weight"), recording.with_rank(1).summary_rows("model.0.weight")
        np.testing.assert_array_equal(rank0[1][:2], rank1[1][:2])  # equal before the edit
    diagnosis = analyze(ddp_runs, trial="desync")
    top = diagnosis.hypotheses[0]
    assert (top.type, top.node, top.onset) == ("rank_desync", "model.0", 2)
    assert "'model.0.weight' differs between ranks from step 2" in top.sentence and top.remedy
    assert "ranks 0 and 1" in top.sentence


def test_a_rank_that_left_its_loop_early_is_a_stalled_rank(ddp_runs: Path) -> None:
    diagnosis = analyze(ddp_runs, trial="stall")
    ranked = [h for h in diagnosis.hypotheses if h.type.startswith(("rank", "partial"))]
    assert [(h.type, h.onset) for h in ranked] == [("rank_stalled", 2)]  # no desync: the parameters stayed equal
    assert "rank 1 stopped after step 1 while another rank reached step 3" in ranked[0].sentence


def test_recording_adds_no_collective_call(ddp_runs: Path) -> None:
    for rank in (0, 1):
        counted = json.loads((ddp_runs / f"collectives{rank}.json").read_text())
        assert counted["probe"] == ["barrier"]  # the counting sees a collective where there is one
        assert counted["recorded"] == counted["bare"]  # the same loop with NeuralDbg calls no more of them


def test_ddp_on_one_rank_only_is_partial_wrapping(ddp_runs: Path) -> None:
    with open_recording(ddp_runs, "partial") as recording:
        assert recording.ddp_wrapped is True and recording.with_rank(1).ddp_wrapped is False
    diagnosis = analyze(ddp_runs, trial="partial", store=False)
    top = diagnosis.hypotheses[0]
    assert (top.type, top.origin, top.onset) == ("partial_ddp", "architecture", 0)
    assert "wrapped in DistributedDataParallel on rank 0 but not on rank 1" in top.sentence
    assert not any(h.type == "rank_desync" for h in diagnosis.hypotheses)  # explained by the partial wrapping
    assert [e.to_state for e in diagnosis.events if e.family == "rank_consistency"][:2] == ["partial_ddp", "desync"]


def test_explain_prints_the_cross_rank_hypothesis_without_a_node(ddp_runs: Path,
                                                                 capsys: pytest.CaptureFixture) -> None:
    assert main(["explain", str(ddp_runs), "--trial", "partial"]) == 0
    out = capsys.readouterr().out
    assert "  1. [partial_ddp, origin architecture, step 0, confidence 0.95]" in out  # not "the optimizer"


def test_info_prints_the_ranks(ddp_runs: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["info", str(ddp_runs / "healthy")]) == 0
    out = capsys.readouterr().out
    assert "2 ranks of world size 2" in out
    assert "rank 0: 4 recorded steps, last step 3, finished, DDP" in out
    assert "rank 1: 4 recorded steps, last step 3, finished, DDP" in out


# ---- the layout, in-process --------------------------------------------------------------------------------
def _record(folder: Path, rank: int, monkeypatch: pytest.MonkeyPatch, *, steps: int = 3, edit_at: int | None = None,
            ddp_wrapped: bool | None = None, trial: str | None = "run", world: int = 2, loss_scale: float = 1.0) -> Path:
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))
    torch.manual_seed(0)
    layer = nn.Linear(3, 2)
    with Recorder(folder, trial, ddp_wrapped=ddp_wrapped) as rec:
        rec.track_module("model", layer)
        for step in range(steps):
            with rec.step(step):
                rec.record_kpi("loss", (loss_scale if step >= 3 else 1.0) / (step + 1))
            with torch.no_grad():
                layer.weight.mul_(0.9)
                if edit_at is not None and step + 1 >= edit_at:
                    layer.weight[0, 0] += 0.5 * (step + 2 - edit_at)
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    return rec.path


def test_each_rank_records_its_own_folder_with_rank_and_world_size(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    paths = [_record(tmp_path, rank, monkeypatch, ddp_wrapped=True) for rank in (1, 0)]
    assert paths == [tmp_path / "run" / "rank1", tmp_path / "run" / "rank0"]
    with h5py.File(paths[0] / schema.FINAL_NAME, "r") as f:
        config = json.loads(f.attrs[schema.ATTR_CONFIG])
    assert (config["rank"], config["world_size"], config["ddp_wrapped"], config["rank_source"]) == (1, 2, True, "env")
    assert list(rank_folders(tmp_path / "run")) == [0, 1]
    assert json.loads((tmp_path / "run" / RANKS_FILE).read_text()) == {"world_size": 2}
    assert list_trials(tmp_path) == ["run"]
    with open_recording(tmp_path) as recording:
        assert (recording.trial, recording.rank, recording.ranks, recording.trial_folder) == ("run", 0, [0, 1],
                                                                                             tmp_path / "run")
        assert "rank=0" in repr(recording)
    with open_recording(tmp_path / "run" / "rank1") as recording:  # a rank folder opens that rank of its trial
        assert (recording.trial, recording.rank, recording.ranks) == ("run", 1, [0, 1])
    with open_recording(tmp_path, "run", rank=1) as recording:
        assert recording.location == paths[0] and recording.steps.tolist() == [0, 1, 2]
        with pytest.raises(UnknownSeriesError, match=r"no rank 7; its ranks are \[0, 1\]"):
            recording.with_rank(7)
    with pytest.raises(UnknownSeriesError, match=r"has no rank 2; its ranks are \[0, 1\]"):
        open_recording(tmp_path, rank=2)
    with pytest.raises(InvalidArgumentError, match="rank must be an int"):
        open_recording(tmp_path, rank="1")


def test_single_process_trials_have_no_ranks(tmp_path: Path) -> None:
    with Recorder(tmp_path, "solo") as rec:
        with rec.step(0):
            rec.record_kpi("loss", 1.0)
    with open_recording(tmp_path) as recording:
        assert (recording.rank, recording.ranks, recording.world_size, recording.ddp_wrapped) == (None, [], 1, None)
        with pytest.raises(UnknownSeriesError, match="single process"):
            recording.with_rank(0)
    with pytest.raises(UnknownSeriesError, match="single process; it has no rank 0"):
        open_recording(tmp_path, rank=0)


def test_single_process_trials_named_like_ranks_stay_trials_of_their_group(tmp_path: Path) -> None:
    for name in ("rank0", "rank1"):
        with Recorder(tmp_path, name) as rec:
            with rec.step(0):
                rec.record_kpi("loss", 1.0)
    assert list_trials(tmp_path) == ["rank0", "rank1"]
    with open_recording(tmp_path / "rank1") as recording:
        assert (recording.trial, recording.ranks) == ("rank1", [])


def test_ranks_refuse_a_trial_folder_of_a_single_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with Recorder(tmp_path, "run") as rec:
        with rec.step(0):
            rec.record_kpi("loss", 1.0)
    with pytest.raises(RecordingExistsError, match="single process"):
        _record(tmp_path, 0, monkeypatch)


def test_per_rank_false_records_like_a_single_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with Recorder(tmp_path, "mine", per_rank=False) as rec:
        with rec.step(0):
            rec.record_kpi("loss", 1.0)
    assert rec.path == tmp_path / "mine" and (tmp_path / "mine" / schema.FINAL_NAME).exists()


def test_rank_detection_from_the_environment() -> None:
    assert detect_rank({"RANK": "0", "WORLD_SIZE": "1"}) is None  # one process is no distributed run
    assert detect_rank({"RANK": "2", "WORLD_SIZE": "2"}) is None  # out of range: recorded as one process
    assert detect_rank({"RANK": "x", "WORLD_SIZE": "2"}) is None
    info = detect_rank({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "TORCHELASTIC_RUN_ID": "job/7"})
    assert (info.rank, info.world_size, info.local_rank, info.run_id) == (3, 4, 1, "job/7")
    assert shared_trial_name(info) == "trial-job-7"
    other = detect_rank({"RANK": "0", "WORLD_SIZE": "4", "TORCHELASTIC_RUN_ID": "none"})
    assert other.run_id is None
    name = shared_trial_name(other, {"MASTER_PORT": "29500"})
    assert name == shared_trial_name(other, {"MASTER_PORT": "29500"}) and name.endswith("-29500")
    assert not is_ddp_wrapped(nn.Linear(2, 2))


def test_default_trial_name_is_shared_by_the_ranks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "abc123")
    for rank in (0, 1):
        _record(tmp_path, rank, monkeypatch, trial=None)
    assert list_trials(tmp_path) == ["trial-abc123"]
    assert list(rank_folders(tmp_path / "trial-abc123")) == [0, 1]


def test_analyze_merges_cross_rank_findings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _record(tmp_path, 0, monkeypatch, steps=6, ddp_wrapped=True)
    _record(tmp_path, 1, monkeypatch, steps=6, ddp_wrapped=False, edit_at=2)
    diagnosis = analyze(tmp_path)
    top = diagnosis.hypotheses[0]
    assert (top.type, top.origin, top.onset) == ("partial_ddp", "architecture", 0)
    assert "wrapped in DistributedDataParallel on rank 0 but not on rank 1" in top.sentence
    assert not any(h.type == "rank_desync" for h in diagnosis.hypotheses)  # the partial wrapping explains it
    checks = [e.to_state for e in diagnosis.events if e.family == "rank_consistency"]
    assert checks == ["partial_ddp", "desync"]
    assert [e for e in diagnosis.events if e.to_state == "desync"][0].onset == 2
    with open_recording(tmp_path, rank=1) as recording:  # stored with the rank it was asked of, rank 0 by default
        assert recording.analysis() is None
    assert open_recording(tmp_path).analysis() is not None


# ---- the pure checks ----------------------------------------------------------------------------------------
def _runs(num: int = 3, per_rank: dict[int, dict] | None = None, steps: int = 10) -> list[RankRun]:
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(steps, schema.NUM_FIELDS))
    rows[:, :3] = [64, 0, 0]
    runs = []
    for rank in range(num):
        fields = dict(steps=np.arange(steps), fingerprints={"net.w": (np.arange(steps), rows.copy())}, ddp_wrapped=True,
                      loss=(np.arange(steps), np.linspace(1.0, 0.5, steps) * (1 + 0.05 * rank)),
                      grad_norm=(np.arange(steps), np.full(steps, 2.0 + 0.1 * rank)))
        fields.update((per_rank or {}).get(rank, {}))
        runs.append(RankRun(rank, **fields))
    return runs


def test_healthy_ranks_have_no_finding() -> None:
    assert check_ranks(_runs()) == ()
    assert check_ranks(_runs(1)) == ()  # one rank: nothing to compare


def test_desync_names_the_rank_unlike_the_majority_and_respects_rtol() -> None:
    runs = _runs()
    runs[2].fingerprints["net.w"][1][6:, 5] *= 1 + 1e-6
    found = check_ranks(runs)
    assert [(f.check, f.ranks, f.onset, f.subject) for f in found] == [("desync", (2,), 6, "net.w")]
    assert found[0].magnitude == pytest.approx(1e-6, rel=1e-3)
    assert check_ranks(runs, RankThresholds(rtol=1e-5)) == ()
    tiny = _runs()
    tiny[1].fingerprints["net.w"][1][3:, 5] *= 1 + 1e-11  # float64 noise well below 1e-8
    assert check_ranks(tiny) == ()
    events, hypotheses = rank_diagnosis(found, last_step=9)
    assert hypotheses[0].type == "rank_desync" and hypotheses[0].node == "net" and events[0].end == 9
    assert "rank 2 against ranks 0 and 1" in hypotheses[0].sentence


def test_a_nan_on_one_rank_only_is_a_desync_of_the_counts() -> None:
    runs = _runs(2)
    runs[1].fingerprints["net.w"][1][4:, schema.FIELD["nan"]] = 1
    assert [(f.check, f.ranks, f.onset) for f in check_ranks(runs)] == [("desync", (0, 1), 4)]


def test_separate_models_without_ddp_are_no_desync() -> None:
    runs = _runs(2, {r: {"ddp_wrapped": False} for r in range(2)})
    runs[1].fingerprints["net.w"][1][:, 4] += 1.0  # different from the first step on: two models on purpose
    assert check_ranks(runs) == ()
    runs = _runs(2, {r: {"ddp_wrapped": False} for r in range(2)})
    runs[1].fingerprints["net.w"][1][5:, 4] += 1.0  # equal first, apart later: a sync that broke, or none
    found = check_ranks(runs)
    assert [f.check for f in found] == ["desync"] and "no rank wraps the model" in found[0].message


def test_partial_wrapping_diverging_ranks_and_stalls() -> None:
    found = check_ranks(_runs(3, {1: {"ddp_wrapped": False}}))
    assert [(f.check, f.ranks, f.onset) for f in found] == [("partial_ddp", (1,), 0)]
    steps = np.arange(10)
    loss = np.concatenate([np.linspace(1.0, 0.6, 6), [8.0, 9.0, 10.0, 12.0]])
    found = check_ranks(_runs(3, {0: {"loss": (steps, loss)}}))
    assert [(f.check, f.ranks, f.onset) for f in found] == [("diverging_loss", (0,), 6)]
    grads = np.full(10, 2.0)
    grads[7] = np.inf
    found = check_ranks(_runs(3, {2: {"grad_norm": (steps, grads)}}))
    assert [(f.check, f.ranks, f.onset) for f in found] == [("diverging_gradients", (2,), 7)]
    short = {"steps": np.arange(6), "state": "killed"}
    found = check_ranks(_runs(2, {1: short}))
    assert [(f.check, f.ranks, f.onset, f.magnitude) for f in found] == [("stalled", (1,), 6, 4.0)]
    assert "rank 1 stopped after step 5 while another rank reached step 9" in found[0].message
    assert check_ranks(_runs(2, {1: {"steps": np.arange(6), "state": "live"}})) == ()  # still flushing


def test_only_the_odd_rank_diverges_and_two_ranks_are_named_together() -> None:
    steps = np.arange(10)
    loss = np.linspace(1.0, 0.5, 10)
    loss[6:] *= 1000.0  # rank 1 reads a broken shard from step 6 on
    found = check_ranks(_runs(3, {1: {"loss": (steps, loss)}}))
    assert [(f.check, f.ranks, f.onset) for f in found] == [("diverging_loss", (1,), 6)]  # not ranks 0 and 2
    assert "rank 1 stands 909× the median of the ranks from step 6 on" in found[0].message  # 1000 / 1.1, rank 2's
    found = check_ranks(_runs(2, {1: {"loss": (steps, loss)}}))
    assert [(f.check, f.ranks, f.onset) for f in found] == [("diverging_loss", (0, 1), 6)]  # one finding, no majority
    assert "rank 1 stands 1e+03× rank 0's" in found[0].message and "either may be the odd one" in found[0].message
    low = _runs(2, {0: {"loss": (steps, np.linspace(1.0, 0.5, 10) * np.where(steps >= 6, 1e-3, 1.0))}})
    assert [(f.ranks, f.magnitude > 900) for f in check_ranks(low)] == [((0, 1), True)]


def test_analyze_names_the_rank_whose_loss_went_its_own_way(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for rank in (0, 1, 2):
        _record(tmp_path, rank, monkeypatch, steps=8, world=3, ddp_wrapped=True, loss_scale=300.0 if rank == 2 else 1.0)
    ranked = [h for h in analyze(tmp_path, store=False).hypotheses if h.type == "rank_divergence"]
    assert [(h.onset, "loss of rank 2 stands 300× the median" in h.sentence) for h in ranked] == [(3, True)]


def test_check_reads_every_rank_of_a_distributed_trial(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from comgra_ndbg.store.check import check

    for rank in (0, 1):
        _record(tmp_path, rank, monkeypatch)
    with Recorder(tmp_path, "solo") as rec:
        with rec.step(0):
            rec.record_kpi("loss", 1.0)
    report = check(tmp_path)
    assert [(t.trial, t.state, t.steps) for t in report.trials] == [("run/rank0", "finished", 3),
                                                                   ("run/rank1", "finished", 3),
                                                                   ("solo", "finished", 1)]
    assert report.ok


def test_ranks_without_a_recording_or_unreadable_are_noted_not_fatal(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    for rank in (0, 1, 2):
        _record(tmp_path, rank, monkeypatch, world=4, ddp_wrapped=True)
    (tmp_path / "run" / "rank2" / schema.FINAL_NAME).write_bytes(b"not a recording")
    diagnosis = analyze(tmp_path)
    assert diagnosis.hypotheses == ()
    assert any(note.startswith("rank 3 of 4 has no recording") for note in diagnosis.notes)
    assert any(note.startswith("rank 2 could not be read") for note in diagnosis.notes)

"""The byte budget: snapshots stay within it on disk, summaries of every step are kept, what it dropped is
in the recording's log, flight-recorder dumps may spend its reserve, and small models record as before."""
from __future__ import annotations

import logging
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from torch import nn

from comgra_ndbg import NeuralDbg, cli, open_recording
from comgra_ndbg.errors import InvalidArgumentError
from comgra_ndbg.recorder.budget import ByteBudget, SnapshotBudget, shrink, snapshot_bytes
from comgra_ndbg.recorder.flight import FlightRecorder
from comgra_ndbg.recorder.recorder import Recorder
from comgra_ndbg.recorder.step_record import StepRecord
from comgra_ndbg.store import schema
from comgra_ndbg.store.segment import SnapshotData

STEPS = 40
SMALL = ByteBudget(run_bytes=160 * 1024, step_bytes=24 * 1024, reserve=0.25, decay=0.5)


def tensor_at(step: int, name: int) -> torch.Tensor:
    """A deterministic [32, 200] activation of step ``step``: every element distinct."""
    base = torch.arange(32 * 200, dtype=torch.float32).view(32, 200) / 1000.0
    return base * (1 + 0.01 * step) + name


def record(folder: Path, trial: str, *, nan_at: int | None = None, **options) -> Path:
    with Recorder(folder, trial, snapshots=2, **options) as rec:
        for step in range(STEPS):
            with rec.step(step):
                for name in range(4):
                    x = tensor_at(step, name)
                    if step == nan_at and name == 0:
                        x = x.clone()
                        x[0, 0] = float("nan")
                    rec.register_tensor(f"t{name}", x, role="intermediate")
    return folder / trial / "recording.h5"


def snapshot_disk_bytes(path: Path) -> int:
    """Bytes the file's snapshot datasets take on disk."""
    total = 0
    with h5py.File(path, "r") as f:
        def visit(name: str, obj: object) -> None:
            nonlocal total
            if isinstance(obj, h5py.Dataset) and name.startswith("snapshot/"):
                total += obj.id.get_storage_size()
        f.visititems(visit)
    return total


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("budget")
    return {"small": record(folder, "small", byte_budget=SMALL),
            "unbounded": record(folder, "unbounded", byte_budget=None),
            "default": record(folder, "default")}


def test_a_small_budget_bounds_the_snapshot_bytes_on_disk(runs: dict[str, Path]) -> None:
    unbounded, small = snapshot_disk_bytes(runs["unbounded"]), snapshot_disk_bytes(runs["small"])
    assert unbounded > 3 * SMALL.run_bytes  # the run would not fit without the budget
    assert 0 < small <= SMALL.run_bytes
    with open_recording(runs["small"].parent.parent, trial="small") as rec:
        steps = rec.snapshot_steps("t0")
        assert 1 < len(steps) < STEPS // 2  # some snapshots kept, the frequency backed off
        gaps = np.diff(steps)
        assert gaps[-1] > gaps[0]  # later snapshots are further apart


def test_summaries_of_every_step_are_kept_unchanged(runs: dict[str, Path]) -> None:
    group = runs["small"].parent.parent
    with open_recording(group, trial="small") as small, open_recording(group, trial="unbounded") as full:
        for stat in ("mean", "max"):
            steps, values = small.summary("t2", "value", stat)
            full_steps, full_values = full.summary("t2", "value", stat)
            assert steps.tolist() == list(range(STEPS)) == full_steps.tolist()
            np.testing.assert_array_equal(values, full_values)


def test_shrunk_snapshots_hold_true_values_at_their_indices(runs: dict[str, Path]) -> None:
    with open_recording(runs["small"].parent.parent, trial="small") as rec:
        step = int(rec.snapshot_steps("t1")[0])
        snap = rec.snapshot(step, "t1")
    full = tensor_at(step, 1)
    assert snap.value_index is not None and len(snap.values) < 8 * 200
    assert len(snap.sample_index) < 8  # samples sub-sampled too
    flat = full[: len(snap.sample_index)].reshape(-1).numpy()
    np.testing.assert_array_equal(snap.values, flat[snap.value_index])


def test_what_the_budget_dropped_is_logged_and_shown_by_info(runs: dict[str, Path],
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    group = runs["small"].parent.parent
    with open_recording(group, trial="small") as rec:
        log = rec.log(schema.LOG_BUDGET)
        assert rec.problems() == []  # the budget working as set is not a problem
    messages = [entry.message for entry in log]
    assert any("backed off to one in 2 of the snapshots" in m for m in messages)
    final = log[-1]
    assert final.step == STEPS - 1 and "policy snapshots skipped by back-off" in final.message
    assert final.detail["shrunk"] > 0 and final.detail["skipped"] > 0
    assert cli.main(["info", str(group)]) == 0
    out = capsys.readouterr().out
    assert "budget:" in out and "skipped by back-off" in out


def test_small_models_record_as_before_with_the_default(runs: dict[str, Path]) -> None:
    group = runs["small"].parent.parent
    with open_recording(group, trial="default") as rec, open_recording(group, trial="unbounded") as full:
        assert rec.snapshot_steps("t3").tolist() == list(range(0, STEPS, 2)) == full.snapshot_steps("t3").tolist()
        a, b = rec.snapshot(38, "t3"), full.snapshot(38, "t3")
        np.testing.assert_array_equal(a.values, b.values)
        assert len(a.sample_index) == 8
        assert rec.log() == []  # the budget changed nothing, so it wrote nothing into the log
        assert rec.config["byte_budget"].startswith("ByteBudget(run_bytes=268435456, step_bytes=1048576")


def test_the_budget_is_announced_when_recording_starts(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    with caplog.at_level(logging.INFO, logger="comgra_ndbg"):
        Recorder(tmp_path, "printed", byte_budget=SMALL).close()
        Recorder(tmp_path, "unbounded", byte_budget=None).close()
    assert "printed: byte budget: snapshots at most 160.0 KiB per run (25% of it kept for flight-recorder dumps) " \
           "and 24.0 KiB per step; summaries are always kept" in caplog.text
    assert "unbounded" not in caplog.text
    assert capsys.readouterr().err == ""  # the training script's own output stays its own
    monkey = pytest.MonkeyPatch()
    monkey.chdir(tmp_path)  # NeuralDbg without a path records under ./runs and says where, with the budget
    try:
        NeuralDbg(nn.Linear(2, 2)).close()
    finally:
        monkey.undo()
    out = capsys.readouterr().out
    assert out.startswith(f"comgra_ndbg: recording to {tmp_path / 'runs'}") and "(byte budget: snapshots at most " \
        "256.0 MiB per run" in out


def test_flight_recorder_dumps_spend_the_reserve(tmp_path: Path) -> None:
    budget = ByteBudget(run_bytes=96 * 1024, step_bytes=24 * 1024, reserve=0.5, decay=0.0)
    path = record(tmp_path, "flight", nan_at=30, byte_budget=budget,
                  flight_recorder=FlightRecorder(steps=3, after=0))
    with open_recording(tmp_path, trial="flight") as rec:
        steps = rec.snapshot_steps("t0").tolist()
        assert rec.triggers and rec.triggers[0].step == 30
        kept = {step: len(rec.snapshot(step, "t0").values) for step in steps}
    policy = [s for s in steps if s < 27]
    assert policy and max(policy) < 20  # the policy's share ran out early
    assert {27, 28, 29, 30} <= set(steps)  # the ring before the trigger, written from the reserve
    # spent from the trigger backwards: the steps closest to it keep more when the reserve runs short
    assert kept[30] >= kept[29] >= kept[28] >= kept[27] and kept[30] > kept[27]
    assert snapshot_disk_bytes(path) <= budget.run_bytes


def test_bad_budgets_raise_typed_errors(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="byte_budget must be"):
        Recorder(tmp_path, "bad", byte_budget="2GB")
    with pytest.raises(InvalidArgumentError, match="at least 1024 bytes"):
        ByteBudget(run_bytes=10)
    with pytest.raises(InvalidArgumentError, match="exceeds run_bytes"):
        ByteBudget(run_bytes=4096, step_bytes=8192)
    with pytest.raises(InvalidArgumentError, match="reserve must be"):
        ByteBudget(reserve=1.5)


def test_back_off_spends_at_most_the_policy_share() -> None:
    budget = SnapshotBudget(ByteBudget(run_bytes=100_000, step_bytes=5_000, reserve=0.2, decay=0.7))
    data = SnapshotData((16, 60), np.arange(4), np.zeros((4, schema.NUM_FIELDS)), np.ones(240, np.float32), None)
    taken = 0
    for step in range(5_000):
        if budget.admit():
            fitted, _ = budget.fit(StepRecord(step, 0, 1, "", 0.0, snapshots=[(0, 0, data)]), preferred=False)
            taken += bool(fitted.snapshots)
    assert budget.policy_spent <= 80_000 and budget.spent == budget.policy_spent
    assert taken == budget.policy_spent // snapshot_bytes(data)
    assert budget.interval > 1 and budget.skipped > 0


def test_shrink_keeps_a_batch_less_snapshot_evenly() -> None:
    data = SnapshotData((10,), np.zeros(0, np.int64), np.zeros((0, schema.NUM_FIELDS)),
                        np.arange(10, dtype=np.float32), None)
    small = shrink(data, 0.3)
    assert small.values.tolist() == [0.0, 4.0, 9.0] and small.value_index.tolist() == [0, 4, 9]
    assert shrink(data, 1.0) is data


def test_later_snapshots_are_taken_at_the_fraction_that_fitted(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from comgra_ndbg.recorder import budget as budget_module
    shrunk_steps: list[int] = []
    original = SnapshotBudget._shrink

    def counting(self: SnapshotBudget, record: StepRecord, total: int, limit: int):
        shrunk_steps.append(record.step)
        return original(self, record, total, limit)

    monkeypatch.setattr(budget_module.SnapshotBudget, "_shrink", counting)
    bound = ByteBudget(run_bytes=64 * 2**20, step_bytes=24 * 1024)
    with Recorder(tmp_path, "scaled", snapshots=2, byte_budget=bound) as rec:
        for step in range(12):
            with rec.step(step):
                for name in range(4):
                    rec.register_tensor(f"t{name}", tensor_at(step, name), role="intermediate")
        scale = rec._budget.scale
    assert shrunk_steps == [0]  # the first snapshot step learned the fraction; the others were taken at it
    assert scale < 1.0
    with open_recording(tmp_path, trial="scaled") as recording:
        steps = recording.snapshot_steps("t1").tolist()
        assert steps == list(range(0, 12, 2))
        for step in steps[1:]:
            snap = recording.snapshot(step, "t1")
            assert 0 < len(snap.sample_index) < 8 and len(snap.values) < 8 * 200  # taken sub-sampled
            flat = tensor_at(step, 1)[: len(snap.sample_index)].reshape(-1).numpy()
            expected = flat if snap.value_index is None else flat[snap.value_index]
            np.testing.assert_array_equal(snap.values, expected)  # true values where they claim to be
            total = sum(snapshot_bytes(SnapshotData((32, 200), s.sample_index,
                                                     np.zeros((len(s.sample_index), schema.NUM_FIELDS)), s.values,
                                                     s.value_index))
                        for s in (recording.snapshot(step, f"t{n}") for n in range(4)))
            assert total <= bound.step_bytes


def test_the_scale_grows_back_when_snapshots_get_smaller() -> None:
    budget = SnapshotBudget(ByteBudget(run_bytes=10 * 2**20, step_bytes=8_000))
    big = SnapshotData((4000,), np.zeros(0, np.int64), np.zeros((0, schema.NUM_FIELDS)),
                       np.ones(4000, np.float32), None)
    fitted, _ = budget.fit(StepRecord(0, 0, 1, "", 0.0, snapshots=[(0, 0, big)]), preferred=False)
    assert budget.scale == 0.125 and len(fitted.snapshots[0][2].values) == 500  # with its index, 6 064 bytes
    assert budget.take_limits(8, 4096) == (3, 512)
    small = SnapshotData((100,), np.zeros(0, np.int64), np.zeros((0, schema.NUM_FIELDS)),
                         np.ones(100, np.float32), None)
    budget.fit(StepRecord(1, 0, 1, "", 0.0, snapshots=[(0, 0, small)]), preferred=False)
    assert budget.scale == 0.25  # more than half the room was left: twice as much next time
    for step in (2, 3, 4):
        budget.fit(StepRecord(step, 0, 1, "", 0.0, snapshots=[(0, 0, small)]), preferred=False)
    assert budget.scale == 1.0 and budget.take_limits(8, 4096) == (8, 4096)

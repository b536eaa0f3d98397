"""The peers benchmark's runners and accounting (benchmarks/peer_runners.py, peer_accounting.py, peer_table.py).

Each runner trains a tiny MLP for 11 steps (its every-10th-step peers record steps 0 and 10) into a real
folder; the tests check what was written and how it is counted, never how fast.
"""
from __future__ import annotations

import importlib.util

import h5py
import pytest
import torch
from torch import nn

from benchmarks import peer_runners
from benchmarks.peer_accounting import Recorded, from_counts, recording_summaries
from benchmarks.peer_table import rotated, run_once, summarize, table
from comgra_ndbg import NeuralDbg, RecordingFormatError, open_recording
from comgra_ndbg.store.schema import ATTR_PARTS, FINAL_NAME, NUM_FIELDS

STEPS = 11
# leaf modules: Linear, Tanh, Linear; parameters: two weights, two biases
LEAF_OUTPUTS, PARAMETERS = 3, 4


def tiny_model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


def tiny_data(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(4, 8, generator=g), torch.randint(0, 4, (4,), generator=g)) for _ in range(steps)]


@pytest.fixture
def tiny(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setitem(peer_runners.WORKLOADS, "tiny", (tiny_model, tiny_data))
    return "tiny"


def needs(peer: str) -> None:
    package = peer_runners.OPTIONAL.get(peer)
    if package is not None:
        pytest.importorskip(package)


def check_formula(recorded: Recorded) -> None:
    assert recorded.information == round(recorded.tensors * recorded.statistics * recorded.steps)


def test_bare_writes_and_records_nothing(tiny, tmp_path):
    run = peer_runners.train("bare", tiny, STEPS, tmp_path)
    assert run.bytes_written == 0
    assert run.recorded == Recorded(tensors=0, statistics=0.0, steps=0)
    assert run.steps == run.timed_steps == STEPS and run.total_s > 0  # short runs are timed from step 0


@pytest.mark.parametrize("peer, steps", [("ndbg-defaults", STEPS), ("ndbg-all-every-step", STEPS),
                                         ("ndbg-all-every-10th", 2)])
def test_neuraldbg_counts_its_summaries(tiny, tmp_path, peer, steps):
    run = peer_runners.train(peer, tiny, STEPS, tmp_path)
    assert run.bytes_written > 0
    assert run.recorded.statistics == NUM_FIELDS
    assert run.recorded.steps == steps
    # every leaf output and the parameters, values and gradients, parameter updates, input, target, loss
    assert run.recorded.tensors >= 2 * LEAF_OUTPUTS + 3 * PARAMETERS
    check_formula(run.recorded)


def test_neuraldbg_counts_the_rows_of_updates_measured_at_some_steps(tiny, tmp_path):
    """The defaults measure parameter updates at some steps only: those series count where they have rows."""
    run = peer_runners.train("ndbg-defaults", tiny, 40, tmp_path)
    with open_recording(tmp_path / "run") as recording:
        rows = sum(len(recording.summary_rows(recording.catalog.tensors[t].name, kind)[0])
                   for t, kind in recording.catalog.series)
    assert run.recorded.tensors * run.recorded.statistics * run.recorded.steps == pytest.approx(rows * NUM_FIELDS)
    assert run.recorded.statistics < NUM_FIELDS  # updates at 20 + 2 of the 40 steps


def test_neuraldbg_counts_every_part_of_a_recording_closed_into_several_files(tiny, tmp_path, monkeypatch):
    options = dict(summaries=1, snapshots=1, flush_every_steps=2, flush_every_seconds=1e9)
    counted = {}
    for name, cap in [("whole", None), ("parts", 5_000)]:  # 5 kB of arrays: one file per flush of 2 steps
        monkeypatch.setattr(peer_runners.NeuralDbgEveryStep, "options", {**options, "max_file_bytes": cap})
        counted[name] = peer_runners.train("ndbg-all-every-step", tiny, STEPS, tmp_path / name).recorded
        with h5py.File(tmp_path / name / "run" / FINAL_NAME, "r") as f:
            parts = len(f.attrs.get(ATTR_PARTS, ()))
        assert parts == (0 if cap is None else 6)  # steps 0-9 in five files, step 10 in recording.h5
    assert counted["parts"] == counted["whole"]
    assert (counted["whole"].statistics, counted["whole"].steps) == (NUM_FIELDS, STEPS)


def test_counting_a_recording_that_was_not_closed_is_refused(tmp_path):
    model = tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    dbg = NeuralDbg(model, tmp_path, trial="run", optimizer=optimizer, flush_every_steps=1, flush_every_seconds=1e9)
    try:
        for inputs, targets in tiny_data(3):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(inputs), targets).backward()
            optimizer.step()
        with pytest.raises(RecordingFormatError, match="not a closed recording"):
            recording_summaries(tmp_path / "run")
    finally:
        dbg.close()
    assert recording_summaries(tmp_path / "run").steps == 3


def test_tensorboard_histograms_read_back(tiny, tmp_path):
    needs("tensorboard")
    run = peer_runners.train("tensorboard", tiny, STEPS, tmp_path)
    assert run.bytes_written > 0
    assert run.recorded.tensors == LEAF_OUTPUTS + 2 * PARAMETERS
    assert run.recorded.steps == 2
    assert run.recorded.statistics > 5  # count, min, max, sums and at least one bucket
    check_formula(run.recorded)


@pytest.mark.parametrize("peer", ["comgra-default", "comgra-tuned"])
def test_comgra_counts_its_aggregates(tiny, tmp_path, peer):
    needs(peer)
    run = peer_runners.train(peer, tiny, STEPS, tmp_path)
    assert run.bytes_written > 0
    assert run.recorded.steps == 2
    # input, the leaf outputs, the loss and the parameters, each with its gradient
    assert run.recorded.tensors == 2 * (1 + LEAF_OUTPUTS + 1 + PARAMETERS)
    check_formula(run.recorded)


def test_comgra_default_keeps_more_than_tuned(tiny, tmp_path):
    needs("comgra-default")
    default = peer_runners.train("comgra-default", tiny, STEPS, tmp_path / "default")
    tuned = peer_runners.train("comgra-tuned", tiny, STEPS, tmp_path / "tuned")
    assert default.recorded.information > tuned.recorded.information
    assert default.bytes_written > tuned.bytes_written


def test_wandb_watch_histograms_counted(tiny, tmp_path, monkeypatch):
    needs("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    run = peer_runners.train("wandb", tiny, STEPS, tmp_path)
    assert run.bytes_written > 0
    assert run.recorded.tensors == 2 * PARAMETERS  # watch logs parameters and gradients, not activations
    assert run.recorded.steps == 1
    assert run.recorded.statistics == 64 + 65  # counts of 64 bins and their edges
    check_formula(run.recorded)


def test_information_formula():
    assert Recorded(tensors=3, statistics=2.5, steps=4).information == 30
    assert from_counts({"a", "b", "c"}, {0, 10}, 60) == Recorded(tensors=3, statistics=10.0, steps=2)
    assert from_counts(set(), set(), 0).information == 0


def test_rounds_rotate_every_peer_through_every_position():
    peers = ["bare", "x", "y"]
    orders = [rotated(peers, r) for r in range(3)]
    for position in range(3):
        assert sorted(order[position] for order in orders) == sorted(peers)


def result(peer: str, total_s: float, bytes_written: int = 0, recorded: tuple = (0, 0.0, 0)) -> dict:
    tensors, stats, steps = recorded
    return dict(peer=peer, workload="mlp", steps=110, timed_steps=100, total_s=total_s, median_step_s=total_s / 100,
                bytes_written=bytes_written, recorded=dict(tensors=tensors, statistics=stats, steps=steps))


def test_summary_ratios_within_rounds_and_information_per_ms():
    runs = {"bare": [result("bare", 1.0), result("bare", 2.0), result("bare", 1.0)],
            "tensorboard": [result("tensorboard", 1.5, 1000, (10, 20.0, 10)),
                            result("tensorboard", 2.5, 3000, (10, 20.0, 10)),
                            result("tensorboard", 2.0, 2000, (10, 20.0, 10))]}
    bare, peer = summarize(runs)
    assert bare.information_per_ms is None and bare.ratios == [1.0, 1.0, 1.0]
    assert peer.ratios == [1.5, 1.25, 2.0]
    assert peer.mean_ms == [15.0, 25.0, 20.0]
    assert peer.bytes_written == 2000
    # 2000 numbers over a median overhead of 5 ms per step, times 110 steps
    assert peer.information_per_ms == pytest.approx(2000 / 550)
    markdown = table([bare, peer], markdown=True)
    assert markdown[0].startswith("| peer |") and len(markdown) == 4
    assert "1.50x (1.25-2.00)" in markdown[3] and "10 x 20 x 10 = 2,000" in markdown[3] and "| 4 |" in markdown[3]


def test_run_once_in_a_fresh_process():
    run = run_once("bare", "mlp", 2, 1)
    assert run["peer"] == "bare" and run["steps"] == 2 and run["bytes_written"] == 0


def test_missing_peer_package_is_skipped_with_a_message(monkeypatch):
    from benchmarks import peer_table

    real = importlib.util.find_spec
    monkeypatch.setattr(peer_table.importlib.util, "find_spec",
                        lambda name, *args: None if name == "wandb" else real(name, *args))
    kept, skipped = peer_table.available(["bare", "wandb"])
    assert kept == ["bare"] and "wandb is not installed" in skipped[0]

"""Recordings for the GUI tests, made with the real Recorder (imported by the other ``test_gui_*`` files).

``make_recording`` trains a tiny MLP in two trials whose learning rates differ, so every statistic differs
between trials and between steps; every step is summarized and snapshotted. ``make_recurrent`` records a
step with two iterations. ``make_faulty`` records a tanh MLP whose second block saturates at step 10 (its
weights are multiplied by 50), a fault the analysis names. The tests here pin what the others rely on.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

import comgra_ndbg
from comgra_ndbg import Recorder, open_recording

BATCH = 6
NUM_SAMPLES = 4
FAULT_STEP = 10
FAULT_NODE = "hidden1"


def train_steps(recorder: Recorder, model: nn.Sequential, optimizer: torch.optim.Optimizer, steps: range) -> None:
    """Record ``steps`` of training (even steps are of type ``long``, odd ones ``short``) and flush them: a
    live run's periodic flushes are written on a worker thread and land on disk a moment later."""
    for step in steps:
        with recorder.step(step, "short" if step % 2 else "long"):
            x = recorder.register_tensor("input", torch.randn(BATCH, 4), role="input")
            y = recorder.register_tensor("target", torch.randn(BATCH, 2), role="target")
            hidden = recorder.register_tensor("hidden", model[1](model[0](x)))
            output = recorder.register_tensor("output", model[2](hidden), role="output")
            loss = recorder.register_tensor("loss", ((output - y) ** 2).mean(), role="loss")
            optimizer.zero_grad()
            loss.backward()
            recorder.record_gradients()
            optimizer.step()
            recorder.record_kpi("loss", loss)
        if step == 3:
            recorder.add_note("learning rate kept")
    recorder.flush()


def new_model(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))


def make_recording(folder: Path, *, trials: tuple[str, ...] = ("a", "b"), steps: int = 12) -> Path:
    """A group folder with one finished recording per trial; returns ``folder``."""
    for index, trial in enumerate(trials):
        model = new_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * (1 + 4 * index))
        with Recorder(folder, trial=trial, snapshots=1, num_samples=NUM_SAMPLES) as recorder:
            recorder.track_module("model", model)
            train_steps(recorder, model, optimizer, range(steps))
    return folder


def make_recurrent(folder: Path, steps: int = 3) -> Path:
    """One trial whose steps run two iterations: ``state`` is registered in both, ``readout`` in the last."""
    torch.manual_seed(1)
    cell = nn.Linear(3, 3)
    with Recorder(folder, trial="rnn", snapshots=1) as recorder:
        recorder.track_module("cell", cell)
        for step in range(steps):
            with recorder.step(step):
                state = torch.zeros(2, 3)
                for _ in range(2):
                    recorder.start_iteration()
                    state = recorder.register_tensor("state", torch.tanh(cell(state) + 1.0))
                    recorder.finish_iteration()
                readout = recorder.register_tensor("readout", state.sum(), role="loss")
                readout.backward()
                recorder.record_gradients()
    return folder


def make_faulty(folder: Path, *, trial: str = "fault", steps: int = 24) -> Path:
    """One trial of a two-block tanh MLP; from step ``FAULT_STEP`` on the input of block 1 is multiplied by 50
    in the forward pass (a scaling bug), so ``FAULT_NODE`` (its output) saturates. Snapshots every 2 steps;
    returns ``folder``."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    with Recorder(folder, trial=trial, snapshots=2, num_samples=NUM_SAMPLES) as recorder:
        recorder.track_module("model", model)
        for step in range(steps):
            scale = 50.0 if step >= FAULT_STEP else 1.0
            with recorder.step(step):
                x = recorder.register_tensor("input", torch.randn(16, 4), role="input")
                y = recorder.register_tensor("target", torch.randn(16, 2), role="target")
                hidden0 = recorder.register_tensor("hidden0", model[1](model[0](x)))
                hidden1 = recorder.register_tensor(FAULT_NODE, model[3](model[2](hidden0 * scale)))
                output = recorder.register_tensor("output", model[4](hidden1), role="output")
                loss = recorder.register_tensor("loss", ((output - y) ** 2).mean(), role="loss")
                optimizer.zero_grad()
                loss.backward()
                recorder.record_gradients()
                optimizer.step()
                recorder.record_kpi("loss", loss)
    return folder


def test_make_recording_holds_two_trials_with_every_step_snapshotted(tmp_path: Path) -> None:
    make_recording(tmp_path, steps=4)
    recording = open_recording(tmp_path, "b")
    assert recording.trials == ["a", "b"]
    assert recording.steps.tolist() == [0, 1, 2, 3]
    assert recording.snapshot_steps("hidden").tolist() == [0, 1, 2, 3]
    assert recording.snapshot(2, "hidden").sample_index.tolist() == [0, 1, 2, 3]


def test_make_recurrent_records_two_iterations(tmp_path: Path) -> None:
    make_recurrent(tmp_path, steps=1)
    recording = open_recording(tmp_path)
    assert recording.summary_rows("state", iteration=1)[0].tolist() == [0]
    assert recording.summary_rows("readout", iteration=0)[0].tolist() == []


def test_make_faulty_is_diagnosed_as_saturation_of_the_faulty_block(tmp_path: Path) -> None:
    make_faulty(tmp_path)
    diagnosis = comgra_ndbg.analyze(tmp_path, trial="fault", store=False)
    top = diagnosis.top
    assert (top.type, top.origin, top.node, top.onset) == ("saturation", "node", FAULT_NODE, FAULT_STEP)
    assert top.sentence.startswith(f"Saturation originated in '{FAULT_NODE}' at step {FAULT_STEP}")
    assert [(e.family, e.node, e.to_state, e.onset) for e in diagnosis.events] == [
        ("activation_regime", FAULT_NODE, "saturated", FAULT_STEP)]

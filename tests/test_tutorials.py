"""Every tutorial runs as a reader would run it (a subprocess, small sizes) and tells the story it promises."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import numpy as np

from comgra_ndbg import open_recording

TUTORIALS = Path(__file__).resolve().parent.parent / "tutorials"


def run_tutorial(name: str, *args: str) -> str:
    """Run ``tutorials/<name>`` with ``args``; returns its stdout, failing with its stderr if it fails."""
    done = subprocess.run([sys.executable, str(TUTORIALS / name), *args], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_every_tutorial_is_tested_and_short() -> None:
    names = sorted(p.name for p in TUTORIALS.glob("*.py"))
    assert names == ["01_register_tensors.py", "02_neuraldbg_unchanged_loop.py", "03_flight_recorder.py",
                     "04_test_a_hypothesis.py", "05_breakpoints_and_halt.py"]
    for name in names:
        source = (TUTORIALS / name).read_text()
        assert len(source.splitlines()) <= 80 and '"--steps"' in source and '"--path"' in source


def test_01_register_tensors_finds_the_dead_layer_and_points_to_the_gui(tmp_path: Path) -> None:
    out = run_tutorial("01_register_tensors.py", "--steps", "40", "--path", str(tmp_path))
    assert out.startswith("1. Dead units originated in the architecture or initialisation (first seen in 'hidden')")
    assert f"comgra-ndbg gui {tmp_path}" in out and "the graph marks node 'hidden'" in out
    with open_recording(tmp_path, "bias-init") as recording:
        assert len(recording.steps) == 40 and recording.analysis() is not None


def test_02_neuraldbg_explains_the_vanishing_gradient_of_the_sigmoid_stack(tmp_path: Path) -> None:
    out = run_tutorial("02_neuraldbg_unchanged_loop.py", "--steps", "40", "--path", str(tmp_path))
    assert "after 40 steps" in out
    assert re.search(r"^1\. Vanishing signal originated in the architecture or initialisation", out, re.M)
    assert re.search(r"^top hypothesis: type 'vanishing', origin 'architecture', node 'model\.\d+', step 0", out,
                     re.M)
    assert "gradient_health vanishing in 'model.0' (grad)" in out
    assert f"Browse it: comgra-ndbg gui {tmp_path}" in out


def test_03_flight_recorder_dumps_the_steps_before_the_divergence(tmp_path: Path) -> None:
    out = run_tutorial("03_flight_recorder.py", "--steps", "60", "--path", str(tmp_path))
    bad_step = 60 * 3 // 4
    marks = re.findall(r"^trigger at step (\d+): (.+)$", out, re.M)
    assert marks and bad_step <= int(marks[0][0]) <= bad_step + 2
    assert "exceeds 10x its running median" in marks[0][1] or "non-finite" in marks[0][1]
    dumped = re.search(r"^steps written by the flight recorder: \[(.+)\]$", out, re.M)
    steps = [int(s) for s in dumped.group(1).split(", ")]
    assert steps[0] < bad_step < steps[-1] and len(steps) >= 8  # the ring: steps before the trigger
    assert re.search(rf"^1\. Optimizer divergence originated in the optimizer at step {bad_step}\b", out, re.M)
    with open_recording(tmp_path, "lr-bug") as recording:
        assert [(str(t.step), t.reason) for t in recording.triggers] == marks
        # the loss spike that fired first does not keep the non-finite trigger from firing at the first NaN
        kpi_steps, losses = recording.kpi("loss")
        first_nan = int(kpi_steps[~np.isfinite(losses)][0])
        assert [int(step) for step, why in marks if why.startswith("non-finite")] == [first_nan]
        assert first_nan in recording.steps.tolist()


def test_04_tests_hypotheses_on_a_finished_recording(tmp_path: Path) -> None:
    out = run_tutorial("04_test_a_hypothesis.py", "--steps", "40", "--path", str(tmp_path))
    lines = out.splitlines()
    assert lines[0].startswith("claim: Dead units originated in 'output' at step ")
    onset = int(re.search(r"at step (\d+)", lines[0]).group(1))
    assert lines[1] == f"H1 output units dead from step {onset}; share at the last step: 1.00"
    assert lines[2].startswith("H2 gradient rms of 'hidden.1' changed by -") and lines[3].endswith("stalled")
    assert lines[4].endswith("the output is the origin")
    assert lines[5] == "fixed trial: dead share of 'output' never above 0.00 in 40 steps"
    assert "usage:" in run_tutorial("04_test_a_hypothesis.py", "--help")
    again = run_tutorial("04_test_a_hypothesis.py", "--path", str(tmp_path))  # reuses the recording: no rerun
    assert again == out


def test_05_breaks_at_the_blow_up_and_halts_with_the_steps_before_it_on_disk(tmp_path: Path) -> None:
    out = run_tutorial("05_breakpoints_and_halt.py", "--steps", "40", "--path", str(tmp_path))
    bad_step = 40 // 2
    assert re.search(r"^step 10: loss 1\.\d+, \|grad\| max of model\.0\.weight \d", out, re.M)  # the step hook
    assert re.search(rf"^breakpoint: step {bad_step + 1}, model\.2: abs_max \d+ > 100$", out, re.M)
    halted = re.search(r"^halted: trigger at step (\d+), stopped after step (\d+) of 40$", out, re.M)
    trigger, last = int(halted.group(1)), int(halted.group(2))
    assert trigger == bad_step + 1 and last == trigger + 2
    assert re.search(rf"^1\. Optimizer divergence originated in the optimizer at step {bad_step}\b", out, re.M)
    assert f"top hypothesis: optimizer_divergence from step {bad_step}" in out
    assert f"on disk: steps 0..{last}, of which written by the flight recorder when it fired: 1..{bad_step}" in out
    with open_recording(tmp_path, "lr100") as recording:
        assert recording.steps.tolist() == list(range(last + 1)) and recording.is_complete
        assert [t.step for t in recording.triggers] == [trigger]
    png = tmp_path / "failure.png"  # the failure signature: a real, non-blank image
    assert f"failure signature: {png}" in out
    image = matplotlib.image.imread(png)
    assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 200 and float(image[..., :3].std()) > 0.05

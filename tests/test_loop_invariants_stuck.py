"""Loop invariant ``no_step_end``: a loop whose steps never end (no ``optimizer.step()``, no ``zero_grad()``)
is reported once, with its evidence, and recorded pass by pass from there (with ``invariants=False``: neither,
one open step); loops whose steps end — accumulation over many micro-batches included — are not reported
and are recorded as before."""
from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from light_shapes_support import SHAPES
from test_light_steps import Net
from torch import nn

from comgra_ndbg import NeuralDbg, RecorderWarning, analyze, open_recording
from comgra_ndbg.instrument import loop_rules

WEIGHT = ("model.0.parameters", "model.0.weight")


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2))


def regression_loop(model: nn.Module, passes: int, *, steps_until: int, every: int = 1,
                    zero_before_backward: bool = False) -> Callable[[], None]:
    """``passes`` training passes of a regression towards a fixed target (gradients point the same way from
    pass to pass); an optimizer step and ``zero_grad()`` after every ``every`` passes while fewer than
    ``steps_until`` passes ran, none after."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    def loop() -> None:
        g = torch.Generator().manual_seed(1)
        for i in range(passes):
            output = model(torch.rand(4, 6, generator=g) + 0.5)  # positive inputs: every gradient alike
            if zero_before_backward:
                optimizer.zero_grad()
            F.mse_loss(output, torch.full((4, 2), 3.0)).backward()
            if i < steps_until and (i + 1) % every == 0:
                optimizer.step()
                optimizer.zero_grad()

    return loop


def record(tmp_path: Path, model: nn.Module, loop: Callable[[], None], **options) -> tuple[list, Path]:
    """Run ``loop`` under NeuralDbg(model); the invariant log rows and the trial's folder."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with NeuralDbg(model, tmp_path, trial="t", **options):
            loop()
    assert [str(w.message) for w in caught if issubclass(w.category, RecorderWarning)] == []
    with open_recording(tmp_path / "t") as recording:
        rows = list(recording.log(loop_rules.CATEGORY))
    return rows, tmp_path / "t"


def test_a_loop_that_stops_stepping_is_reported_once_and_recorded_pass_by_pass(tmp_path: Path) -> None:
    model = mlp()
    rows, trial = record(tmp_path, model, regression_loop(model, 40, steps_until=5))
    [row] = rows  # once, and no no_optimizer_step for the split steps (nothing cleared their gradients)
    assert (row.detail["invariant"], row.step, row.detail["severity"]) == ("no_step_end", 5, "failure")
    evidence = row.detail
    assert (evidence["passes"], evidence["backward_calls"], evidence["limit"]) == (9, 9, 8)
    assert evidence["longest_step"] == 1 and evidence["parameters_changed"] is False
    assert evidence["gradients_cleared"] is False and evidence["calls_between"] == 4
    assert evidence["grad_norm_growth"] == pytest.approx(evidence["grad_norm"] / evidence["grad_norm_before"])
    assert evidence["grad_norm_growth"] > 1.5  # 9 gradients of the same sign added up, against 5
    assert "no training step ends: 9 backward calls" in row.message and "step of its own" in row.message
    with open_recording(trial) as recording:
        # steps 0-4 stepped; step 5 holds the 9 passes up to the report; each of the other 26 is a step
        assert recording.steps.tolist() == list(range(32))
        assert recording.step_iterations.tolist() == [1] * 5 + [9] + [1] * 26
        steps, grad_rms = recording.summary(*WEIGHT[:1], "grad", "rms", tensor=WEIGHT[1])
        _, update_rms = recording.summary(*WEIGHT[:1], "update", "rms", tensor=WEIGHT[1])
        loss_steps, loss = recording.kpi("loss")
    assert steps.tolist() == list(range(32))
    assert np.all(update_rms[:5] > 0) and np.all(update_rms[5:] == 0)  # frozen from step 5 on
    assert np.all(np.diff(grad_rms[6:]) > 0) and grad_rms[-1] > 2 * grad_rms[6]  # the gradient grows step by step
    assert loss_steps.tolist() == list(range(32)) and np.ptp(loss[6:]) < np.ptp(loss[:6]) + 1.0
    [hypothesis] = [h for h in analyze(trial).hypotheses if h.chain.root.family == "loop_invariant"]
    assert (hypothesis.type, hypothesis.origin, hypothesis.onset) == ("update_stagnation", "loop", 5)
    assert "optimizer.step()" in hypothesis.remedy


def test_an_optimizer_step_behind_a_condition_never_true_is_reported_at_the_first_step(tmp_path: Path) -> None:
    model = mlp()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def loop() -> None:
        g = torch.Generator().manual_seed(1)
        for i in range(140):
            F.mse_loss(model(torch.randn(4, 6, generator=g)), torch.zeros(4, 2)).backward()
            if i == 10 ** 6:  # the intended "every n batches" that never holds
                optimizer.step()
                optimizer.zero_grad()

    rows, trial = record(tmp_path, model, loop)
    [row] = rows
    assert (row.detail["invariant"], row.step) == ("no_step_end", 0)
    assert (row.detail["backward_calls"], row.detail["limit"], row.detail["longest_step"]) == (129, 128, 0)
    with open_recording(trial) as recording:
        assert recording.step_iterations.tolist() == [129] + [1] * 11


@pytest.mark.parametrize("micro_batches", [8, 16, 64])
def test_gradient_accumulation_with_steps_ending_is_not_reported(tmp_path: Path, micro_batches: int) -> None:
    model = mlp()
    rows, trial = record(tmp_path, model, regression_loop(model, 3 * micro_batches, steps_until=10 ** 6,
                                                          every=micro_batches))
    assert rows == []
    with open_recording(trial) as recording:
        assert recording.step_iterations.tolist() == [micro_batches] * 3


def test_several_backward_calls_per_pass_and_evaluation_passes_are_not_reported(tmp_path: Path) -> None:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    def loop() -> None:
        g = torch.Generator().manual_seed(1)
        for _ in range(6):
            output = model(torch.rand(12, 6, generator=g))
            for row in range(12):  # one backward call per sample, all into the same step
                output[row].pow(2).sum().backward(retain_graph=row < 11)
            optimizer.step()
            optimizer.zero_grad()
            with torch.no_grad():  # a validation run of 40 passes between the steps
                for _ in range(40):
                    model(torch.rand(4, 6, generator=g))

    rows, trial = record(tmp_path, model, loop)
    assert rows == []
    with open_recording(trial) as recording:
        assert recording.step_iterations.tolist() == [1] * 6


def test_a_loop_that_stops_stepping_only_for_its_last_passes_is_not_reported(tmp_path: Path) -> None:
    model = mlp()
    rows, trial = record(tmp_path, model, regression_loop(model, 25, steps_until=20))
    assert rows == []  # 5 passes left open at close: within the 8 the one-pass steps allow
    with open_recording(trial) as recording:
        assert recording.step_iterations.tolist() == [1] * 20 + [5]


def test_a_run_that_never_ends_a_step_is_reported_at_close(tmp_path: Path) -> None:
    model = mlp()
    rows, trial = record(tmp_path, model, regression_loop(model, 30, steps_until=0))
    [row] = rows  # 30 passes, under the 128 a first step may accumulate, but the run closed with none ended
    assert (row.detail["invariant"], row.step, row.detail["at_close"]) == ("no_step_end", 0, True)
    assert (row.detail["backward_calls"], row.detail["limit"]) == (30, 8)
    assert "closed with this step open" in row.message
    with open_recording(trial) as recording:
        assert recording.step_iterations.tolist() == [30]


def test_gradients_cleared_after_the_forward_pass_without_a_step_are_told_apart(tmp_path: Path) -> None:
    model = mlp()
    rows, _ = record(tmp_path, model, regression_loop(model, 30, steps_until=5, zero_before_backward=True))
    [row] = rows  # zero_grad() between forward and backward ends no step; optimizer.step() is missing
    assert (row.detail["invariant"], row.step, row.detail["gradients_cleared"]) == ("no_step_end", 5, True)
    assert "cleared between the passes" in row.message


def test_light_steps_carry_their_backward_calls_into_the_check(tmp_path: Path) -> None:
    model = mlp()
    rows, trial = record(tmp_path, model, regression_loop(model, 60, steps_until=40), summaries=10)
    [row] = rows  # step 40 runs light for 3 passes, then on the full path: 9 calls in all
    assert (row.detail["invariant"], row.step, row.detail["passes"], row.detail["backward_calls"]) == (
        "no_step_end", 40, 9, 9)
    with open_recording(trial) as recording:
        loss_steps, _ = recording.kpi("loss")
    assert loss_steps.tolist() == list(range(52))  # 40 steps, the stuck one, then 11 passes as steps


@pytest.mark.parametrize("named", [True, False], ids=["optimizer=", "no optimizer="])
def test_a_loop_that_steps_again_goes_back_to_the_usual_step_detection(tmp_path: Path, named: bool) -> None:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    def loop() -> None:
        g = torch.Generator().manual_seed(1)
        for i in range(37):
            F.mse_loss(model(torch.rand(4, 6, generator=g)), torch.zeros(4, 2)).backward()
            if i < 5 or (i >= 25 and i % 2 == 0):  # stalls for 20 passes, then accumulates 2 per step
                optimizer.step()
                optimizer.zero_grad()

    rows, trial = record(tmp_path, model, loop, optimizer=optimizer if named else None)
    assert [(r.detail["invariant"], r.step) for r in rows] == [("no_step_end", 5)]
    with open_recording(trial) as recording:
        # 5 steps; step 5: passes 5-13; passes 14-25 one step each; pass 26 steps the optimizer (its step
        # ends as steps end); then two passes per step again (27-28 ... 35-36)
        assert recording.step_iterations.tolist() == [1] * 5 + [9] + [1] * 12 + [1] + [2] * 5


def test_a_first_step_accumulating_more_than_128_micro_batches_is_reported_once_then_recorded_whole(
        tmp_path: Path) -> None:
    model = mlp()
    rows, trial = record(tmp_path, model, regression_loop(model, 3 * 150, steps_until=10 ** 6, every=150))
    assert [(r.detail["invariant"], r.step) for r in rows] == [("no_step_end", 0)]  # the documented false alarm
    with open_recording(trial) as recording:
        # step 0 split after 129 passes (21 one-pass steps up to the optimizer step); the stall counts as a step
        # of 150 backward calls from then on, so the next two accumulations are whole steps
        assert recording.step_iterations.tolist() == [129] + [1] * 21 + [150, 150]


def test_invariants_false_reports_nothing_and_records_the_stall_as_one_open_step(tmp_path: Path) -> None:
    model = mlp()
    rows, trial = record(tmp_path, model, regression_loop(model, 20, steps_until=5), invariants=False)
    assert rows == []
    with open_recording(trial) as recording:
        # steps 0-4 stepped; the 15 passes after them stay in step 5, as step detection alone leaves them
        assert recording.steps.tolist() == list(range(6))
        assert recording.step_iterations.tolist() == [1] * 5 + [15]


def test_invariants_false_never_splits_a_loop_that_never_steps(tmp_path: Path) -> None:
    model = mlp()
    rows, trial = record(tmp_path, model, regression_loop(model, 150, steps_until=0), invariants=False)
    assert rows == []  # neither past the 128 passes a first step may accumulate (the split) nor at close()
    with open_recording(trial) as recording:
        assert recording.steps.tolist() == [0] and recording.step_iterations.tolist() == [150]
        found = [row.detail.get("invariant") for row in recording.log()]
    assert "no_step_end" not in found


def test_a_stuck_loop_without_invariants_trains_bit_identical_to_the_bare_loop(tmp_path: Path) -> None:
    bare = mlp()
    regression_loop(bare, 150, steps_until=0)()
    model = mlp()
    record(tmp_path, model, regression_loop(model, 150, steps_until=0), invariants=False)
    for p, q in zip(bare.parameters(), model.parameters()):
        assert torch.equal(p, q) and torch.equal(p.grad, q.grad)


def test_a_stuck_loop_trains_bit_identical_to_the_bare_loop(tmp_path: Path) -> None:
    bare = mlp()
    regression_loop(bare, 30, steps_until=5)()
    model = mlp()
    record(tmp_path, model, regression_loop(model, 30, steps_until=5))
    for p, q in zip(bare.parameters(), model.parameters()):
        assert torch.equal(p, q) and torch.equal(p.grad, q.grad)


@pytest.mark.parametrize("shape", ["sam", "lbfgs", "accumulated_unevenly", "skipping", "grad_scaler", "two_backwards",
                                   "inner_step", "hand_update", "metric_mid_step", "eval_metric_mid_step"])
def test_loop_shapes_whose_steps_end_are_not_reported(tmp_path: Path, shape: str) -> None:
    torch.manual_seed(0)
    model = Net()
    dbgs: list[NeuralDbg] = []

    def watch(optimizer=None, loss=None) -> NeuralDbg:
        dbgs.append(NeuralDbg(model, tmp_path, trial="t", optimizer=optimizer, loss=loss))
        return dbgs[-1]

    SHAPES[shape](model, watch, False)
    with open_recording(tmp_path / "t") as recording:
        found = [row.detail["invariant"] for row in recording.log(loop_rules.CATEGORY)]
        longest = int(recording.step_iterations.max())
    assert "no_step_end" not in found and not dbgs[0]._stuck_splitting
    assert longest <= 8  # every step ended where the loop ends it

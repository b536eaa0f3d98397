"""Adaptive recording end to end: policies per step type, retroactive step types with category-balanced
samples, and the flight recorder, on real (tiny) training runs written to real HDF5 files and read back."""
from __future__ import annotations

import math
import re
import statistics
import warnings
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from torch import nn

import comgra_ndbg.recorder.retroactive as retroactive_module
from comgra_ndbg import (InvalidArgumentError, Recorder, RecorderStateError, RecorderWarning, RecordingNotFoundError,
                         open_recording)
from comgra_ndbg.recorder.flight import FlightRecorder, GradNormAbove, LossSpike, NonFinite, Predicate, StepFacts
from comgra_ndbg.recorder.policy import Always, EveryK, PerTypeBackoff
from comgra_ndbg.recorder.snapshot import balanced_samples
from comgra_ndbg.store import schema
from comgra_ndbg.store.reader import TriggerMark

StepHook = Callable[[int], None]


def flags_by_step(rec: Recorder) -> dict[int, int]:
    """The FLAG bits of every step row, read with plain h5py from the consolidated file."""
    with h5py.File(rec.path / schema.FINAL_NAME, "r") as f:
        steps = f[schema.STEPS_STEP][()] if schema.STEPS_STEP in f else np.zeros(0, np.int64)
        flags = f[schema.STEPS_FLAGS][()] if schema.STEPS_FLAGS in f else np.zeros(0, np.uint8)
    return {int(s): int(b) for s, b in zip(steps, flags)}


BOTH = schema.FLAG_SUMMARY | schema.FLAG_SNAPSHOT


# ---- a small classifier: the run most tests record ------------------------------------------------------
def train(rec: Recorder, steps: int, *, step_type: Callable[[int], str | None] = lambda step: "train",
          decide: Callable[[int], str] | None = None, decide_at: str = "after_record",
          categories: list[str] | None = None, loss_scale: Callable[[int], float] = lambda step: 1.0,
          kpi: Callable[[int, torch.Tensor], float | torch.Tensor] = lambda step, loss: loss,
          seen: dict | None = None) -> None:
    """Seeded training of a 4-8-2 tanh MLP on batches of 8. ``decide`` settles the type of steps started
    with ``step_type=None``, at the point ``decide_at`` names; ``seen[step]`` collects the inputs and the
    gradients of ``hidden`` and every parameter, as training saw them."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    rec.track_module("model", model)
    for step in range(steps):
        x = torch.randn(8, 4)
        rec.start_step(step, step_type(step))
        rec.register_tensor("input", x, role="input")
        hidden = model[1](model[0](x))
        rec.register_tensor("hidden", hidden)
        output = model[2](hidden)
        rec.register_tensor("output", output, role="output")
        loss = output.pow(2).mean() * loss_scale(step)
        rec.register_tensor("loss", loss, role="loss")
        grads: dict[str, torch.Tensor] = {}
        hidden.register_hook(lambda g, grads=grads: grads.__setitem__("hidden", g.detach().clone()))
        output.register_hook(lambda g, grads=grads: grads.__setitem__("output", g.detach().clone()))

        def settle(point: str) -> None:
            if decide is not None and decide_at == point:
                rec.decide_step(decide(step), sample_categories=categories)

        settle("before_backward")
        optimizer.zero_grad()
        loss.backward()
        settle("after_backward")
        rec.record_gradients()
        settle("after_record")
        optimizer.step()
        rec.record_kpi("loss", kpi(step, loss))
        rec.finish_step()
        if seen is not None:
            grads.update({f"model.{name}": p.grad.detach().clone() for name, p in model.named_parameters()})
            seen[step] = {"input": x, **grads}


# ---- 1. policies through the Recorder -------------------------------------------------------------------
def test_summaries_every_k_and_snapshots_per_type_backoff_record_exactly_these_steps(tmp_path: Path) -> None:
    # Type 'b' on every third step (2, 5, 8, ...), 'a' on the others. Snapshots: each type on its own clock,
    # gap 10 then 20 then 40 (Comgra's per-type frequency): a at 0, 21 (first 'a' at or after 20), 61;
    # b at 2, 23, 65 (first 'b' at or after 22 and 63).
    with Recorder(tmp_path, trial="t", summaries=EveryK(5), snapshots=PerTypeBackoff(10, factor=2)) as rec:
        train(rec, 70, step_type=lambda step: "b" if step % 3 == 2 else "a")
    summary_steps = [0, 5, 10, 15, 20, 25, 30, 35, 40, 45, 50, 55, 60, 65]
    snapshot_steps = [0, 2, 21, 23, 61, 65]
    with open_recording(tmp_path) as recording:
        assert recording.steps.tolist() == [0, 2, 5, 10, 15, 20, 21, 23, 25, 30, 35, 40, 45, 50, 55, 60, 61,
                                            65]
        assert recording.steps_of_type("b").tolist() == [2, 5, 20, 23, 35, 50, 65]
        for name, kind in [("input", "value"), ("hidden", "grad"), ("model.0.weight", "update")]:
            assert recording.summary(name, kind, "count")[0].tolist() == summary_steps, (name, kind)
            assert recording.snapshot_steps(name, kind).tolist() == snapshot_steps, (name, kind)
        assert recording.kpi("loss")[0].tolist() == list(range(70))  # KPIs are kept for skipped steps too
        reasons = recording.step_reasons()
    flags = flags_by_step(rec)
    assert flags == {step: (schema.FLAG_SUMMARY if step in summary_steps else 0)
                     | (schema.FLAG_SNAPSHOT if step in snapshot_steps else 0) for step in flags}
    assert sorted(flags) == sorted(set(summary_steps) | set(snapshot_steps))
    assert {step: reasons[step] for step in snapshot_steps} == {
        0: "every 5 steps; step type 'a' first seen",
        2: "step type 'b' first seen",
        21: "step type 'a' backoff (due at 20)",
        23: "step type 'b' backoff (due at 22)",
        61: "step type 'a' backoff (due at 61)",
        65: "every 5 steps; step type 'b' backoff (due at 63)",
    }
    for step in summary_steps:
        assert "every 5 steps" in reasons[step]
    assert all(reasons[step] for step in flags)


def test_a_late_typed_step_no_policy_can_record_does_no_tensor_work(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    chosen: list[int] = []

    def counting(categories: list, count: int) -> np.ndarray:
        chosen.append(len(categories))
        return balanced_samples(categories, count)

    monkeypatch.setattr(retroactive_module, "balanced_samples", counting)
    recording_states = []
    with Recorder(tmp_path, trial="t", summaries=EveryK(5), snapshots=EveryK(5), num_samples=2) as rec:
        rec.track_module("model", nn.Linear(3, 2))
        for step in range(7):
            rec.start_step(step, None)
            recording_states.append(rec.is_recording)
            rec.register_tensor("x", torch.arange(12.0).view(4, 3), role="input")
            rec.decide_step("any", sample_categories=["p", "p", "q", "q"])
            rec.finish_step()
    assert recording_states == [True, False, False, False, False, True, False]
    assert chosen == [4, 4]  # the balanced choice is made on the two recorded steps only
    with open_recording(tmp_path) as recording:
        assert recording.steps.tolist() == [0, 5]
        assert recording.step_reasons() == {0: "retroactive decision: every 5 steps",
                                            5: "retroactive decision: every 5 steps"}
        assert recording.snapshot(5, "x").sample_index.tolist() == [0, 2]


# ---- 2. retroactive decisions ---------------------------------------------------------------------------
LABELS = ["a", "a", "b", "a", "a", "c", "a", "a"]  # 6 x a, 1 x b, 1 x c
BALANCED = [0, 2, 5, 1]  # round robin over a, b, c in order of first appearance, then a again


def long_or_short(step: int) -> str:
    return "long" if step % 4 == 3 else "short"


@pytest.mark.parametrize("decide_at", ["before_backward", "after_backward", "after_record"])
def test_retroactive_decision_applies_per_type_policies_and_balances_samples(tmp_path: Path,
                                                                             decide_at: str) -> None:
    seen: dict[int, dict[str, torch.Tensor]] = {}
    with Recorder(tmp_path, trial="t", summaries=PerTypeBackoff(2), snapshots=PerTypeBackoff(4, factor=2),
                  num_samples=4) as rec:
        train(rec, 20, step_type=lambda step: None, decide=long_or_short, decide_at=decide_at,
              categories=LABELS, seen=seen)
    # Summaries: 'short' (all steps but 3, 7, 11, ...) at least 2 steps apart, 'long' every time it comes.
    # Snapshots: short at 0, 8 (0 + 8), 24 (8 + 16); long at 3, 11, 27. Odd short steps leave no trace.
    summary_steps = [0, 2, 3, 4, 6, 7, 8, 10, 11, 12, 14, 15, 16, 18, 19]
    snapshot_steps = [0, 3, 8, 11]
    with open_recording(tmp_path) as recording:
        assert recording.steps.tolist() == summary_steps
        assert recording.steps_of_type("long").tolist() == [3, 7, 11, 15, 19]
        for name, kind in [("input", "value"), ("hidden", "value"), ("hidden", "grad"), ("loss", "grad"),
                           ("model.2.weight", "grad"), ("model.2.weight", "update")]:
            assert recording.summary(name, kind, "count")[0].tolist() == summary_steps, (name, kind)
            assert recording.snapshot_steps(name, kind).tolist() == snapshot_steps, (name, kind)
        reasons = recording.step_reasons()
        assert reasons[0] == "retroactive decision: step type 'short' first seen"
        assert reasons[3] == "retroactive decision: step type 'long' first seen"
        assert reasons[2] == "retroactive decision: step type 'short' backoff (due at 2)"
        assert reasons[8] == "retroactive decision: step type 'short' backoff (due at 8)"
        assert all(reason.startswith("retroactive decision: ") for reason in reasons.values())
        assert recording.kinds() == ["value", "grad", "update"]

        for step in snapshot_steps:
            for name, kind in [("input", "value"), ("hidden", "value"), ("hidden", "grad")]:
                snap = recording.snapshot(step, name, kind)
                assert snap.sample_index.tolist() == BALANCED, (step, name, kind)
                assert snap.sample_categories == ("a", "b", "c", "a"), (step, name, kind)
            x = seen[step]["input"].numpy().astype(np.float64)[BALANCED]
            stats = recording.snapshot(step, "input").sample_stats
            np.testing.assert_allclose(stats["mean"], x.mean(axis=1), rtol=1e-12)
            np.testing.assert_allclose(stats["std"], x.std(axis=1), rtol=1e-9)
            np.testing.assert_array_equal(stats["min"], x.min(axis=1))
            np.testing.assert_array_equal(stats["max"], x.max(axis=1))
            np.testing.assert_array_equal(stats["count"], [4, 4, 4, 4])
            np.testing.assert_array_equal(recording.snapshot(step, "input").dense(), x.astype(np.float32))
            g = seen[step]["hidden"].numpy().astype(np.float64)[BALANCED]
            grad_stats = recording.snapshot(step, "hidden", "grad").sample_stats
            np.testing.assert_allclose(grad_stats["mean"], g.mean(axis=1), rtol=1e-9)
            np.testing.assert_allclose(grad_stats["abs_max"], np.abs(g).max(axis=1), rtol=1e-12)
            np.testing.assert_array_equal(recording.snapshot(step, "hidden", "grad").dense(), g.astype(np.float32))
            # parameter gradients have no batch: all their elements, no categories
            weight = recording.snapshot(step, "model.2.weight", "grad")
            assert weight.sample_categories == () and weight.sample_index.tolist() == []
            np.testing.assert_array_equal(weight.dense(), seen[step]["model.2.weight"].numpy())


def test_retroactive_and_known_types_give_the_same_steps(tmp_path: Path) -> None:
    with Recorder(tmp_path, trial="known", summaries=PerTypeBackoff(2), snapshots=PerTypeBackoff(4, factor=2)) as rec:
        train(rec, 20, step_type=long_or_short)
    with Recorder(tmp_path, trial="late", summaries=PerTypeBackoff(2), snapshots=PerTypeBackoff(4, factor=2)) as rec:
        train(rec, 20, step_type=lambda step: None, decide=long_or_short)
    with open_recording(tmp_path, "known") as known, open_recording(tmp_path, "late") as late:
        assert known.steps.tolist() == late.steps.tolist()
        assert known.snapshot_steps("hidden", "grad").tolist() == late.snapshot_steps("hidden", "grad").tolist()
        for step, reason in known.step_reasons().items():
            # each policy's reason is marked: "retroactive decision: <summaries>; retroactive decision: <snapshots>"
            marked = "; ".join(f"retroactive decision: {part}" for part in reason.split("; "))
            assert late.step_reasons()[step] == marked
        for step in known.snapshot_steps("hidden"):  # without categories: the first samples, as for known types
            a, b = known.snapshot(step, "hidden"), late.snapshot(step, "hidden")
            assert a.sample_index.tolist() == b.sample_index.tolist() == [0, 1, 2, 3, 4, 5, 6, 7]
            assert b.sample_categories == ("",) * 8
            np.testing.assert_array_equal(a.values, b.values)


def test_retroactive_step_errors_and_automatic_decision(tmp_path: Path) -> None:
    with Recorder(tmp_path, trial="t", summaries=Always(), snapshots=Always()) as rec:
        rec.start_step(0, "long")
        with pytest.raises(RecorderStateError, match="already has the type 'long'"):
            rec.decide_step("short")
        rec.finish_step()

        rec.start_step(1, None)
        rec.register_tensor("x", torch.zeros(8, 3), role="input")
        with pytest.raises(RecorderStateError, match="decide_step"):
            rec.finish_step()
        with pytest.raises(InvalidArgumentError, match="has 3 entries but the batch of step 1 has 8"):
            rec.decide_step("short", sample_categories=["a", "b", "c"])
        with pytest.raises(InvalidArgumentError, match="non-empty str"):
            rec.decide_step("")
        assert rec.decide_step("short", sample_categories=torch.tensor([0, 0, 0, 0, 0, 0, 1, 2]))
        rec.finish_step()

        with rec.step(2, None):  # the step context decides the last type on exit
            rec.register_tensor("x", torch.ones(8, 3), role="input")
        with pytest.raises(RecorderStateError, match="outside a step"):
            rec.decide_step("short")
        rec.start_step(3, None)  # close() decides an open undecided step the same way
        rec.register_tensor("x", torch.ones(8, 3), role="input")
    with open_recording(tmp_path) as recording:
        assert recording.steps.tolist() == [0, 1, 2, 3]
        assert [recording.step_type_of(step) for step in range(4)] == ["long", "short", "short", "short"]
        snap = recording.snapshot(1, "x")
        assert snap.sample_index.tolist() == [0, 6, 7, 1, 2, 3, 4, 5]
        assert snap.sample_categories == ("0", "1", "2", "0", "0", "0", "0", "0")


# ---- 3. flight recorder ---------------------------------------------------------------------------------
def diverge(rec: Recorder | None, steps: int, *, after_step: StepHook | None = None) -> list[set[str]]:
    """Seeded regression with SGD at a learning rate that diverges (as in Neural Observer's demo).

    Returns, per step, the recorded series that hold a NaN or Inf, as ``"'name' (kind)"`` labels, found
    with ``torch.isfinite`` on what training saw — independently of the recorder."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    generator = torch.Generator().manual_seed(1)
    if rec is not None:
        rec.track_module("model", model)
    bad_per_step = []
    for step in range(steps):
        x = torch.randn(8, 4, generator=generator)
        target = x.sum(1, keepdim=True) * 3
        bad: set[str] = set()

        def check(name: str, kind: str, tensor: torch.Tensor, bad: set[str] = bad) -> None:
            if not torch.isfinite(tensor).all():
                bad.add(f"'{name}' ({kind})")

        for name, p in model.named_parameters():
            check(f"model.{name}", "value", p)
        if rec is not None:
            rec.start_step(step, "train")
            rec.register_tensor("input", x, role="input")
            rec.register_tensor("target", target, role="target")
        hidden = model[1](model[0](x))
        output = model[2](hidden)
        loss = (output - target).pow(2).mean()
        for name, tensor in [("hidden", hidden), ("output", output), ("loss", loss)]:
            check(name, "value", tensor)
            tensor.register_hook(lambda g, name=name: check(name, "grad", g))
            if rec is not None:
                rec.register_tensor(name, tensor, role={"hidden": "intermediate"}.get(name, name))
        optimizer.zero_grad()
        loss.backward()
        if rec is not None:
            rec.record_gradients()
        before = {name: p.detach().clone() for name, p in model.named_parameters()}
        optimizer.step()
        for name, p in model.named_parameters():
            check(f"model.{name}", "grad", p.grad)
            check(f"model.{name}", "update", p.detach() - before[name])
        if rec is not None:
            rec.record_kpi("loss", loss)
            rec.finish_step()
        if after_step is not None:
            after_step(step)
        bad_per_step.append(bad)
    return bad_per_step


DIVERGE_STEPS = 50


@pytest.fixture(scope="module")
def divergence() -> tuple[int, set[str]]:
    """The first step with a non-finite value in any recorded series, found without the recorder."""
    bad = diverge(None, DIVERGE_STEPS)
    first = next(step for step, labels in enumerate(bad) if labels)
    assert 20 < first < DIVERGE_STEPS - 12, first  # the scenario needs room for the ring and forced steps
    assert all(bad[first:]), "the run stays non-finite once it diverged"
    return first, bad[first]


def test_diverging_run_keeps_the_steps_before_the_first_non_finite_value(tmp_path: Path,
                                                                         divergence: tuple[int, set[str]]) -> None:
    first, bad_labels = divergence
    before, after = 8, 5
    with Recorder(tmp_path, trial="t", summaries=EveryK(1000), snapshots=None,
                  flight_recorder=FlightRecorder(steps=before, after=after, triggers=[NonFinite()])) as rec:
        diverge(rec, DIVERGE_STEPS)
    dumped = list(range(first - before, first))
    forced = list(range(first + 1, first + after + 1))
    with open_recording(tmp_path) as recording:
        assert recording.steps.tolist() == [0, *dumped, first, *forced]
        [mark] = recording.triggers
        assert mark.step == first
        assert mark.reason.startswith("non-finite values in ")
        named = re.findall(r"'[^']+' \(\w+\)", mark.reason)
        assert named and set(named) <= bad_labels, (named, bad_labels)
        for name, kind in [("input", "value"), ("hidden", "value"), ("hidden", "grad"), ("loss", "value"),
                           ("model.0.weight", "value"), ("model.2.weight", "grad"), ("model.0.bias", "update")]:
            assert recording.snapshot_steps(name, kind).tolist() == [*dumped, first, *forced], (name, kind)
            assert recording.summary(name, kind, "count")[0].tolist() == [0, *dumped, first, *forced], (name, kind)
        reasons = recording.step_reasons()
        assert reasons[0] == "every 1000 steps"
        for step in dumped:
            assert reasons[step] == f"flight recorder: retroactive, trigger at step {first}: {mark.reason}"
        assert reasons[first] == f"trigger: {mark.reason}"
        for k, step in enumerate(forced, start=1):
            assert reasons[step] == f"forced: step {k} of {after} after the trigger at step {first}"
        # the dumped steps are full snapshots of what training saw: finite before the trigger
        assert np.isfinite(recording.snapshot(first - 1, "model.0.weight").values).all()
        assert np.isfinite(recording.summary("loss", "value", "max")[1][:-after - 1]).all()
        loss_steps, loss_nonfinite = recording.summary("loss", "value", "nonfinite")
        assert (loss_steps[loss_nonfinite > 0] >= first).all()
    assert flags_by_step(rec) == {0: schema.FLAG_SUMMARY, **{step: BOTH for step in [*dumped, first, *forced]}}


def test_flight_recorder_snapshots_hold_the_data_training_saw(tmp_path: Path,
                                                              divergence: tuple[int, set[str]]) -> None:
    first, _ = divergence
    inputs: dict[int, torch.Tensor] = {}
    generator = torch.Generator().manual_seed(1)
    for step in range(first + 1):
        inputs[step] = torch.randn(8, 4, generator=generator)
    with Recorder(tmp_path, trial="t", summaries=None, snapshots=None, num_samples=8,
                  flight_recorder=FlightRecorder(steps=3, after=0, triggers=[NonFinite()])) as rec:
        diverge(rec, first + 1)
    with open_recording(tmp_path) as recording:
        assert recording.steps.tolist() == [first - 3, first - 2, first - 1, first]
        for step in recording.steps:
            np.testing.assert_array_equal(recording.snapshot(int(step), "input").dense(), inputs[int(step)].numpy())


def test_a_persistent_trigger_fires_once_and_rearms_when_it_clears(tmp_path: Path) -> None:
    def crafted(facts: StepFacts) -> bool:
        return 10 <= facts.step <= 25 or facts.step >= 30

    flight = FlightRecorder(steps=3, after=2, triggers=[Predicate(crafted, "crafted")])
    with Recorder(tmp_path, trial="t", summaries=None, snapshots=None, flight_recorder=flight) as rec:
        train(rec, 35)
    with open_recording(tmp_path) as recording:
        assert recording.triggers == [TriggerMark(10, "predicate 'crafted'"), TriggerMark(30, "predicate 'crafted'")]
        assert recording.steps.tolist() == [7, 8, 9, 10, 11, 12, 27, 28, 29, 30, 31, 32]
        assert recording.snapshot_steps("hidden", "grad").tolist() == [7, 8, 9, 10, 11, 12, 27, 28, 29, 30, 31, 32]
        reasons = recording.step_reasons()
    assert reasons[27] == "flight recorder: retroactive, trigger at step 30: predicate 'crafted'"
    assert reasons[30] == "trigger: predicate 'crafted'"
    assert reasons[32] == "forced: step 2 of 2 after the trigger at step 30"


def test_persistent_nan_does_not_retrigger_every_step(tmp_path: Path, divergence: tuple[int, set[str]]) -> None:
    first, _ = divergence
    with Recorder(tmp_path, trial="t", summaries=None, snapshots=None,
                  flight_recorder=FlightRecorder(steps=2, after=1, triggers=[NonFinite()])) as rec:
        diverge(rec, DIVERGE_STEPS)
    with open_recording(tmp_path) as recording:
        assert [mark.step for mark in recording.triggers] == [first]
        assert recording.steps.tolist() == [first - 2, first - 1, first, first + 1]


def test_loss_spike_on_a_crafted_kpi_sequence(tmp_path: Path) -> None:
    losses = [1.0, 1.2, 0.8, 1.1, 0.9, 1.05, 0.95, 1.0, 1.3, 0.7, 1.0, 1.1, 30.0, 1.0, 1.2, 0.9, 1.1, 8.0,
              1.0, 1.0, float("nan"), 1.0, 1.0]
    window = 8
    flight = FlightRecorder(steps=2, after=1, triggers=[LossSpike(factor=10, window=window, min_history=4)])
    with Recorder(tmp_path, trial="t", summaries=None, snapshots=None, flight_recorder=flight) as rec:
        train(rec, len(losses), kpi=lambda step, loss: losses[step])
    median = statistics.median(losses[12 - window:12])
    with open_recording(tmp_path) as recording:
        assert recording.triggers == [
            TriggerMark(12, f"loss 30 exceeds 10x its running median {median:.3g} (KPI 'loss')"),
            TriggerMark(20, "KPI 'loss' is nan"),
        ]
        assert recording.steps.tolist() == [10, 11, 12, 13, 18, 19, 20, 21]
        kpi_steps, kpi_values = recording.kpi("loss")
        assert kpi_steps.tolist() == list(range(len(losses)))
        np.testing.assert_array_equal(kpi_values, losses)


def test_grad_norm_above_names_the_largest_gradient(tmp_path: Path) -> None:
    spike, threshold = 15, 50.0
    seen: dict[int, dict[str, torch.Tensor]] = {}
    flight = FlightRecorder(steps=2, after=0, triggers=[GradNormAbove(threshold)])
    with Recorder(tmp_path, trial="t", summaries=None, snapshots=None, flight_recorder=flight) as rec:
        train(rec, 20, loss_scale=lambda step: 1e4 if step == spike else 1.0, seen=seen)
    norms = {name: float(g.double().norm()) for name, g in seen[spike].items() if name != "input"}
    norms["loss"] = 1.0  # d(loss)/d(loss) of the registered (scaled) loss
    largest = max(norms, key=norms.get)
    for step in range(spike):
        assert max(float(g.double().norm()) for name, g in seen[step].items() if name != "input") < threshold
    with open_recording(tmp_path) as recording:
        [mark] = recording.triggers
        assert mark.step == spike
        match = re.fullmatch(rf"gradient norm of '{re.escape(largest)}' is (\S+) > 50", mark.reason)
        assert match, (mark.reason, largest)
        assert math.isclose(float(match.group(1)), norms[largest], rel_tol=5e-3)
        assert recording.steps.tolist() == [13, 14, 15]


def test_grad_norm_above_takes_one_norm_over_the_iterations_and_sees_named_gradient_sets(tmp_path: Path) -> None:
    flight = FlightRecorder(steps=2, after=0, triggers=[GradNormAbove(6.0)])
    with Recorder(tmp_path, trial="t", summaries=None, snapshots=None, flight_recorder=flight) as rec:
        w = torch.zeros(2, requires_grad=True)
        with rec.step(0):  # gradients of norm 3 and 4 in two iterations: together 5, under the threshold
            for scale in (3.0, 4.0):
                rec.start_iteration()
                h = rec.register_tensor("h", w + 0.0)
                (h * torch.tensor([scale, 0.0])).sum().backward()
                rec.finish_iteration()
            rec.record_gradients()
        with rec.step(1):  # a named gradient set of norm 7
            h = rec.register_tensor("h", w + 0.0)
            (h * torch.tensor([0.0, 7.0])).sum().backward()
            rec.record_gradients("aux")
    with open_recording(tmp_path) as recording:
        [mark] = recording.triggers
        assert mark.step == 1 and mark.reason == "gradient norm of 'h (grad:aux)' is 7 > 6"


def test_a_raising_predicate_is_logged_every_step_warned_once_and_never_breaks_training(tmp_path: Path) -> None:
    def broken(facts: StepFacts) -> bool:
        return 1 / 0 > facts.step

    flight = FlightRecorder(steps=3, after=1, triggers=[Predicate(broken), NonFinite()])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Recorder(tmp_path, trial="t", summaries=None, snapshots=None, flight_recorder=flight) as rec:
            train(rec, 12)
    messages = [str(w.message) for w in caught if issubclass(w.category, RecorderWarning)]
    assert len(messages) == 2, messages  # the first failure, and the count when the recorder closes
    assert "trigger Predicate('broken') raised ZeroDivisionError" in messages[0] and "at step 0" in messages[0]
    assert "\"Predicate('broken')\" (trigger_error) 12 times, steps 0–11" in messages[1]
    assert rec.flight_recorder.buffered_steps == [9, 10, 11]
    with open_recording(tmp_path) as recording:
        assert recording.triggers == [] and recording.steps.tolist() == []
        assert recording.kpi("loss")[0].tolist() == list(range(12))
        problems = recording.problems()
        assert [p.step for p in problems] == list(range(12))
        assert {(p.category, p.subject) for p in problems} == {(schema.PROBLEM_TRIGGER, "Predicate('broken')")}


def test_the_ring_never_exceeds_its_byte_bound_and_keeps_the_newest_steps(tmp_path: Path) -> None:
    with Recorder(tmp_path, trial="probe", summaries=None, snapshots=None,
                  flight_recorder=FlightRecorder(steps=4, triggers=[NonFinite()])) as probe:
        train(probe, 10)
    assert probe.flight_recorder.buffered_steps == [6, 7, 8, 9]  # the step bound
    per_step = probe.flight_recorder.buffered_bytes / 4
    assert probe.flight_recorder.peak_bytes == pytest.approx(4 * per_step, rel=0.05)

    max_bytes = int(2.5 * per_step)
    with Recorder(tmp_path, trial="small", summaries=None, snapshots=None,
                  flight_recorder=FlightRecorder(steps=50, max_bytes=max_bytes, triggers=[NonFinite()])) as rec:
        train(rec, 30)
    ring = rec.flight_recorder
    assert 0 < ring.peak_bytes <= max_bytes
    assert ring.buffered_bytes <= max_bytes
    assert ring.buffered_steps == [28, 29]  # the byte bound holds two steps: the most recent ones

    with Recorder(tmp_path, trial="tiny", summaries=None, snapshots=None,
                  flight_recorder=FlightRecorder(steps=50, max_bytes=100, triggers=[NonFinite()])) as rec:
        train(rec, 5)
    assert rec.flight_recorder.buffered_steps == [] and rec.flight_recorder.peak_bytes == 0


# ---- 4. crash-relevant: the trigger is on disk at once --------------------------------------------------
def test_the_trigger_is_flushed_at_once(tmp_path: Path, divergence: tuple[int, set[str]]) -> None:
    first, _ = divergence
    looked: list[int] = []

    def look(step: int) -> None:
        if step < first:
            if step == first - 1:
                with pytest.raises(RecordingNotFoundError):
                    open_recording(tmp_path)
            return
        if step == first:
            with open_recording(tmp_path) as live:
                assert not live.is_complete
                assert [mark.step for mark in live.triggers] == [first]
                assert live.steps.tolist() == [first - 3, first - 2, first - 1, first]
                assert live.snapshot_steps("model.0.weight", "update").tolist() == [first - 3, first - 2,
                                                                                     first - 1, first]
            looked.append(step)

    rec = Recorder(tmp_path, trial="t", summaries=None, snapshots=None, flush_every_seconds=1e9,
                   flight_recorder=FlightRecorder(steps=3, after=4, triggers=[NonFinite()]))
    diverge(rec, first + 1, after_step=look)
    assert looked == [first]
    rec.close()

"""Halting on failure: a halting flight-recorder trigger stops a real training run cleanly, with every step
before it on disk and the diagnosis in hand (raise and flag modes)."""
from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from comgra_ndbg import NeuralDbg, Recorder, open_recording
from comgra_ndbg.errors import InvalidArgumentError, TrainingHalted
from comgra_ndbg.instrument.halting import halting_flight_recorder
from comgra_ndbg.recorder.flight import FlightRecorder, LossSpike, NonFinite

STEPS, BAD_LR_FROM = 30, 12  # the Neural Observer scenario: a small ConvNet whose learning rate becomes 100


def convnet() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 8, 3, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(32, 3))


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(16, 1, 8, 8, generator=g), torch.randint(0, 3, (16,), generator=g)) for _ in range(STEPS)]


def spike_triggers() -> list:
    return [NonFinite(), LossSpike(factor=10, window=10, min_history=5)]


def train(model: nn.Module, optimizer: torch.optim.Optimizer, losses: list[float], dbg: NeuralDbg | None = None
          ) -> int:
    """The unchanged loop (lr=0.05, then 100 from step BAD_LR_FROM); returns the number of optimizer steps
    taken. With ``dbg``, the loop stops when ``dbg.should_stop`` (flag mode)."""
    updates = 0
    for step, (x, y) in enumerate(batches()):
        if step == BAD_LR_FROM:
            optimizer.param_groups[0]["lr"] = 100.0
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        losses.append(loss.item())
        loss.backward()
        optimizer.step()
        updates += 1
        if dbg is not None and dbg.should_stop:
            break
    return updates


@pytest.fixture(scope="module")
def explosion() -> int:
    """The first step whose loss exceeds 10x the median of the steps before it, in a run without NeuralDbg."""
    model = convnet()
    losses: list[float] = []
    train(model, torch.optim.SGD(model.parameters(), lr=0.05), losses)
    return next(i for i in range(5, STEPS) if losses[i] > 10 * statistics.median(losses[max(0, i - 10):i]))


def test_the_convnet_with_lr_100_halts_within_a_few_steps_with_the_steps_before_it_on_disk(
        tmp_path: Path, explosion: int, capsys: pytest.CaptureFixture) -> None:
    model = convnet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    losses: list[float] = []
    with pytest.raises(TrainingHalted) as caught:
        with NeuralDbg(model, tmp_path, trial="lr100", summaries=50, snapshots=None, halt_on=spike_triggers()):
            train(model, optimizer, losses)
    halted = caught.value
    assert explosion <= halted.step <= explosion + 1 and "exceeds 10x its running median" in halted.reason
    assert halted.last_step == halted.step + 2  # halt_delay: two more steps, recorded in full
    assert len(losses) == halted.last_step + 1  # raised from the next step's forward pass, before it ran
    assert halted.diagnosis.hypotheses[0].type == "optimizer_divergence"
    assert halted.diagnosis.hypotheses[0].onset in (BAD_LR_FROM, BAD_LR_FROM + 1)
    assert not any(module._forward_hooks or module._forward_pre_hooks for module in model.modules())
    printed = capsys.readouterr().out
    assert f"training halted after step {halted.last_step}; trigger at step {halted.step}" in printed
    assert "Optimizer divergence" in printed
    with open_recording(tmp_path, "lr100") as recording:
        assert recording.is_complete  # closed before the raise: consolidated, nothing pending
        assert recording.steps.tolist() == list(range(halted.last_step + 1))  # the ring held every earlier step
        reasons = recording.step_reasons()
        assert reasons[0] == "every 50 steps"
        assert all(reasons[s].startswith("flight recorder: retroactive") for s in range(1, halted.step))
        assert [(t.step, t.reason) for t in recording.triggers] == [(halted.step, halted.reason)]
        before = recording.snapshot(halted.step - 1, "model.0")  # a pre-failure snapshot
        assert before.values.size > 0 and np.isfinite(before.values).all()
        kpi_steps, kpi_losses = recording.kpi("loss")
        assert kpi_steps.tolist() == list(range(halted.last_step + 1))
        np.testing.assert_allclose(kpi_losses, losses[:halted.last_step + 1], rtol=1e-6)  # nothing lost


def test_a_convnet_trained_with_lr_100_from_the_first_step_halts_on_the_named_triggers(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Neural Observer's own script: SGD at lr=100 from the start. The loss explodes before ``LossSpike`` has
    the 10 steps of history its running median needs, so its early bar (100x the largest loss so far) is
    what halts the run."""
    def doomed(model: nn.Module) -> list[float]:
        optimizer = torch.optim.SGD(model.parameters(), lr=100.0)
        losses: list[float] = []
        for x, y in batches()[:BAD_LR_FROM]:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            losses.append(loss.item())
            loss.backward()
            optimizer.step()
        return losses

    bare = doomed(convnet())
    explosion = next(i for i, loss in enumerate(bare) if loss > 10 * bare[0])
    assert explosion <= 2
    model = convnet()
    with pytest.raises(TrainingHalted) as caught:
        with NeuralDbg(model, tmp_path, trial="lr100", halt_on=["nonfinite", "loss_spike"]):
            doomed(model)
    halted = caught.value
    assert explosion <= halted.step <= explosion + 1 and "the largest of its first" in halted.reason
    assert halted.last_step == halted.step + 2
    top = halted.diagnosis.hypotheses[0]
    assert (top.type, top.origin) == ("optimizer_divergence", "optimizer")
    assert "Optimizer divergence originated in the optimizer" in capsys.readouterr().out
    with open_recording(tmp_path, "lr100") as recording:
        assert recording.steps.tolist() == list(range(halted.last_step + 1))
        assert recording.triggers[0].step == halted.step  # later firings, while it explodes on, only record
        np.testing.assert_allclose(recording.kpi("loss")[1], bare[:halted.last_step + 1], rtol=1e-5)


def test_flag_mode_sets_should_stop_at_the_optimizer_step_and_keeps_recording(tmp_path: Path, explosion: int,
                                                                             capsys: pytest.CaptureFixture) -> None:
    model = convnet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    losses: list[float] = []
    with NeuralDbg(model, tmp_path, trial="flag", optimizer=optimizer, summaries=50, snapshots=None,
                   halt_on=spike_triggers(), halt_mode="flag", halt_delay=1) as dbg:
        updates = train(model, optimizer, losses, dbg)
        assert dbg.should_stop and dbg.halt is not None
    halt = dbg.halt
    assert explosion <= halt.step <= explosion + 1 and halt.last_step == halt.step + 1
    assert updates == halt.last_step + 1  # with optimizer=: seen at that step's optimizer.step()
    assert halt.diagnosis is not None and "training halted" in capsys.readouterr().out
    with open_recording(tmp_path, "flag") as recording:
        assert recording.steps.tolist() == list(range(updates))


def test_raise_mode_with_optimizer_raises_from_the_optimizer_step(tmp_path: Path) -> None:
    model = convnet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    losses: list[float] = []
    with pytest.raises(TrainingHalted) as caught:
        with NeuralDbg(model, tmp_path, trial="opt", optimizer=optimizer, summaries=50, snapshots=None,
                       halt_on=spike_triggers(), halt_delay=0):
            train(model, optimizer, losses)
    assert caught.value.last_step == caught.value.step and len(losses) == caught.value.step + 1


def test_a_trigger_built_with_halt_true_halts_at_the_first_nan_and_other_triggers_only_record(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    flight = FlightRecorder(steps=5, triggers=[LossSpike(factor=2, window=4, min_history=2), NonFinite(halt=True)])
    seen = 0
    with pytest.raises(TrainingHalted) as caught:
        with NeuralDbg(model, tmp_path, trial="nan", summaries=10, snapshots=None, flight_recorder=flight,
                       halt_delay=0):
            for step in range(20):
                x = torch.randn(8, 4) * (10.0 ** step if step in (6, 7) else 1.0)  # a loss spike, recorded only
                if step == 12:
                    x[0, 0] = float("nan")
                optimizer.zero_grad()
                model(x).pow(2).mean().backward()
                optimizer.step()
                seen += 1
    assert caught.value.step == 12 and caught.value.reason.startswith("non-finite values in")
    assert seen == 13
    with open_recording(tmp_path, "nan") as recording:
        fired = [t.step for t in recording.triggers]
        assert fired[-1] == 12 and len(fired) >= 2  # the loss spike fired before, without halting
        assert recording.steps.tolist()[-6:] == list(range(7, 13))  # the ring of 5 and the step that tripped
    assert flight.triggers[1].halt and not flight.triggers[0].halt  # the user's flight recorder is untouched


@pytest.mark.parametrize("halt_on", [spike_triggers, lambda: ["nonfinite", "loss_spike"]], ids=["tuned", "named"])
def test_a_healthy_run_never_halts(tmp_path: Path, halt_on: Callable[[], list]) -> None:
    model = convnet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    with NeuralDbg(model, tmp_path, trial="healthy", halt_on=halt_on(), halt_mode="flag") as dbg:
        for x, y in batches()[:BAD_LR_FROM]:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
    assert not dbg.should_stop and dbg.halt is None


def test_the_recorder_reports_a_halt_request_for_explicit_registration(tmp_path: Path) -> None:
    flight = FlightRecorder(steps=4, triggers=[NonFinite(halt=True)])
    with Recorder(tmp_path, "rec", summaries=100, snapshots=None, flight_recorder=flight) as rec:
        for step in range(6):
            rec.start_step(step)
            rec.register_tensor("x", torch.tensor([1.0, float("inf") if step == 4 else 2.0]))
            rec.finish_step()
            assert rec.halt_request == (None if step < 4 else (4, "non-finite values in 'x' (value)"))


def test_bad_halting_arguments_are_refused_with_what_to_do(tmp_path: Path) -> None:
    model = convnet()
    with pytest.raises(InvalidArgumentError, match="halt_mode is 'raise'.*or 'flag'"):
        NeuralDbg(model, tmp_path, trial="a", halt_mode="stop")
    with pytest.raises(InvalidArgumentError, match="halt_on takes flight-recorder triggers.*'loss_spike', 'nonfinite'"):
        NeuralDbg(model, tmp_path, trial="b", halt_on=["nan"])
    with pytest.raises(InvalidArgumentError, match="halt_delay .* an int >= 0"):
        NeuralDbg(model, tmp_path, trial="c", halt_on=["nonfinite"], halt_delay=-1)
    with pytest.raises(InvalidArgumentError, match="halt=.... must be True or False"):
        NonFinite(halt="yes")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    merged = halting_flight_recorder(FlightRecorder(steps=3, after=1, triggers=[LossSpike()]), "nonfinite")
    assert (merged.steps, merged.after, [repr(t) for t in merged.triggers]) == (
        3, 1, ["LossSpike(kpi='loss', factor=10)", "NonFinite(halt=True)"])

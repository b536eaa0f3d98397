"""Reading, checking and comparing recordings where they had gone wrong: a damaged snapshot index refused by
the reader that skips damage, a trial switch that dropped the skip mode, ``check`` raising h5py's own
exceptions on garbled metadata, a short healthy run read as a failure, unchecked thresholds, step types named
differently in a reference run, and a negative batch dimension of the Comgra layer (real files)."""
from __future__ import annotations

import os
import warnings
from pathlib import Path

import h5py
import pytest
import torch

from comgra_ndbg import ComgraError, Recorder, check, open_recording
from comgra_ndbg.analysis.api import analyze
from comgra_ndbg.analysis.config import Thresholds
from comgra_ndbg.errors import InvalidArgumentError


def _record(folder: Path, trial: str, steps: int = 10, *, step_type: str = "default", scale_from: int | None = None,
            snapshots: int = 5, model: torch.nn.Module | None = None, lr: float = 1e-2, batch: int = 16) -> list[float]:
    """A small regression run recorded by ``Recorder`` (every parameter tracked); its losses. ``scale_from``:
    inputs ×255 from that step on."""
    torch.manual_seed(0)
    if model is None:
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
        optimizer: torch.optim.Optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    with Recorder(folder, trial=trial, summaries=1, snapshots=snapshots) as rec:
        rec.track_module("m", model)
        for step in range(steps):
            x = torch.randn(batch, 4) * (255 if scale_from is not None and step >= scale_from else 1)
            rec.start_step(step, step_type=step_type)
            rec.register_tensor("x", x, role="input")
            loss = model(x).pow(2).mean()
            rec.register_tensor("loss", loss, role="loss")
            optimizer.zero_grad()
            loss.backward()
            rec.record_gradients()
            optimizer.step()
            rec.record_kpi("loss", loss)
            rec.finish_step()
            losses.append(loss.item())
    return losses


def _flip(path: Path, offset: int, mask: int = 0xFF) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= mask
    path.write_bytes(bytes(data))


def test_a_damaged_snapshot_index_leaves_the_summaries_readable_with_skip(tmp_path: Path) -> None:
    _record(tmp_path, "t")
    path = tmp_path / "t" / "recording.h5"
    with h5py.File(path, "r") as f:
        dataset = f["snapshot/samples_count"]
        offset = dataset.id.get_chunk_info(0).byte_offset if dataset.chunks else dataset.id.get_offset()
    _flip(path, offset)
    with open_recording(tmp_path, "t", damaged="skip") as recording:
        assert recording.steps.tolist() == list(range(10))
        assert len(recording.summary("x", "value", "mean")[0]) == 10
        assert list(recording.snapshot_steps("x")) == []
        assert any("snapshots are left out" in d.what for d in recording.damage)


def test_another_trial_is_read_with_the_same_skip_mode(tmp_path: Path) -> None:
    _record(tmp_path, "a")
    _record(tmp_path, "b")
    path = tmp_path / "b" / "recording.h5"
    with h5py.File(path, "r") as f:
        info = f["summary/data"].id.get_chunk_info(0)
    _flip(path, info.byte_offset + info.size // 2)
    with open_recording(tmp_path, "a", damaged="skip") as first, first.with_trial("b") as other:
        assert other.skip_damage
        other.summary("m.0.weight", "value", "mean")  # reads around the damaged chunk
        assert other.damage


def test_check_gives_a_report_or_a_typed_error_for_every_flip_of_a_group_header(tmp_path: Path) -> None:
    """Single-bit flips in the object header of the file's ``modules`` group: ``check`` had raised h5py's
    KeyError (and, elsewhere, RuntimeError and an IndexError of the step reader)."""
    _record(tmp_path / "good", "t")
    source = (tmp_path / "good" / "t" / "recording.h5").read_bytes()
    with h5py.File(tmp_path / "good" / "t" / "recording.h5", "r") as f:
        address = h5py.h5o.get_info(f["modules"].id).addr
    bad = tmp_path / "bad" / "t"
    os.makedirs(bad)
    outcomes = []
    for offset in range(address, address + 120, 3):
        data = bytearray(source)
        data[offset] ^= 1
        (bad / "recording.h5").write_bytes(bytes(data))
        try:
            check(bad)
            outcomes.append("report")
        except ComgraError:
            outcomes.append("typed error")
    assert len(outcomes) == 40 and "report" in outcomes


def test_a_short_healthy_run_whose_loss_falls_is_no_failure(tmp_path: Path) -> None:
    """20 steps, fewer than two windows: the rule for states present from the first step had no second
    window to see the loss fall in, and read large early updates as optimizer divergence (confidence 0.73)."""
    torch.manual_seed(0)
    losses = _record(tmp_path, "t", 20, model=torch.nn.Linear(4, 2), lr=0.1, batch=8)
    assert losses[-1] < losses[0] / 10
    assert analyze(tmp_path, trial="t", store=False).hypotheses == ()


@pytest.mark.parametrize("kwargs", [dict(window=-3), dict(window=0), dict(window=2.5),
                                    dict(divergence_factor=float("nan")), dict(spike_factor=0.0),
                                    dict(persist="3")])
def test_thresholds_that_no_rule_can_run_with_are_refused(kwargs: dict) -> None:
    [(name, _)] = kwargs.items()
    with pytest.raises(InvalidArgumentError, match=f"Thresholds.{name} must be"):
        Thresholds(**kwargs)


def test_a_reference_whose_single_step_type_is_named_otherwise_is_still_compared(tmp_path: Path) -> None:
    _record(tmp_path, "good", 40, step_type="train", snapshots=10)
    _record(tmp_path, "bad", 40, step_type="training", scale_from=20, snapshots=10)
    diagnosis = analyze(tmp_path, trial="bad", reference=tmp_path, reference_trial="good", store=False)
    assert "unnormalised_input" in [h.type for h in diagnosis.hypotheses]
    assert "this run's step type 'training' was compared with the reference's 'train'" in diagnosis.explain()


def test_the_comgra_layer_takes_a_negative_batch_dimension_as_comgra_does(tmp_path: Path) -> None:
    from comgra_ndbg.compat.comgra.objects import DecisionMakerForRecordingsHardcoded
    from comgra_ndbg.compat.comgra.recorder import ComgraRecorder

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        recorder = ComgraRecorder(tmp_path, "g", "t", DecisionMakerForRecordingsHardcoded([0]))
        recorder.track_module("m", torch.nn.Linear(3, 2))
        recorder.start_batch(0, 4)
        recorder.start_iteration()
        recorder.register_tensor("feature_major", torch.randn(3, 4), index_of_batch_dimension=-1)  # no error
        with pytest.raises(InvalidArgumentError, match="index_of_batch_dimension must be a dimension"):
            recorder.register_tensor("out_of_range", torch.randn(3, 4), index_of_batch_dimension=-3)


def test_the_comgra_layer_names_recorder_options_that_the_recorder_does_not_take(tmp_path: Path) -> None:
    from comgra_ndbg.compat.comgra.objects import DecisionMakerForRecordingsHardcoded
    from comgra_ndbg.compat.comgra.recorder import ComgraRecorder

    with pytest.raises(InvalidArgumentError, match=r"Recorder does not take: \['flush_every_second'\]"):
        ComgraRecorder(tmp_path, "g", "t", DecisionMakerForRecordingsHardcoded([0]),
                       recorder_options={"flush_every_second": 5})

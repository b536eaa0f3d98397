"""Property-based fuzzing of every public call of the recording path (``fuzz_calls``): whatever a user
does, the outcome is a typed error that says what to do, or a skip documented in the recording's problems
log; never a crash of the training loop, a changed tensor, or data lost without a word.

Profiles (``conftest.py``): ``CI=true`` runs a fixed, derandomized set of cases; elsewhere hypothesis
explores anew each run. ``COMGRA_FUZZ_EXAMPLES`` raises the number of cases.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from comgra_ndbg import ComgraError, Recorder, open_recording
from comgra_ndbg.store.writer import RecordingWriter
from fuzz_calls import calls, constructor_arguments, names, run_case, says_what_to_do, steps, tensors

EXAMPLES = int(os.environ.get("COMGRA_FUZZ_EXAMPLES", "60"))


@settings(max_examples=EXAMPLES)
@given(calls())
def test_any_sequence_of_calls_never_crashes_the_loop_nor_loses_data_silently(ops: list[tuple]) -> None:
    outcome = run_case(ops)
    assert outcome.crashes == [], outcome.crashes
    assert outcome.unhelpful == [], outcome.unhelpful
    assert outcome.silent_losses == [], outcome.silent_losses


@settings(max_examples=EXAMPLES)
@given(constructor_arguments())
def test_any_constructor_arguments_give_a_recorder_or_a_typed_error(kwargs: dict) -> None:
    with tempfile.TemporaryDirectory() as folder:
        try:
            rec = Recorder(folder, **kwargs)
        except ComgraError as error:
            assert says_what_to_do(str(error)), str(error)
            return
        with rec:
            with rec.step(0):
                rec.register_tensor("x", torch.ones(2, 2))
                rec.record_kpi("loss", 1.0)
        with open_recording(folder) as recording:
            assert recording.steps.tolist() in ([0], [])  # as the policies say
            assert recording.kpi("loss")[0].tolist() == [0]  # KPIs are kept for every step


@settings(max_examples=EXAMPLES)
@given(st.one_of(st.none(), st.integers(), st.text(max_size=5), st.just(b"runs"), st.just(["runs"])))
def test_any_group_path_is_a_folder_or_a_typed_error(path: object) -> None:
    with tempfile.TemporaryDirectory() as folder:
        cwd = os.getcwd()
        os.chdir(folder)
        try:
            Recorder(path, trial="t").close()
        except ComgraError as error:
            assert says_what_to_do(str(error)), str(error)
        finally:
            os.chdir(cwd)


@settings(max_examples=EXAMPLES)
@given(names(), st.sampled_from(["value", "grad", "update", "grad:aux", 3, None]),
       st.sampled_from(["mean", "std", "bogus", None, 1]), steps(), st.one_of(st.none(), st.integers(-2, 3)))
def test_any_query_of_a_recording_gives_data_or_a_typed_error(tmp_path_factory: pytest.TempPathFactory,
                                                              name: object, kind: object, stat: object,
                                                              step: object, iteration: object) -> None:
    folder = _small_recording(tmp_path_factory)
    with open_recording(folder) as recording:
        for query in (lambda: recording.summary(name, kind, stat),
                      lambda: recording.summary_rows(name, kind, iteration=iteration),
                      lambda: recording.snapshot(step, name, kind, iteration=iteration or 0),
                      lambda: recording.snapshot_steps(name, kind),
                      lambda: recording.kpi(name, step_type=None if iteration is None else "train"),
                      lambda: recording.graph(name),
                      lambda: recording.log(name),
                      lambda: recording.step_type_of(step)):
            try:
                query()
            except ComgraError as error:
                assert str(error), query
    for bad in (None, 3, b"x", folder / "missing"):
        with pytest.raises(ComgraError):
            open_recording(bad)


_RECORDINGS: dict[str, Path] = {}


def _small_recording(factory: pytest.TempPathFactory) -> Path:
    if "small" not in _RECORDINGS:
        folder = factory.mktemp("small")
        with Recorder(folder, trial="t", snapshots=1) as rec:
            for step in range(3):
                with rec.step(step, "train"):
                    x = rec.register_tensor("x", torch.randn(2, 3, requires_grad=True))
                    (x * 2).sum().backward()
                    rec.record_gradients()
                    rec.record_kpi("loss", float(step))
        _RECORDINGS["small"] = folder
    return _RECORDINGS["small"]


@given(tensors())
@settings(max_examples=EXAMPLES)
def test_the_tensor_strategy_covers_what_it_claims(tensor: object) -> None:
    if isinstance(tensor, torch.Tensor) and not tensor.is_nested:
        assert tensor.dtype is not None and tensor.dim() >= 0


# ---- the oracle itself: it must see what it claims to see ------------------------------------------------------------
def case() -> list[tuple]:
    return [("start_step", 0, "train"), ("register_tensor", "x", torch.ones(2, 2), "intermediate", None, None, "auto"),
            ("record_kpi", "loss", 1.5), ("add_note", "hello"), ("finish_step",), ("start_step", 1, "train"),
            ("register_tensor", "x", torch.ones(2, 2), "intermediate", None, None, "auto")]


def test_the_oracle_passes_a_clean_case_and_catches_a_silent_loss(monkeypatch: pytest.MonkeyPatch) -> None:
    clean = run_case(case())
    assert clean.crashes == [] and clean.silent_losses == [] and clean.calls == len(case())
    monkeypatch.setattr(RecordingWriter, "add_summaries", lambda *args, **kwargs: None)  # rows vanish, no word
    monkeypatch.setattr(RecordingWriter, "add_note", lambda *args, **kwargs: None)
    lossy = run_case(case())
    assert lossy.silent_losses == ["tensor 'x' registered at step 0 is not recorded",
                                   "tensor 'x' registered at step 1 is not recorded", "note 'hello' is not recorded"]


def test_the_oracle_catches_a_crash_and_a_changed_tensor(monkeypatch: pytest.MonkeyPatch) -> None:
    def clobber(self: Recorder, name: str, tensor: torch.Tensor, **kwargs: object) -> torch.Tensor:
        tensor.add_(1)  # a recorder that writes into the training's tensor
        raise RuntimeError("boom")

    monkeypatch.setattr(Recorder, "register_tensor", clobber)
    outcome = run_case(case()[:2])
    assert outcome.crashes == ["register_tensor('x', Tensor, 'intermediate', None, None, 'auto'): RuntimeError: boom",
                               "register_tensor changed the tensor it was handed"]

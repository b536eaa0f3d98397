"""The real-world silent-error bench (benchmarks/silent_errors): every port shows its bug in the buggy variant
and not in the fixed one, the scoring counts what it says, and the runner reports what the recordings hold."""
from __future__ import annotations

import json
import random
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from benchmarks.silent_errors.__main__ import main, run_case
from benchmarks.silent_errors.ports_data import randomly_corrupt_data, transfer_data_loss
from benchmarks.silent_errors.ports_ddp import ddp_wrapped_sometimes
from benchmarks.silent_errors.ports_loop import frozen_except_bn, frozen_stages_not_applied, missing_zero_grad
from benchmarks.silent_errors.registry import CASES, NOT_PORTED, select
from benchmarks.silent_errors.scoring import score
from comgra_ndbg import open_recording
from comgra_ndbg.analysis.api import stored_diagnosis
from comgra_ndbg.analysis.events import CausalChain, Diagnosis, Event, Hypothesis
from comgra_ndbg.errors import InvalidArgumentError

COLLECTION = {  # the folders of silent-issue-detection/bug-reprod-scripts in the TrainCheck workloads
    "baichuan2-86", "deepspeed-1801", "deepspeed-5794", "lightning-thunder-725", "mmpretrain-702",
    "pytorch-104336", "pytorch-115607", "pytorch-51800", "pytorch-84803", "pytorch-96600", "pytorch-forum-84911",
    "stackoverflow-60335387", "stackoverflow-67180955", "transformers-17877", "transformers-23723",
    "transformers-33844", "transformers-34204", "x-jxmnop-ddp-out-of-sync",
}


@pytest.fixture(autouse=True)
def one_thread() -> None:
    torch.set_num_threads(1)


def test_every_reproduction_of_the_collection_is_ported_or_says_why_not() -> None:
    ported = {c.name for c in CASES}
    assert ported | set(NOT_PORTED) == COLLECTION
    assert not ported & set(NOT_PORTED)
    assert all(len(reason) > 30 for reason in NOT_PORTED.values())


def test_missing_zero_grad_carries_gradients_into_the_next_step(tmp_path: Path) -> None:
    buggy = missing_zero_grad("buggy", tmp_path, steps=4)
    fixed = missing_zero_grad("fixed", tmp_path, steps=4)
    assert buggy.symptom["carried_grad_norm"] > 1.0 and buggy.first_effect == 1
    assert fixed.symptom["carried_grad_norm"] == 0.0 and fixed.first_effect is None
    with open_recording(buggy.trials[0]) as recording:
        assert recording.steps.tolist() == [0, 1, 2, 3]


def test_model_frozen_except_bn_never_moves_the_optimizers_parameters(tmp_path: Path) -> None:
    buggy = frozen_except_bn("buggy", tmp_path, steps=3)
    fixed = frozen_except_bn("fixed", tmp_path, steps=3)
    assert buggy.symptom["fc_change"] == 0.0
    assert fixed.symptom["fc_change"] > 1e-3


def test_frozen_stage_trains_unless_train_is_called(tmp_path: Path) -> None:
    buggy = frozen_stages_not_applied("buggy", tmp_path, steps=10)
    fixed = frozen_stages_not_applied("fixed", tmp_path, steps=10)
    assert buggy.symptom["stage0_change"] > 1e-3
    assert fixed.symptom["stage0_change"] == 0.0
    assert fixed.symptom["loss_last"] < 0.8 * fixed.symptom["loss_first"]  # the rest of the model still trains


def test_corrupting_transfer_zeroes_about_one_tensor_in_a_hundred_in_place() -> None:
    random.seed(0)
    tensors = [torch.ones(3) for _ in range(5000)]
    hits = [randomly_corrupt_data(t) for t in tensors]
    assert 25 <= sum(hits) <= 75
    assert all(bool((t == 0).all()) == hit for t, hit in zip(tensors, hits))


def test_data_loss_zeroes_a_batch_the_recording_sees_and_the_loss_feels(tmp_path: Path) -> None:
    buggy = transfer_data_loss("buggy", tmp_path, steps=64)
    fixed = transfer_data_loss("fixed", tmp_path, steps=64)
    assert buggy.first_effect == 62 and buggy.symptom["zeroed_input_ids"] == 1.0
    assert buggy.symptom["loss_corrupted_max"] > 100 * buggy.symptom["loss_clean_median"]
    assert fixed.symptom["corrupted_steps"] == 0.0 and fixed.first_effect is None
    with open_recording(buggy.trials[0]) as recording:
        _, abs_max = recording.summary("input", "value", "abs_max", tensor="input[0]")
    assert abs_max[62] == 0.0 and abs_max[61] > 0.0


@pytest.mark.slow  # two spawned processes per variant: each imports torch afresh
def test_ddp_wrapped_on_odd_steps_only_lets_the_replicas_drift_apart(tmp_path: Path) -> None:
    buggy = ddp_wrapped_sometimes("buggy", tmp_path, steps=4)
    fixed = ddp_wrapped_sometimes("fixed", tmp_path, steps=4)
    assert buggy.symptom["replica_gap"] > 0.0 and buggy.first_effect == 0
    assert fixed.symptom["replica_gap"] == 0.0
    for trial in buggy.trials + fixed.trials:  # one trial per variant, one folder per rank
        with open_recording(trial) as recording:
            assert recording.ranks == [0, 1]
            for rank in recording.ranks:
                with recording.with_rank(rank) as one:
                    assert one.steps.tolist() == [0, 1, 2, 3]


def _event(to_state: str, onset: int) -> Event:
    return Event(family="optimizer_stability", node="loss", kind="kpi", from_state="stable", to_state=to_state,
                 onset=onset, end=onset, magnitude=2.0, strength=1.0)


def _hypothesis(kind: str, onset: int) -> Hypothesis:
    return Hypothesis(type=kind, origin="loop", node="", onset=onset, confidence=0.9, sentence="",
                      chain=CausalChain(root=_event("spike", onset)))


def _diagnosis(*hypotheses: Hypothesis, events: tuple[Event, ...] = ()) -> Diagnosis:
    return Diagnosis(trial="t", num_steps=60, last_step=59, events=events, coupled=(), hypotheses=hypotheses)


def test_score_counts_a_hypothesis_within_two_steps_and_names_its_cause() -> None:
    near = score("c", "o", ("stale_gradients",), [_diagnosis(_hypothesis("stale_gradients", 3))], 1,
                 [_diagnosis()])
    assert (near.detected, near.cause_named, near.false_alarm) == (True, True, False)
    late = score("c", "o", ("stale_gradients",), [_diagnosis(_hypothesis("stale_gradients", 4))], 1,
                 [_diagnosis(_hypothesis("loss_spike", 30))])
    assert (late.detected, late.cause_named, late.false_alarm) == (False, False, True)
    assert late.found.endswith("late") and late.alarm.startswith("loss_spike")
    wrong = score("c", "o", ("stale_gradients",), [_diagnosis(_hypothesis("loss_spike", 1))], 1, [_diagnosis()])
    assert (wrong.detected, wrong.cause_named) == (True, False)


def test_score_counts_an_event_alone_as_detected_but_not_as_the_cause_named() -> None:
    result = score("c", "o", ("loss_spike",), [_diagnosis(events=(_event("spike", 11),))], 12, [_diagnosis()])
    assert (result.detected, result.cause_named) == (True, False)
    assert result.found == "event optimizer_stability:spike @11"


def test_run_case_scores_the_missing_zero_grad_from_its_recordings(tmp_path: Path) -> None:
    [case] = select("stackoverflow-60335387")
    result, facts = run_case(case, tmp_path)
    buggy = stored_diagnosis(tmp_path / case.name / "buggy")
    fixed = stored_diagnosis(tmp_path / case.name / "fixed")
    assert result == score(case.name, case.origin, case.cause_types, [buggy], 1, [fixed])
    assert result.detected and result.cause_named and not result.false_alarm
    assert facts["buggy"]["symptom"]["carried_grad_norm"] > 0.0 == facts["fixed"]["symptom"]["carried_grad_norm"]


def test_runner_prints_the_table_and_writes_what_the_stored_diagnoses_say(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture) -> None:
    out, report = tmp_path / "runs", tmp_path / "result.json"
    assert main(["--cases", "mmpretrain-702", "--out", str(out), "--json", str(report)]) == 0
    printed = capsys.readouterr().out
    [row] = json.loads(report.read_text())
    buggy = stored_diagnosis(out / "mmpretrain-702" / "buggy")
    fixed = stored_diagnosis(out / "mmpretrain-702" / "fixed")
    expected = score("mmpretrain-702", row["origin"], ("wrong_mode",), [buggy], 0, [fixed])
    assert (row["detected"], row["cause_named"], row["false_alarm"]) == (True, True, False)
    assert (expected.detected, expected.cause_named, expected.false_alarm) == (True, True, False)
    assert row["buggy"]["symptom"]["stage0_change"] > 0.0 == row["fixed"]["symptom"]["stage0_change"]
    assert "mmpretrain-702" in printed and "wrong_mode (loop) @0" in printed
    assert "detected 1/1 · cause named 1/1 · false alarms 0/1" in printed


def test_runner_refuses_unknown_cases_and_a_folder_with_recordings(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="pytorch-104336: needs CUDA.*choose from|choose from.*needs CUDA"):
        select("stackoverflow-60335387,pytorch-104336")
    (tmp_path / "old" / "trial").mkdir(parents=True)
    with pytest.raises(SystemExit):
        main(["--cases", "stackoverflow-60335387", "--out", str(tmp_path)])


def test_runner_reports_a_case_that_fails_to_run_and_keeps_the_others(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(variant: str, folder: Path) -> None:
        raise RuntimeError("gloo could not connect")

    [good] = select("pytorch-forum-84911")
    cases = (good, replace(good, name="broken-case", run=broken))
    monkeypatch.setattr("benchmarks.silent_errors.__main__.select", lambda names: cases)
    report = tmp_path / "result.json"
    assert main(["--cases", "any", "--out", str(tmp_path / "runs"), "--json", str(report)]) == 1
    printed = capsys.readouterr().out
    assert "broken-case: FAILED TO RUN (RuntimeError: gloo could not connect)" in printed
    assert re.search(r"detected [01]/1 · cause named [01]/1 · false alarms [01]/1", printed)
    rows = json.loads(report.read_text())
    assert [r["case"] for r in rows] == ["pytorch-forum-84911", "broken-case"] and "error" in rows[1]

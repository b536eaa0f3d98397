"""The loop family of diagbench: its faulty cases really show their symptom, their fixed twins and the
intentional patterns train without it, and the scoring counts what it claims to count."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from benchmarks.diagbench.families import select
from benchmarks.diagbench.families_loop import FAULT, FIXED, INTENTIONAL, loop_cases
from benchmarks.diagbench.loop_bench import evaluate_loop_run, judge, loop_specs, score_loop


def run(tmp_path: Path, case: str, seed: int = 0) -> dict:
    spec = next(s for s in loop_specs(seeds=1, seed_offset=seed) if s.case == case)
    return evaluate_loop_run(spec, tmp_path)


def test_every_invariant_has_a_fault_and_its_fixed_twin_and_t0_is_mid_run_only_for_mid_run_faults() -> None:
    cases = {c.name: c for c in loop_cases()}
    faults = [c for c in cases.values() if c.kind == FAULT]
    assert len(faults) == 16 and all(cases[f"{c.name}_fixed"].kind == FIXED for c in faults)
    assert {c.name for c in cases.values() if c.kind == INTENTIONAL} == {
        "accumulation", "gan", "frozen_backbone", "eval_passes", "warmup", "ema"}
    for spec in loop_specs(seeds=2):
        assert (24 <= spec.t0 <= 36) if cases[spec.case].mid_run else spec.t0 == 0
    twins = {s.case: s.t0 for s in loop_specs(seeds=1)}
    assert all(twins[f"{c.name}_fixed"] == twins[c.name] for c in faults)


@pytest.mark.parametrize("case", ["no_zero_grad", "unused_branch"])
def test_a_mid_run_fault_shows_its_symptom_at_t0_and_its_fixed_twin_trains_without_it(tmp_path: Path,
                                                                                       case: str) -> None:
    faulty, fixed = run(tmp_path, case), run(tmp_path, f"{case}_fixed")
    assert faulty["valid"] and faulty["effect"] == faulty["t0"], faulty["validation"]
    assert fixed["valid"] and fixed["effect"] == -1, fixed["validation"]
    assert (tmp_path / faulty["name"]).is_dir() and (tmp_path / fixed["name"]).is_dir()


@pytest.mark.parametrize("case", ["update_guard_stuck", "resume_assign", "validation_train_mode",
                                  "step_guard_never_true"])
def test_the_later_faults_show_their_symptom_and_their_twins_train_without_it(tmp_path: Path, case: str) -> None:
    faulty, fixed = run(tmp_path, case), run(tmp_path, f"{case}_fixed")
    assert faulty["valid"] and fixed["valid"], (faulty["validation"], fixed["validation"])
    if case == "validation_train_mode":  # the first validation at or after t0 runs in train mode
        assert faulty["t0"] <= faulty["effect"] < faulty["t0"] + 8 and faulty["effect"] % 8 == 7
    else:
        assert faulty["effect"] == faulty["t0"]


def test_a_gradient_accumulation_run_is_healthy_and_a_raw_pixel_run_shows_its_scale(tmp_path: Path) -> None:
    healthy, raw = run(tmp_path, "accumulation"), run(tmp_path, "raw_pixels")
    assert healthy["valid"] and healthy["kind"] == INTENTIONAL, healthy["validation"]
    assert raw["valid"] and "input rms" in raw["validation"]
    assert float(raw["validation"].split("input rms ")[1]) >= 20


def test_a_backbone_frozen_on_purpose_gives_one_note_with_the_trainable_share_and_no_hypothesis(tmp_path: Path
                                                                                               ) -> None:
    frozen = run(tmp_path, "frozen_backbone")
    assert frozen["hypotheses"] == []
    assert len(frozen["notes"]) == 1 and frozen["notes"][0].startswith("14 % of the model's parameter elements")


def test_the_loop_family_stays_out_of_the_default_run_and_its_folds() -> None:
    assert "loop" not in select() and "loop" not in select(held_back=True)
    with pytest.raises(ValueError, match="unknown families"):
        select("loop,mlp")


def test_judge_counts_a_detection_only_within_two_steps_of_the_first_effect() -> None:
    record = {"kind": FAULT, "effect": 30, "truth": {"type": "stale_gradients", "origin": "loop", "nodes": []},
              "hypotheses": [{"type": "optimizer_instability", "origin": "optimizer", "node": "", "onset": 31,
                              "family": "trend"},
                             {"type": "stale_gradients", "origin": "loop", "node": "", "onset": 33,
                              "family": "loop_invariant"}]}
    assert judge(record) == {"detected": False, "type": False, "cause": False, "named": True}
    record["hypotheses"][1]["onset"] = 32
    assert judge(record)["detected"]
    healthy = {"kind": FIXED, "hypotheses": [{"type": "loss_spike", "family": "trend"}]}
    assert judge(healthy) == {"alarm": True, "loop_alarm": False}


def test_score_leaves_invalid_runs_out_and_gives_a_wilson_interval() -> None:
    records = [{"case": "gan", "kind": INTENTIONAL, "valid": True, "hypotheses": []},
               {"case": "gan", "kind": INTENTIONAL, "valid": True,
                "hypotheses": [{"type": "wrong_mode", "family": "loop_invariant"}]},
               {"case": "gan", "kind": INTENTIONAL, "valid": False, "hypotheses": [{"type": "x", "family": "t"}]}]
    scored = score_loop(records)
    assert scored["cases"]["gan"] == {"kind": INTENTIONAL, "runs": 3, "valid": 2, "alarm": 1, "loop_alarm": 1}
    alarm = scored["pooled"]["loop_alarm/intentional"]
    assert (alarm["hits"], alarm["n"]) == (1, 2)
    assert 0.0 < alarm["wilson"][0] < 0.5 < alarm["wilson"][1] < 1.0
    assert np.isnan(scored["pooled"]["detected/all"]["wilson"][0])


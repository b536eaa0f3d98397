"""diagbench's scoring on hand-made records (no training): node matching, metrics, leave-one-family-out."""
from __future__ import annotations

import math

import pytest

from benchmarks.diagbench.families import HELD_BACK, select
from benchmarks.diagbench.lofo import lofo
from benchmarks.diagbench.metrics import node_matches, objective, score, wilson


def _record(name: str, family: str, *, fault: str | None = None, hypotheses: tuple[dict, ...] = (),
            valid: bool = True, nodes: tuple[str, ...] = ("blocks.2",), origin: str = "node") -> dict:
    truth = {"family": family, "config": {"family": family, "name": "c"}}
    if fault is not None:
        truth.update(fault=fault, type=fault, origin=origin, nodes=list(nodes), t0=100)
    return {"name": name, "family": family, "healthy": fault is None, "valid": valid, "truth": truth,
            "effects": {}, "validation": "checked",
            "analysis": {"default": {"hypotheses": list(hypotheses), "seconds": 0.1}}, "B0": None, "B1": None}


def _hypothesis(type_: str, node: str = "model.blocks.2.fc1", onset: int = 100, origin: str = "node",
                features: tuple[float, ...] = (1.0,)) -> dict:
    return {"type": type_, "origin": origin, "node": node, "onset": onset, "confidence": 0.9,
            "features": list(features), "sentence": type_, "chain": []}


def test_node_matches_module_prefixes_across_naming_schemes() -> None:
    assert node_matches("model.blocks.2.fc1.parameters", ["blocks.2"])
    assert node_matches("blocks.2.pre", ["blocks.2"])
    assert node_matches("model.rnn[0]", ["rnn"])
    assert not node_matches("model.blocks.20.fc1", ["blocks.2"])
    assert not node_matches("model", ["blocks.2"])


def test_score_counts_detection_type_origin_abstention_and_false_alarms() -> None:
    records = [_record("a", "f", fault="vanishing", hypotheses=(_hypothesis("vanishing"),)),
               _record("b", "f", fault="vanishing", hypotheses=(_hypothesis("unclear: vanishing or dead_units"),)),
               _record("c", "f", fault="vanishing", hypotheses=(_hypothesis("vanishing", node="model.head"),
                                                               _hypothesis("vanishing"))),
               _record("d", "f", fault="vanishing", valid=False),
               _record("h1", "f"), _record("h2", "f", hypotheses=(_hypothesis("exploding"),))]
    s = score([{**r, "predictions": r["analysis"]["default"]["hypotheses"], "seconds": 0.1} for r in records])
    assert (s["faulty_runs"], s["valid_faulty_runs"], s["healthy_runs"]) == (4, 3, 2)
    assert s["tpr"] == 1.0 and s["fpr"] == 0.5 and s["abstentions"] == 1
    assert s["type_accuracy"] == pytest.approx(2 / 3)
    assert s["origin_top1"] == pytest.approx(2 / 3) and s["origin_top3"] == 1.0
    assert s["confusion"] == {"vanishing -> vanishing": 2, "vanishing -> unclear: vanishing or dead_units": 1}
    assert objective(s) == pytest.approx(2 / 3 + 2 / 3 + 1 - 5)


def test_wilson_interval_of_zero_false_alarms() -> None:
    low, high = wilson(0, 100)
    assert low == 0.0 and 0.03 < high < 0.04
    assert all(math.isnan(v) for v in wilson(0, 0))


def test_lofo_calibrates_each_family_on_the_others_only() -> None:
    right, wrong = _hypothesis("vanishing", features=(1.0,)), _hypothesis("exploding", features=(0.0,))
    records = []
    for family in ("x", "y"):
        records += [_record(f"{family}{i}", family, fault="vanishing", hypotheses=(right,)) for i in range(6)]
        records += [_record(f"{family}h{i}", family, hypotheses=(wrong,)) for i in range(6)]
    # in family w the strong feature goes with wrong types: fitted on w itself, its confidence would drop
    inverted = _hypothesis("dead_units", features=(1.0,))
    records += [_record(f"w{i}", "w", fault="vanishing", hypotheses=(inverted,)) for i in range(24)]
    result = lofo(records, ["default"])
    assert set(result["folds"]) == {"x", "y", "w"}
    assert result["folds"]["w"]["calibration_rows"] == 24
    assert result["folds"]["x"]["calibration_rows"] == 36
    confidence = {r["name"]: r["predictions"][0]["confidence"] for r in result["held_out"]}
    assert confidence["w0"] > 0.6 and confidence["x0"] < 0.5
    assert result["scores"]["analysis"]["w"]["ece"] > 0.6
    assert result["scores"]["analysis"]["pooled"]["valid_faulty_runs"] == 36


def test_held_back_families_are_left_out_unless_named() -> None:
    assert not set(HELD_BACK) & set(select())
    assert set(HELD_BACK) <= set(select(held_back=True))
    assert select("rnn,mlp") == ["rnn", "mlp"]
    assert "cnn" not in select(exclude="cnn")
    with pytest.raises(ValueError, match="unknown families"):
        select("nope")

"""Scores of one method over a set of runs, from per-run records whose ``predictions`` are ranked (best
first) dicts with ``type``, ``origin``, ``node``, ``onset``, ``confidence`` and ``chain``.

A prediction is *right* when its type equals the truth's and its origin does too; for an origin ``node``
the predicted node must lie under one of the truth's acceptable module-path prefixes (``model.`` and a
``.parameters`` suffix are ignored, so ``model.blocks.2.fc1.parameters`` lies under ``blocks.2``). An
abstention — a type starting with ``unclear`` — counts as a wrong type and is counted apart.
"""
from __future__ import annotations

import math
from collections import Counter

import numpy as np

ABSTAIN = "unclear"


def node_matches(node: str, prefixes: list[str]) -> bool:
    """Whether a graph node lies under one of the module-path ``prefixes``."""
    name = node[len("model."):] if node.startswith("model.") else node
    name = name[:-len(".parameters")] if name.endswith(".parameters") else name
    return any(name == p or name.startswith((p + ".", p + "[", p + "#")) for p in prefixes)


def origin_matches(prediction: dict, truth: dict) -> bool:
    if truth["origin"] == "node":
        return prediction["origin"] == "node" and node_matches(prediction["node"], truth["nodes"])
    return prediction["origin"] == truth["origin"]


def is_right(record: dict, prediction: dict | None) -> bool:
    if record["healthy"] or prediction is None:
        return False
    return prediction["type"] == record["truth"]["type"] and origin_matches(prediction, record["truth"])


def is_abstention(prediction: dict | None) -> bool:
    return prediction is not None and prediction["type"].startswith(ABSTAIN)


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a proportion (95 % by default)."""
    if n == 0:
        return (float("nan"), float("nan"))
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def calibration_errors(confidence: np.ndarray, correct: np.ndarray, bins: int = 10) -> tuple[float, float]:
    """ECE over ``bins`` equal-width bins, and the Brier score."""
    if not len(confidence):
        return float("nan"), float("nan")
    index = np.clip(np.digitize(confidence, np.linspace(0, 1, bins + 1)[1:-1]), 0, bins - 1)
    ece = sum(float((index == b).mean()) * abs(float(confidence[index == b].mean() - correct[index == b].mean()))
              for b in range(bins) if (index == b).any())
    return ece, float(np.mean((confidence - correct) ** 2))


def _mean(values: list) -> float:
    return float(np.mean(values)) if len(values) else float("nan")


def score(records: list[dict]) -> dict:
    """Every metric over ``records`` (each with ``predictions``; runs that failed validation are counted,
    then left out)."""
    faulty_all = [r for r in records if not r["healthy"]]
    faulty = [r for r in faulty_all if r["valid"]]
    healthy = [r for r in records if r["healthy"] and r["valid"]]
    top = {r["name"]: (r["predictions"] or [None])[0] for r in records}
    s: dict = {"faulty_runs": len(faulty_all), "valid_faulty_runs": len(faulty), "healthy_runs": len(healthy),
               "dropped_healthy_runs": sum(r["healthy"] and not r["valid"] for r in records),
               "validation_rate": len(faulty) / len(faulty_all) if faulty_all else float("nan")}
    detected = [r for r in faulty if r["predictions"]]
    s["tpr"] = len(detected) / len(faulty) if faulty else float("nan")
    alarms = sum(1 for r in healthy if r["predictions"])
    s["false_alarms"] = alarms
    s["fpr"] = alarms / len(healthy) if healthy else float("nan")
    s["fpr_ci"] = wilson(alarms, len(healthy))
    s["early_alarms"] = sum(1 for r in faulty if r["truth"]["t0"] > 0 and any(
        p["onset"] < r["truth"]["t0"] - 2 for p in r["predictions"]))
    s["type_accuracy"] = _mean([top[r["name"]] is not None and top[r["name"]]["type"] == r["truth"]["type"]
                                for r in faulty])
    s["abstentions"] = sum(1 for r in faulty if is_abstention(top[r["name"]]))
    s["confusion"] = dict(Counter(f"{r['truth']['type']} -> {top[r['name']]['type'] if top[r['name']] else 'none'}"
                                  for r in faulty))
    s["origin_top1"] = _mean([bool(r["predictions"]) and origin_matches(r["predictions"][0], r["truth"])
                              for r in faulty])
    s["origin_top3"] = _mean([any(origin_matches(p, r["truth"]) for p in r["predictions"][:3]) for r in faulty])
    errors = [abs(top[r["name"]]["onset"] - r["truth"]["t0"]) for r in detected]
    s["onset_within_2"] = _mean([e <= 2 for e in errors])
    s["onset_median_error"] = float(np.median(errors)) if errors else float("nan")
    expected = [(r, label) for r in faulty for label, present in r["effects"].items() if present]
    s["chain_expected"] = len(expected)
    s["chain_recall"] = _mean([top[r["name"]] is not None and label in top[r["name"]].get("chain", ())
                               for r, label in expected])
    judged = [r for r in records if r["valid"] and top[r["name"]] is not None]
    confidence = np.array([top[r["name"]]["confidence"] for r in judged], dtype=float)
    correct = np.array([is_right(r, top[r["name"]]) for r in judged], dtype=float)
    s["ece"], s["brier"] = calibration_errors(confidence, correct)
    s["top_right_rate"] = float(correct.mean()) if len(correct) else float("nan")
    seconds = [r["seconds"] for r in records if r.get("seconds") is not None]
    s["seconds_mean"] = _mean(seconds)
    s["seconds_max"] = float(np.max(seconds)) if seconds else float("nan")
    return s


def objective(s: dict) -> float:
    """What the threshold grid is chosen by, on the other families: type accuracy + origin top-1 + TPR −
    10 × FPR (false alarms weigh most: they are what makes users switch a diagnoser off)."""
    parts = [s["type_accuracy"], s["origin_top1"], s["tpr"], -10 * s["fpr"]]
    return float(sum(0.0 if math.isnan(p) else p for p in parts))

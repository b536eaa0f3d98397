"""Scores of the analysis and the baselines over the per-run results of ``evaluate_run``."""
from __future__ import annotations

import math
import re
from collections import Counter

import numpy as np

from comgra_ndbg.analysis.calibration import calibrated_confidence, fit_platt

METHODS = ("analysis", "B0", "B1")
_BLOCK = re.compile(r"(?:^|\.)blocks\.(\d+)(?:\.|$)")


def origin_key(origin: str, node: str) -> str:
    """``block:<k>`` for a node inside block k, else the origin kind (``node:<name>`` for other nodes)."""
    if origin == "node":
        match = _BLOCK.search(node)
        return f"block:{match.group(1)}" if match else f"node:{node}"
    return origin


def predictions(record: dict, method: str) -> list[dict]:
    if method == "analysis":
        return record["hypotheses"]
    return [record[method]] if record[method] else []


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return (float("nan"), float("nan"))
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def calibration_errors(confidence: np.ndarray, correct: np.ndarray, bins: int = 10) -> tuple[float, float]:
    """ECE (equal-width bins) and Brier score."""
    if not len(confidence):
        return float("nan"), float("nan")
    edges = np.linspace(0, 1, bins + 1)
    index = np.clip(np.digitize(confidence, edges[1:-1]), 0, bins - 1)
    ece = 0.0
    for b in range(bins):
        chosen = index == b
        if chosen.any():
            ece += chosen.mean() * abs(confidence[chosen].mean() - correct[chosen].mean())
    return float(ece), float(np.mean((confidence - correct) ** 2))


def _correct(record: dict, prediction: dict | None) -> bool:
    if record["healthy"] or prediction is None:
        return False
    truth = record["truth"]
    origin = origin_key(prediction["origin"], prediction["node"])
    return prediction["type"] == truth["type"] and origin == truth["origin"]


def _calibration_rows(records: list[dict]) -> list[tuple[int, list[float], bool]]:
    """(seed parity, features, correct) of every ranked hypothesis — alternatives included, so the fit sees
    wrong explanations too (a hypothesis is correct when its type and origin match the truth)."""
    return [(r["seed"] % 2, h["features"], _correct(r, h)) for r in records for h in r["hypotheses"]]


def cross_validated_confidence(records: list[dict]) -> dict[str, float]:
    """Confidence of each run's top hypothesis from a calibration fitted on the runs of the other seed
    parity (2-fold cross-validation: no run is scored with constants fitted on it)."""
    rows = _calibration_rows(records)
    out: dict[str, float] = {}
    for fold in (0, 1):
        train = [(f, c) for parity, f, c in rows if parity != fold]
        test = [r for r in records if r["hypotheses"] and r["seed"] % 2 == fold]
        if not train or not test:
            continue
        weights, bias = fit_platt(np.array([f for f, _ in train]), np.array([c for _, c in train], float))
        for r in test:
            out[r["name"]] = calibrated_confidence(r["hypotheses"][0]["features"], weights=weights, bias=bias)
    return out


def fit_all(records: list[dict]) -> tuple[tuple[float, ...], float]:
    """Calibration constants fitted on every hypothesis of every run (what analysis/calibration.py ships)."""
    rows = _calibration_rows(records)
    return fit_platt(np.array([f for _, f, _ in rows]), np.array([c for _, _, c in rows], float))


def score(records: list[dict], method: str, cv_confidence: dict[str, float] | None = None) -> dict:
    faulty_all = [r for r in records if not r["healthy"]]
    faulty = [r for r in faulty_all if r["valid"]]
    healthy = [r for r in records if r["healthy"]]
    s: dict = {"faulty_runs": len(faulty_all), "valid_faulty_runs": len(faulty), "healthy_runs": len(healthy),
               "validation_rate": len(faulty) / len(faulty_all) if faulty_all else float("nan")}
    detected = [r for r in faulty if predictions(r, method)]
    s["tpr"] = len(detected) / len(faulty) if faulty else float("nan")
    alarms = sum(1 for r in healthy if predictions(r, method))
    s["fpr"] = alarms / len(healthy) if healthy else float("nan")
    s["fpr_ci"] = wilson(alarms, len(healthy))
    s["early_alarms"] = sum(1 for r in faulty if r["truth"]["t0"] > 0 and any(
        p["onset"] < r["truth"]["t0"] - 2 for p in predictions(r, method)))
    top = {r["name"]: (predictions(r, method) or [None])[0] for r in faulty}
    s["type_accuracy"] = np.mean([top[r["name"]] is not None and top[r["name"]]["type"] == r["truth"]["type"]
                                  for r in faulty]) if faulty else float("nan")
    s["confusion"] = dict(Counter(f"{r['truth']['type']} -> {top[r['name']]['type'] if top[r['name']] else 'none'}"
                                  for r in faulty))
    origins = {r["name"]: [origin_key(p["origin"], p["node"]) for p in predictions(r, method)] for r in faulty}
    s["origin_top1"] = np.mean([o[:1] == [r["truth"]["origin"]] for r, o in
                                ((r, origins[r["name"]]) for r in faulty)]) if faulty else float("nan")
    s["origin_top3"] = (np.mean([r["truth"]["origin"] in origins[r["name"]][:3] for r in faulty]) if faulty
                        else float("nan"))
    errors = [abs(top[r["name"]]["onset"] - r["truth"]["t0"]) for r in detected]
    s["onset_within_2"] = np.mean([e <= 2 for e in errors]) if errors else float("nan")
    s["onset_median_error"] = float(np.median(errors)) if errors else float("nan")
    expected = [(r, label) for r in faulty for label, present in r["effects"].items() if present]
    if method == "analysis":
        s["chain_recall"] = np.mean([label in r["chain"] for r, label in expected]) if expected else float("nan")
    else:
        s["chain_recall"] = 0.0 if expected else float("nan")
    s["chain_expected"] = len(expected)
    judged = [r for r in records if predictions(r, method)]
    confidence = np.array([predictions(r, method)[0]["confidence"] for r in judged])
    correct = np.array([_correct(r, predictions(r, method)[0]) for r in judged], dtype=float)
    s["ece_shipped"], s["brier_shipped"] = calibration_errors(confidence, correct)
    if method == "analysis" and cv_confidence is not None:
        cv = np.array([cv_confidence.get(r["name"], np.nan) for r in judged])
        keep = np.isfinite(cv)
        s["ece"], s["brier"] = calibration_errors(cv[keep], correct[keep])
    else:
        s["ece"], s["brier"] = s["ece_shipped"], s["brier_shipped"]
    s["top_correct_rate"] = float(correct.mean()) if len(correct) else float("nan")
    seconds = [r["analysis_seconds"] for r in records]
    s["analysis_seconds_mean"] = float(np.mean(seconds)) if seconds else float("nan")
    s["analysis_seconds_max"] = float(np.max(seconds)) if seconds else float("nan")
    return s




def table(scores: dict[str, dict]) -> str:
    """The side-by-side table of every metric, with the targets."""
    rows = [
        ("runs: faulty (valid) / healthy",
         lambda s: f"{s['faulty_runs']} ({s['valid_faulty_runs']}) / {s['healthy_runs']}"),
        ("validation rate", lambda s: f"{s['validation_rate']:.2f}"),
        ("TPR", lambda s: f"{s['tpr']:.3f}"),
        ("FPR [Wilson 95%]", lambda s: f"{s['fpr']:.3f} [{s['fpr_ci'][0]:.3f}, {s['fpr_ci'][1]:.3f}]"),
        ("faulty runs alarmed before t0-2", lambda s: f"{s['early_alarms']}"),
        ("fault-type accuracy", lambda s: f"{s['type_accuracy']:.3f}"),
        ("origin top-1", lambda s: f"{s['origin_top1']:.3f}"),
        ("origin top-3", lambda s: f"{s['origin_top3']:.3f}"),
        ("onset within ±2 steps", lambda s: f"{s['onset_within_2']:.3f}"),
        ("onset median |error|", lambda s: f"{s['onset_median_error']:.1f}"),
        ("coupled-chain recall", lambda s: f"{s['chain_recall']:.3f} (of {s['chain_expected']})"),
        ("ECE, 10 bins (2-fold CV by seed)", lambda s: f"{s['ece']:.3f}"),
        ("Brier (2-fold CV by seed)", lambda s: f"{s['brier']:.3f}"),
        ("ECE / Brier, shipped constants", lambda s: f"{s['ece_shipped']:.3f} / {s['brier_shipped']:.3f}"),
        ("analysis s/run (mean / max)",
         lambda s: f"{s['analysis_seconds_mean']:.3f} / {s['analysis_seconds_max']:.3f}"),
    ]
    names = list(scores)
    width = 34
    lines = [f"{'metric':{width}s}" + "".join(f"{n:>26s}" for n in names) + "   target"]
    targets = {"TPR": "≥ 0.95", "FPR [Wilson 95%]": "≤ 0.02", "fault-type accuracy": "≥ 0.90",
               "origin top-1": "≥ 0.90", "onset within ±2 steps": "≥ 0.90",
               "ECE, 10 bins (2-fold CV by seed)": "≤ 0.10",
               "analysis s/run (mean / max)": "≤ 1 s"}
    for label, fn in rows:
        cells = []
        for n in names:
            try:
                cells.append(fn(scores[n]))
            except (KeyError, TypeError, ValueError):
                cells.append("-")
        lines.append(f"{label:{width}s}" + "".join(f"{c:>26s}" for c in cells) + f"   {targets.get(label, '')}")
    return "\n".join(lines)


def confusion_table(confusion: dict[str, int]) -> str:
    return "\n".join(f"  {k:50s} {v}" for k, v in sorted(confusion.items()))

"""Leave-one-family-out scoring: whatever is fitted is fitted on the other families and applied to the
held-out one.

For each family F: (a) the grid entry (``grid.GRID``) with the best ``metrics.objective`` over the runs of
the other families is chosen, and F is scored with that entry's hypotheses; (b) a Platt calibration
(``fit_platt``) is fitted on the ``features`` of every ranked hypothesis of the other families' runs
(labelled right when type and origin match the truth; every hypothesis of a healthy run is wrong; each run's
top hypothesis weighs ``TOP_WEIGHT``, each alternative 1: ``rank_weights``) and gives the confidence of F's
top hypotheses. The pooled figures are the scores over every family's held-out
records together. With a single family there is nothing to fit on: the default entry and the engine's own
confidence are used, and the fold says so.
"""
from __future__ import annotations

import numpy as np

from benchmarks.diagbench.metrics import is_right, objective, score
from comgra_ndbg.analysis.calibration import calibrated_confidence, fit_platt, rank_weights

METHODS = ("analysis", "B0", "B1")
DEFAULT = "default"


def predictions(record: dict, method: str, entry: str = DEFAULT) -> tuple[list[dict], float | None]:
    """The ranked predictions of ``method`` for one run, and the seconds the analysis took."""
    if method == "analysis":
        found = record["analysis"].get(entry)
        if found is None:
            return [], None
        return [dict(h) for h in found["hypotheses"]], found["seconds"]
    return ([dict(record[method], chain=[])] if record[method] else []), None


def view(records: list[dict], method: str, entry: str = DEFAULT,
         calibration: tuple[tuple[float, ...], float] | float | None = None) -> list[dict]:
    """Records with ``predictions`` and ``seconds`` of one method; ``calibration`` (Platt weights and bias,
    or a constant) replaces the confidence of the top hypothesis."""
    out = []
    for record in records:
        found, seconds = predictions(record, method, entry)
        if found and calibration is not None:
            if isinstance(calibration, float):
                found[0]["confidence"] = calibration
            else:
                weights, bias = calibration
                found[0]["confidence"] = calibrated_confidence(found[0]["features"], weights=weights, bias=bias)
        out.append({**record, "predictions": found, "seconds": seconds})
    return out


def fit_calibration(records: list[dict], entry: str = DEFAULT) -> tuple[tuple[tuple[float, ...], float] | float,
                                                                        int]:
    """Platt constants fitted on every ranked hypothesis of ``records``, each run's weighed by
    ``rank_weights`` (with the number of hypotheses), or the weighted share of right ones when the fit is
    impossible (a single class, or no features)."""
    rows = [(h["features"], is_right(r, h), w) for r in view(records, "analysis", entry) if r["valid"]
            for h, w in zip(r["predictions"], rank_weights(len(r["predictions"])))]
    labels = np.array([c for _, c, _ in rows], dtype=float)
    weights = np.array([w for _, _, w in rows], dtype=float)
    widths = {len(f) for f, _, _ in rows}
    if not rows:
        return 0.5, 0
    if len(set(labels.tolist())) < 2 or len(widths) != 1 or widths == {0}:
        return float(np.average(labels, weights=weights)), len(rows)
    return fit_platt(np.array([f for f, _, _ in rows], dtype=float), labels, sample_weight=weights), len(rows)


def choose_entry(records: list[dict], entries: list[str]) -> tuple[str, dict[str, float]]:
    """The grid entry with the best objective over ``records`` (ties: the first), and every entry's value."""
    values = {e: objective(score(view(records, "analysis", e))) for e in entries}
    return max(entries, key=lambda e: (values[e], -entries.index(e))), values


def lofo(records: list[dict], entries: list[str]) -> dict:
    """Per-family scores of every method (the analysis scored leave-one-family-out), the pooled scores, and
    what each fold chose."""
    families = list(dict.fromkeys(r["family"] for r in records))
    held_out: dict[str, list[dict]] = {m: [] for m in METHODS}
    folds, scores = {}, {m: {} for m in METHODS}
    for family in families:
        own = [r for r in records if r["family"] == family]
        others = [r for r in records if r["family"] != family]
        if others:
            entry, values = choose_entry(others, entries)
            calibration, rows = fit_calibration(others, entry)
        else:
            entry, values, calibration, rows = DEFAULT, {}, None, 0
        folds[family] = {"entry": entry, "objective_on_others": values, "calibration_rows": rows,
                         "calibration": calibration}
        for method in METHODS:
            scored = view(own, method, entry, calibration) if method == "analysis" else view(own, method)
            held_out[method] += scored
            scores[method][family] = score(scored)
    for method in METHODS:
        scores[method]["pooled"] = score(held_out[method])
    return {"folds": folds, "scores": scores, "held_out": held_out["analysis"]}

"""The printed report: per-family tables (LOFO) with the pooled figures and the worst family, the baselines
beside the analysis, the confusion matrix, validation and dropped runs, false alarms and wrong types.

Only the families of the result appear: a run that leaves a family out never mentions it.
"""
from __future__ import annotations

import math
from collections import Counter, defaultdict

from benchmarks.diagbench.faults import TYPES
from benchmarks.diagbench.metrics import is_abstention, origin_matches

TITLES = ("per-family scores of the analysis", "baselines", "confusion of the analysis", "validation")
TARGETS = {"tpr": "≥ 0.95", "fpr": "≤ 0.02", "type_accuracy": "≥ 0.90", "origin_top1": "≥ 0.90",
           "onset_within_2": "≥ 0.90", "ece": "≤ 0.10", "seconds_mean": "≤ 1 s"}
# (key, label, format, direction for "worst": +1 higher is better, -1 lower is better, 0 none)
ROWS = (
    ("runs", "runs: faulty (valid) / healthy", None, 0),
    ("validation_rate", "validation rate", "{:.2f}", 0),
    ("tpr", "detection TPR", "{:.3f}", 1),
    ("fpr", "FPR over healthy runs", "{:.3f}", -1),
    ("fpr_ci", "FPR Wilson 95 % interval", None, 0),
    ("early_alarms", "faulty runs alarmed before t0−2", "{:d}", -1),
    ("type_accuracy", "fault-type accuracy (top-1)", "{:.3f}", 1),
    ("abstentions", "abstentions (unclear)", "{:d}", -1),
    ("origin_top1", "origin top-1", "{:.3f}", 1),
    ("origin_top3", "origin top-3", "{:.3f}", 1),
    ("onset_within_2", "onset within ±2 steps", "{:.3f}", 1),
    ("onset_median_error", "onset median |error|", "{:.1f}", -1),
    ("chain_recall", "coupled-chain recall", None, 1),
    ("ece", "ECE, 10 bins (LOFO confidence)", "{:.3f}", -1),
    ("brier", "Brier (LOFO confidence)", "{:.3f}", -1),
    ("seconds_mean", "analysis s/run (mean / max)", None, -1),
)


def _cell(s: dict, key: str, fmt: str | None) -> str:
    value = s.get(key)
    if key == "runs":
        return f"{s['faulty_runs']} ({s['valid_faulty_runs']}) / {s['healthy_runs']}"
    if key == "fpr_ci":
        low, high = s["fpr_ci"]
        return "-" if math.isnan(low) else f"{low:.3f}–{high:.3f}"
    if key == "chain_recall":
        return "-" if math.isnan(value) else f"{value:.2f} ({s['chain_expected']})"
    if key == "seconds_mean":
        return "-" if math.isnan(value) else f"{value:.2f} / {s['seconds_max']:.2f}"
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return fmt.format(value)


def _worst(per_family: dict[str, dict], key: str, direction: int, fmt: str | None) -> str:
    if not direction:
        return ""
    values = {f: s[key] for f, s in per_family.items() if not math.isnan(float(s[key]))}
    if not values:
        return ""
    family = min(values, key=lambda f: direction * values[f])
    shown = _cell(per_family[family], key, fmt).split(" [")[0].split(" (")[0].split(" /")[0]
    return f"{shown} {family}"


def family_table(scores: dict[str, dict], *, worst: bool = True, targets: bool = True) -> str:
    """Metrics (rows) × families, the pooled column and the worst family."""
    families = [f for f in scores if f != "pooled"]
    per_family = {f: scores[f] for f in families}
    rows = []
    for key, label, fmt, direction in ROWS:
        cells = [_cell(scores[c], key, fmt) for c in families + ["pooled"]]
        rows.append((key, label, cells + ([_worst(per_family, key, direction, fmt)] if worst else [])))
    columns = families + ["pooled"] + (["worst"] if worst else [])
    widths = [max(len(c), *(len(r[2][i]) for r in rows)) + 2 for i, c in enumerate(columns)]
    lines = [f"{'metric':32s}" + "".join(f"{c:>{w}s}" for c, w in zip(columns, widths))
             + ("   target" if targets else "")]
    for key, label, cells in rows:
        lines.append(f"{label:32s}" + "".join(f"{c:>{w}s}" for c, w in zip(cells, widths))
                     + (f"   {TARGETS.get(key, '')}" if targets else ""))
    return "\n".join(lines)


def comparison_table(scores: dict[str, dict[str, dict]]) -> str:
    """Pooled figures of the analysis and of the baselines, side by side."""
    methods = list(scores)
    lines = [f"{'metric':32s}" + "".join(f"{m:>22s}" for m in methods) + "   target"]
    for key, label, fmt, _ in ROWS:
        cells = "".join(f"{_cell(scores[m]['pooled'], key, fmt):>22s}" for m in methods)
        lines.append(f"{label:32s}{cells}   {TARGETS.get(key, '')}")
    return "\n".join(lines)


def confusion_table(confusion: dict[str, int]) -> str:
    """Truth type (rows) × top-1 type (columns: the labels that occur, ``none`` when nothing was found)."""
    pairs = {tuple(k.split(" -> ")): v for k, v in confusion.items()}
    rows = [t for t in TYPES if any(a == t for a, _ in pairs)]
    predicted = sorted({b for _, b in pairs}, key=lambda t: (t not in TYPES, TYPES.index(t) if t in TYPES else t))
    short = {t: t.replace("optimizer_", "opt_").replace("nonfinite_", "nf_").replace("imbalanced_", "imb_")[:11]
             for t in predicted}
    corner = "truth \\ top-1"
    lines = [f"{corner:22s}" + "".join(f"{short[p]:>12s}" for p in predicted)]
    for t in rows:
        lines.append(f"{t:22s}" + "".join(f"{pairs.get((t, p), 0) or '.':>12}" for p in predicted))
    return "\n".join(lines)


def validation_table(runs: list[dict]) -> str:
    """Per fault: runs, valid runs, dropped; dropped runs with what was measured."""
    per_fault: dict[str, Counter] = defaultdict(Counter)
    for r in runs:
        if not r["healthy"]:
            per_fault[r["truth"]["fault"]]["runs"] += 1
            per_fault[r["truth"]["fault"]]["valid"] += r["valid"]
    lines = [f"{'fault':24s}{'runs':>6s}{'valid':>7s}{'dropped':>9s}"]
    for fault, c in per_fault.items():
        lines.append(f"{fault:24s}{c['runs']:>6d}{c['valid']:>7d}{c['runs'] - c['valid']:>9d}")
    healthy = [r for r in runs if r["healthy"]]
    lines.append(f"{'healthy runs':24s}{len(healthy):>6d}{sum(r['valid'] for r in healthy):>7d}"
                 f"{sum(not r['valid'] for r in healthy):>9d}")
    lines += [f"  dropped {r['name']}: {r['validation']}" for r in runs if not r["valid"]]
    return "\n".join(lines)


def per_fault_table(held_out: list[dict]) -> str:
    """The analysis per fault (valid runs) and the alarms per healthy configuration, over all families."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in held_out:
        if r["healthy"] and r["valid"]:
            groups["H " + r["truth"]["config"]["family"] + "/" + r["truth"]["config"]["name"]].append(r)
        elif r["valid"]:
            groups[r["truth"]["fault"]].append(r)
    lines = [f"{'fault / healthy configuration':44s}{'runs':>5s}{'found':>7s}{'type':>6s}{'unclear':>8s}"
             f"{'origin':>8s}{'onset±2':>8s}"]
    for name, rs in groups.items():
        top = [(r["predictions"] or [None])[0] for r in rs]
        if name.startswith("H "):
            lines.append(f"{name:44s}{len(rs):>5d}{sum(t is not None for t in top):>7d}  (false alarms)")
            continue
        typed = sum(t is not None and t["type"] == r["truth"]["type"] for t, r in zip(top, rs))
        origin = sum(t is not None and origin_matches(t, r["truth"]) for t, r in zip(top, rs))
        onset = sum(t is not None and abs(t["onset"] - r["truth"]["t0"]) <= 2 for t, r in zip(top, rs))
        lines.append(f"{name:44s}{len(rs):>5d}{sum(t is not None for t in top):>7d}{typed:>6d}"
                     f"{sum(is_abstention(t) for t in top):>8d}{origin:>8d}{onset:>8d}")
    return "\n".join(lines)


def report(result: dict) -> str:
    """The whole report of one benchmark run."""
    runs = result["runs"]
    healthy = sum(r["healthy"] for r in runs)
    lines = [f"diagbench v2 {'smoke' if result['smoke'] else 'full'}: {len(runs)} runs ({len(runs) - healthy} "
             f"faulty, {healthy} healthy) of families {', '.join(result['families'])} in "
             f"{result['wall_seconds']:.0f} s with {result['jobs']} workers (seed offset {result['seed_offset']}, "
             f"grid {', '.join(result['grid'])})"]
    if not result.get("analysed", True):
        return "\n".join(lines + ["", f"== {TITLES[3]} ==", validation_table(runs)])
    scores, folds = result["scores"], result["folds"]
    lines += ["", f"== {TITLES[0]} (leave-one-family-out) ==", family_table(scores["analysis"]), "",
              "fold choices: " + "; ".join(f"{f}: {v['entry']} ({v['calibration_rows']} hypotheses calibrated)"
                                           for f, v in folds.items()),
              "", f"== {TITLES[1]}: pooled figures beside the analysis ==", comparison_table(scores)]
    for method in ("B0", "B1"):
        lines += ["", f"-- {method} per family --", family_table(scores[method], worst=False, targets=False)]
    lines += ["", f"== {TITLES[2]} (pooled, valid faulty runs; columns: top-1 type) ==",
              confusion_table(scores["analysis"]["pooled"]["confusion"]),
              "", "== per fault and healthy configuration (analysis, LOFO) ==", per_fault_table(result["held_out"]),
              "", f"== {TITLES[3]} ==", validation_table(runs)]
    alarms = [r for r in result["held_out"] if r["healthy"] and r["valid"] and r["predictions"]]
    lines += ["", f"false alarms ({len(alarms)}):"] + [f"  {r['name']}: {r['predictions'][0]['sentence']}"
                                                       for r in alarms]
    wrong = [r for r in result["held_out"] if not r["healthy"] and r["valid"]
             and (not r["predictions"] or r["predictions"][0]["type"] != r["truth"]["type"])]
    lines += [f"wrong or missing type ({len(wrong)}):"]
    for r in wrong:
        top = r["predictions"][0]["sentence"] if r["predictions"] else "no hypothesis"
        lines.append(f"  {r['name']} (truth {r['truth']['type']} at {r['truth']['origin']}): {top}")
    return "\n".join(lines)

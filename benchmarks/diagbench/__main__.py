"""``python -m benchmarks.diagbench [--smoke] [--jobs 2] [--out results.json]``: run, analyse and score.

Runs are trained and recorded in worker processes (one torch thread each) into a temporary folder (or
``--keep DIR``; ``--reuse`` analyses recordings already there instead of training again), analysed with
``comgra_ndbg.analyze``, validated against their fault's defining symptom, and scored with the
baselines beside the analysis.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from multiprocessing import get_context
from pathlib import Path

from benchmarks.diagbench.evaluate import evaluate_run, recording_overhead
from benchmarks.diagbench.metrics import METHODS, confusion_table, cross_validated_confidence, fit_all, score, table
from benchmarks.diagbench.runs import all_specs


def run(smoke: bool, jobs: int, folder: Path, reuse: bool, only: str | None, overhead: bool,
        seed_offset: int = 0) -> dict:
    specs = [s for s in all_specs(smoke, seed_offset) if only is None or only in s.name]
    started = time.perf_counter()
    with get_context("fork").Pool(jobs) as pool:
        pending = pool.starmap_async(evaluate_run, [(s, folder, reuse) for s in specs], chunksize=1)
        ratio = pool.apply_async(recording_overhead, (folder,)) if overhead else None
        records = pending.get()
        overhead_ratio = ratio.get() if ratio is not None else None
    wall = time.perf_counter() - started
    cv = cross_validated_confidence(records)
    scores = {m: score(records, m, cv if m == "analysis" else None) for m in METHODS}
    weights, bias = fit_all(records)
    return {"smoke": smoke, "jobs": jobs, "seed_offset": seed_offset, "wall_seconds": wall,
            "recording_overhead": overhead_ratio,
            "scores": scores, "fitted_calibration": {"weights": weights, "bias": bias}, "runs": records}


def report(result: dict) -> str:
    scores = result["scores"]
    lines = [f"diagbench {'smoke' if result['smoke'] else 'full'}: {len(result['runs'])} runs in "
             f"{result['wall_seconds']:.0f} s with {result['jobs']} workers (seed offset {result['seed_offset']})", "",
             table(scores), ""]
    if result["recording_overhead"] is not None:
        lines.append(f"recording overhead (400 steps, relu_adam, recorder on / off): "
                     f"{result['recording_overhead']:.2f}×")
    lines.append("confusion of the analysis (truth -> top hypothesis):")
    lines.append(confusion_table(scores["analysis"]["confusion"]))
    dropped = [r for r in result["runs"] if not r["healthy"] and not r["valid"]]
    if dropped:
        lines.append("runs dropped by validation: " + ", ".join(f"{r['name']} ({r['validation']})" for r in dropped))
    alarms = [r for r in result["runs"] if r["healthy"] and r["hypotheses"]]
    for r in alarms:
        lines.append(f"false alarm {r['name']}: {r['hypotheses'][0]['sentence']}")
    wrong = [r for r in result["runs"] if not r["healthy"] and r["valid"]
             and (not r["hypotheses"] or r["hypotheses"][0]["type"] != r["truth"]["type"])]
    for r in wrong:
        top = r["hypotheses"][0]["sentence"] if r["hypotheses"] else "no hypothesis"
        lines.append(f"wrong type {r['name']} (truth {r['truth']['type']} at {r['truth']['origin']}): {top}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.diagbench", description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="the CI subset: one seed per fault and per healthy config")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--out", type=Path, help="write every score and per-run result as JSON here")
    parser.add_argument("--keep", type=Path, help="record into this folder and keep the recordings")
    parser.add_argument("--reuse", action="store_true", help="analyse recordings already in --keep instead of training")
    parser.add_argument("--only", help="only runs whose name contains this text")
    parser.add_argument("--seed-offset", type=int, default=0,
                        help="shift every seed (e.g. 1000: held-out seeds never used to set thresholds)")
    parser.add_argument("--no-overhead", action="store_true", help="skip the recording-overhead measurement")
    parser.add_argument("--fit-calibration", action="store_true",
                        help="print calibration constants fitted on every run (for analysis/calibration.py)")
    args = parser.parse_args(argv)
    if args.reuse and args.keep is None:
        parser.error("--reuse needs --keep DIR")
    with tempfile.TemporaryDirectory(prefix="diagbench-") as temp:
        folder = args.keep or Path(temp)
        folder.mkdir(parents=True, exist_ok=True)
        result = run(args.smoke, args.jobs, folder, args.reuse, args.only, overhead=not args.no_overhead,
                     seed_offset=args.seed_offset)
    print(report(result))
    if args.fit_calibration:
        fitted = result["fitted_calibration"]
        print(f"WEIGHTS = {tuple(round(w, 4) for w in fitted['weights'])}\nBIAS = {round(fitted['bias'], 4)}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m benchmarks.diagbench``: train, record, validate, analyse and score diagbench v2.

Runs are trained and recorded in worker processes (one torch thread each) into a temporary folder (or
``--keep DIR``; ``--reuse`` analyses the recordings already there instead of training again), validated
against their fault's defining symptom, analysed once per grid entry and scored leave-one-family-out with
the baselines beside the analysis. Held-back families (``families.HELD_BACK``) are left out unless
``--with-held-back`` is given or they are named in ``--families``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from multiprocessing import get_context
from pathlib import Path

from benchmarks.diagbench.evaluate import evaluate_run
from benchmarks.diagbench.families import HELD_BACK, select
from benchmarks.diagbench.grid import GRID
from benchmarks.diagbench.lofo import DEFAULT, fit_calibration, lofo
from benchmarks.diagbench.report import report
from benchmarks.diagbench.specs import all_specs
from benchmarks.diagbench.training import DEFAULTS, DETAIL_VARIABLE
from comgra_ndbg.stats import kernels

COST = {"cnn": 4, "resmlp": 3, "transformer": 3, "rnn": 2, "mlp": 2, "twobranch": 1, "autoencoder": 1}
"""Rough relative training cost, to start the slow runs first and keep both workers busy to the end."""


def run(*, smoke: bool = False, jobs: int = 2, folder: Path, reuse: bool = False, only: str | None = None,
        families: str | None = None, exclude: str | None = None, held_back: bool = False,
        seed_offset: int = 0, analysis: bool = True) -> dict:
    """Every step of the benchmark; returns the result (scores, folds and per-run records) as a dict."""
    chosen = select(families, exclude, held_back=held_back)
    specs = [s for s in all_specs(chosen, smoke=smoke, seed_offset=seed_offset) if only is None or only in s.name]
    specs.sort(key=lambda s: -COST.get(s.family, 1))
    kernels.warm_up()
    started = time.perf_counter()
    with get_context("fork").Pool(jobs) as pool:
        records = pool.starmap(evaluate_run, [(s, folder, reuse, analysis) for s in specs], chunksize=1)
    wall = time.perf_counter() - started
    order = {s.name: i for i, s in enumerate(sorted(specs, key=lambda s: (chosen.index(s.family), s.name)))}
    records.sort(key=lambda r: order[r["name"]])
    result = {"smoke": smoke, "jobs": jobs, "families": [f for f in chosen if any(r["family"] == f for r in records)],
              "seed_offset": seed_offset, "wall_seconds": wall, "grid": list(GRID), "analysed": analysis,
              "runs": records}
    if analysis and records:
        result.update(lofo(records, list(GRID)))
    return result


LOOP = "loop"
"""``--families loop``: the loop-invariant cases (``families_loop``), run alone and scored on their own."""


def _run_loop_family(args: argparse.Namespace) -> int:
    """Train, analyse and score the loop family; it is never part of the default run or of its folds."""
    from benchmarks.diagbench.loop_bench import healthy_bench_alarms, report_loop, run_loop, write_loop

    with tempfile.TemporaryDirectory(prefix="diagbench-loop-") as temp:
        folder = args.keep or Path(temp)
        folder.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        result = run_loop(folder, jobs=args.jobs, seed_offset=args.seed_offset, only=args.only)
        if args.loop_healthy_seeds:
            result["healthy_bench"] = healthy_bench_alarms(folder, jobs=args.jobs, seeds=args.loop_healthy_seeds,
                                                           seed_offset=args.seed_offset)
    result["wall_seconds"] = time.perf_counter() - started
    print(report_loop(result))
    print(f"wall {result['wall_seconds']:.0f} s")
    if args.out:
        write_loop(result, args.out)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.diagbench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="the CI subset: every family, a mix of faults, one seed")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--out", type=Path, help="write every score and per-run result as JSON here")
    parser.add_argument("--keep", type=Path, help="record into this folder and keep the recordings")
    parser.add_argument("--reuse", action="store_true", help="analyse recordings already in --keep instead of training")
    parser.add_argument("--only", help="only runs whose name contains this text")
    parser.add_argument("--families", help="comma-separated families to run (default: all but the held-back ones); "
                                           "'loop' alone runs the loop-invariant cases, scored on their own")
    parser.add_argument("--exclude-families", help="comma-separated families to leave out")
    parser.add_argument("--with-held-back", action="store_true",
                        help=f"include the held-back families ({', '.join(HELD_BACK)})")
    parser.add_argument("--seed-offset", type=int, default=0,
                        help="shift every seed (e.g. 1000: seeds never looked at while tuning)")
    parser.add_argument("--loop-healthy-seeds", type=int, default=2,
                        help="with --families loop: seeds of every healthy control of the other families checked "
                             "for loop-invariant hypotheses (default 2; 0: none)")
    parser.add_argument("--detail", choices=(DEFAULTS, "full", "tiered"), default=DEFAULTS,
                        help="the recorders' detail= for the runs trained here (default: each recorder's own, "
                             "tiered for NeuralDbg, full for Recorder)")
    parser.add_argument("--validate-only", action="store_true", help="train and validate, do not analyse")
    parser.add_argument("--fit-calibration", action="store_true",
                        help="print calibration constants fitted on every run (for analysis/calibration.py)")
    args = parser.parse_args(argv)
    if args.reuse and args.keep is None:
        parser.error("--reuse needs --keep DIR")
    if args.families == LOOP:
        return _run_loop_family(args)
    try:
        select(args.families, args.exclude_families)
    except ValueError as error:
        parser.error(str(error))
    os.environ[DETAIL_VARIABLE] = args.detail  # read by the worker processes that train the runs
    with tempfile.TemporaryDirectory(prefix="diagbench-") as temp:
        folder = args.keep or Path(temp)
        folder.mkdir(parents=True, exist_ok=True)
        result = run(smoke=args.smoke, jobs=args.jobs, folder=folder, reuse=args.reuse, only=args.only,
                     families=args.families, exclude=args.exclude_families, held_back=args.with_held_back,
                     seed_offset=args.seed_offset, analysis=not args.validate_only)
    print(report(result))
    print("recorded with each recorder's default detail (NeuralDbg: 'tiered', Recorder: 'full')"
          if args.detail == DEFAULTS else f"recorded with detail={args.detail!r}")
    if args.fit_calibration and result.get("analysed"):
        fitted, rows = fit_calibration(result["runs"], DEFAULT)
        print(f"fitted on {rows} hypotheses: " + (f"constant {fitted:.4f}" if isinstance(fitted, float) else
                                                  f"WEIGHTS = {tuple(round(w, 4) for w in fitted[0])}\n"
                                                  f"BIAS = {round(fitted[1], 4)}"))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())

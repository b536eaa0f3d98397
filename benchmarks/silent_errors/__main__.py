"""``python -m benchmarks.silent_errors [--cases a,b] [--out DIR] [--json FILE]``: record every ported case
(buggy and fixed) under ``NeuralDbg``, analyse each trial with ``comgra_ndbg.analyze`` and print the table:
detected within 2 steps of the first effect, cause named, false alarm on the fixed variant, and totals.
A case that fails to run is reported and left out of the totals, and the exit status is then 1.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch

from benchmarks.silent_errors.cases import SOURCE, Case
from benchmarks.silent_errors.registry import NOT_PORTED, select
from benchmarks.silent_errors.scoring import WINDOW, Score, score
from comgra_ndbg.analysis.api import analyze
from comgra_ndbg.errors import InvalidArgumentError


def run_case(case: Case, folder: Path) -> tuple[Score, dict]:
    """Record and analyse both variants of ``case`` under ``folder / case.name``; the score and the
    measured symptoms and timings of both variants."""
    outcomes, diagnoses, seconds = {}, {}, {}
    for variant in ("buggy", "fixed"):
        started = time.perf_counter()
        outcomes[variant] = case.run(variant, folder / case.name)
        seconds[variant] = time.perf_counter() - started
        diagnoses[variant] = [analyze(trial) for trial in outcomes[variant].trials]
    result = score(case.name, case.origin, case.cause_types, diagnoses["buggy"], outcomes["buggy"].first_effect,
                   diagnoses["fixed"])
    facts = {v: {"symptom": outcomes[v].symptom, "seconds": round(seconds[v], 2)} for v in outcomes}
    return result, facts


def _mark(flag: bool) -> str:
    return "yes" if flag else "no"


def table(scores: list[Score]) -> str:
    """The result table as text, with the totals."""
    rows = [("case", "origin", "effect@", "detected", "cause named", "found (buggy)", "false alarm (fixed)")]
    for s in scores:
        named = _mark(s.cause_named) if s.expected else "no (no type)"
        alarm = f"yes: {s.alarm}" if s.false_alarm else "no"
        rows.append((s.case, s.origin, "-" if s.first_effect is None else str(s.first_effect), _mark(s.detected),
                     named, s.found, alarm))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    n = len(scores)
    lines.append(f"detected {sum(s.detected for s in scores)}/{n} · cause named {sum(s.cause_named for s in scores)}"
                 f"/{n} · false alarms {sum(s.false_alarm for s in scores)}/{n} (window ±{WINDOW} steps)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.silent_errors", description=__doc__.split("\n")[0])
    parser.add_argument("--cases", help="comma-separated case names (default: all)")
    parser.add_argument("--out", type=Path, help="folder for the recordings (default: a temporary folder)")
    parser.add_argument("--json", type=Path, help="also write the scores and symptoms to this file")
    args = parser.parse_args(argv)
    try:
        cases = select(args.cases)
    except InvalidArgumentError as error:
        parser.error(str(error))
    torch.set_num_threads(1)
    print(f"ported from {SOURCE}: {len(cases)} case(s), buggy and fixed, recorded by NeuralDbg at its defaults")
    with tempfile.TemporaryDirectory() as temporary:
        folder = args.out or Path(temporary)
        if args.out is not None and any(folder.glob("*/*")):
            parser.error(f"--out {folder} already holds recordings; give an empty or new folder")
        started = time.perf_counter()
        results, failed = [], {}
        for case in cases:
            try:
                results.append(run_case(case, folder))
            except Exception as error:  # one broken case must not cost the results of the others
                failed[case.name] = f"{type(error).__name__}: {error}"
        elapsed = time.perf_counter() - started
    scores = [s for s, _ in results]
    print(table(scores))
    for name, error in failed.items():
        print(f"  {name}: FAILED TO RUN ({error}); not counted above")
    for s, facts in results:
        print(f"  {s.case}: " + "; ".join(f"{v} {facts[v]['seconds']} s, "
                                           + ", ".join(f"{k}={x:.3g}" for k, x in facts[v]["symptom"].items())
                                           for v in facts))
    print(f"{elapsed:.1f} s in all")
    if not args.cases:
        print("not ported:")
        for name, reason in NOT_PORTED.items():
            print(f"  {name}: {reason}")
    if args.json is not None:
        rows = [{**asdict(s), **facts} for s, facts in results]
        args.json.write_text(json.dumps(rows + [{"case": n, "error": e} for n, e in failed.items()], indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m benchmarks.healthy_loops``: every healthy loop bare and recorded, side by side (see the package
docstring)."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.healthy_loops import REGISTRY


def _run(name: str, mode: str, root: Path) -> dict:
    out = root / f"{name}.{mode}.json"
    done = subprocess.run([sys.executable, "-m", "benchmarks.healthy_loops.harness", name, mode,
                           str(root / "runs" / name), str(out)], capture_output=True, text=True)
    if done.returncode or not out.exists():
        return {"case": name, "mode": mode, "exception": done.stderr[-2000:], "analysis": {}, "warnings": []}
    return json.loads(out.read_text())


def _mean(values: list[float], head: bool) -> float:
    n = max(1, min(10, len(values) // 10))
    part = values[:n] if head else values[-n:]
    return sum(part) / len(part)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="case names (default: all)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--keep", help="keep the recordings and results in this folder")
    args = parser.parse_args()
    names = args.only or list(REGISTRY)
    unknown = sorted(set(names) - set(REGISTRY))
    if unknown:
        parser.error(f"unknown cases {unknown}; the cases are {sorted(REGISTRY)}")
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(args.keep or scratch)
        (root / "runs").mkdir(parents=True, exist_ok=True)
        jobs = [(name, mode) for name in names for mode in ("bare", "dbg")]
        with ThreadPoolExecutor(args.jobs) as pool:
            results = dict(zip(jobs, pool.map(lambda job: _run(*job, root), jobs)))
    alarms, differ, failed = [], [], []
    for name in names:
        bare, dbg = results[(name, "bare")], results[(name, "dbg")]
        if bare.get("exception") or dbg.get("exception"):
            failed.append(name)
            print(f"{name:<34} FAILED\n{bare.get('exception') or dbg.get('exception')}")
            continue
        same = bare["losses"] == dbg["losses"] and bare["hash"] == dbg["hash"]
        if not same:
            differ.append(name)
        losses = dbg["losses"]
        print(f"{name:<34} loss {_mean(losses, True):.3g} -> {_mean(losses, False):.3g}  "
              f"{'identical to bare' if same else 'DIFFERS FROM BARE'}  {dbg['seconds']:.1f} s")
        flagged = False
        for trial, analysis in dbg["analysis"].items():
            for h in analysis.get("hypotheses", []):
                flagged = True
                print(f"    [{trial}] {h['type']} ({h['origin']}, {h['node'] or '-'}, step {h['onset']}, "
                      f"{h['confidence']:.2f}): {h['sentence']}")
            for note in analysis.get("notes", []):
                print(f"    [{trial}] note: {note}")
            if "exception" in analysis:
                failed.append(name)
                print(f"    [{trial}] analysis failed:\n{analysis['exception']}")
        for warning in dbg.get("warnings", []):
            print(f"    warning: {warning}")
        if flagged:
            alarms.append(name)
    print(f"\n{len(names)} healthy loops: {len(alarms)} with a hypothesis (false alarms) {alarms}; "
          f"{len(names) - len(differ) - len(failed)} identical to their bare run, {len(differ)} differ {differ}, "
          f"{len(failed)} failed {failed}")


if __name__ == "__main__":
    main()

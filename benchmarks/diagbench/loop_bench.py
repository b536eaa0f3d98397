"""Run, validate and score the ``loop`` family (:mod:`benchmarks.diagbench.families_loop`).

Scored apart from the architecture families: its runs are whole training loops, not a family's
configuration with a fault injected, and leaving them out of the default run keeps the leave-one-family-out
figures (thresholds, calibration) of the other families as they are. ``python -m benchmarks.diagbench
--families loop`` runs it alone.

Each case runs with ``SEEDS`` seeds. A fault starting mid-run starts at ``t0`` = 24–36 of 60 steps, drawn
from a checksum of (case, seed). A faulty run counts when it shows its defining symptom (measured by the
loop itself); a fixed twin or an intentional pattern counts when its loss is finite and falls (the GAN's
discriminator loss: finite) and the symptom is absent. Runs that do not are dropped and counted.

Scores, on ``comgra_ndbg.analyze`` at its defaults:

- *detected*: some hypothesis of the fault's type with ``|onset − first effect| ≤ 2``;
- *type* / *cause*: the top hypothesis has the fault's type / its type and origin (for origin ``node``,
  a node under one of the case's module paths);
- *false alarm*: a fixed twin or an intentional pattern with any hypothesis (``loop alarm``: one of family
  ``loop_invariant``), with a Wilson 95 % interval.

``healthy_bench_alarms`` also trains the healthy controls of every architecture family (``healthy.py``,
``seeds`` seeds each, the held-back family included) and counts those with a loop-invariant hypothesis.
"""
from __future__ import annotations

import json
import math
import shutil
import warnings
import zlib
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import torch

from benchmarks.diagbench.families_loop import FAULT, LoopCase, LoopRun, loop_cases
from benchmarks.diagbench.metrics import node_matches, wilson
from benchmarks.diagbench.checks import healthy_check
from benchmarks.diagbench.healthy import healthy_configs
from benchmarks.diagbench.specs import HEALTHY_SEED_BASE, RunSpec, healthy_spec
from benchmarks.diagbench.training import TRUTH_FILE, train_run
from comgra_ndbg import NeuralDbg, analyze, open_recording

SEEDS = 3
ONSET_SLACK = 2
LOOP_FAMILY = "loop_invariant"


@dataclass(frozen=True)
class LoopSpec:
    """One run of a case (picklable for the worker processes)."""

    case: str
    seed: int
    t0: int

    @property
    def name(self) -> str:
        return f"loop-{self.case}-s{self.seed}"


def loop_specs(*, seeds: int = SEEDS, seed_offset: int = 0, only: str | None = None) -> list[LoopSpec]:
    """Every case × ``seeds`` seeds (cases whose name contains ``only``, if given)."""
    specs = []
    for case in loop_cases():
        for seed in range(seed_offset, seed_offset + seeds):
            draw = zlib.crc32(f"{case.name.removesuffix('_fixed')}/{seed}".encode())
            t0 = 24 + draw % 13 if case.mid_run else 0
            specs.append(LoopSpec(case.name, seed, t0))
    return [s for s in specs if only is None or only in s.case]


def _case(name: str) -> LoopCase:
    return next(c for c in loop_cases() if c.name == name)


def valid(case: LoopCase, run: LoopRun) -> tuple[bool, str]:
    """Whether a run shows what it is meant to: the symptom (a fault), or healthy training (the others)."""
    if case.kind == FAULT:
        return run.symptom and run.effect >= 0, f"symptom {run.symptom} at step {run.effect}. {run.note}".strip()
    loss = np.array(run.losses, dtype=float)
    finite = bool(np.isfinite(loss).all())
    first, last = float(np.median(loss[:10])), float(np.median(loss[-10:]))
    falls = last < 0.9 * first or case.name == "gan"
    return finite and falls and not run.symptom, (f"loss finite {finite}, {first:.3g} → {last:.3g}, "
                                                  f"symptom {run.symptom}")


def evaluate_loop_run(spec: LoopSpec, folder: Path) -> dict:
    """Train and record one run, validate it and analyse it; the record of the run."""
    torch.set_num_threads(1)
    case = _case(spec.case)
    path = folder / spec.name
    shutil.rmtree(path, ignore_errors=True)
    run = LoopRun(seed=spec.seed, t0=spec.t0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        case.run(lambda model, **options: NeuralDbg(model, folder, trial=spec.name, **options), run,
                 case.name.endswith("_fixed"))
        diagnosis = analyze(path, store=False)
    ok, note = valid(case, run)
    hypotheses = [{"type": h.type, "origin": h.origin, "node": h.node, "onset": h.onset,
                   "confidence": h.confidence, "features": list(h.features), "family": h.chain.root.family}
                  for h in diagnosis.hypotheses]
    return {"name": spec.name, "case": case.name, "kind": case.kind, "invariant": case.invariant,
            "seed": spec.seed, "t0": spec.t0, "effect": run.effect, "valid": bool(ok), "validation": note,
            "truth": {"type": case.type, "origin": case.origin, "nodes": list(case.nodes)},
            "hypotheses": hypotheses, "notes": list(diagnosis.notes)}


def _right(hypothesis: dict, truth: dict) -> bool:
    if hypothesis["type"] != truth["type"]:
        return False
    if truth["origin"] == "node":
        return hypothesis["origin"] == "node" and node_matches(hypothesis["node"] or "", truth["nodes"])
    return hypothesis["origin"] == truth["origin"]


def judge(record: dict) -> dict[str, bool]:
    """The scores of one valid run (see the module docstring)."""
    found = record["hypotheses"]
    if record["kind"] != FAULT:
        return {"alarm": bool(found), "loop_alarm": any(h["family"] == LOOP_FAMILY for h in found)}
    truth, effect = record["truth"], record["effect"]
    top = found[0] if found else None
    return {"detected": any(h["type"] == truth["type"] and abs(h["onset"] - effect) <= ONSET_SLACK for h in found),
            "type": top is not None and top["type"] == truth["type"],
            "cause": top is not None and _right(top, truth),
            "named": any(_right(h, truth) for h in found)}


def score_loop(records: list[dict]) -> dict:
    """Per-case counts and the pooled rates (with Wilson intervals) over the valid runs."""
    per_case: dict[str, dict] = {}
    for record in records:
        row = per_case.setdefault(record["case"], {"kind": record["kind"], "runs": 0, "valid": 0})
        row["runs"] += 1
        if not record["valid"]:
            continue
        row["valid"] += 1
        for key, value in judge(record).items():
            row[key] = row.get(key, 0) + int(value)
    pooled = {}
    for key, kinds in (("detected", (FAULT,)), ("type", (FAULT,)), ("cause", (FAULT,)), ("named", (FAULT,)),
                       ("alarm", ("fixed", "intentional")), ("loop_alarm", ("fixed", "intentional"))):
        for group, chosen in (("all", kinds), *(((k, (k,)) for k in kinds) if len(kinds) > 1 else ())):
            rows = [r for r in per_case.values() if r["kind"] in chosen]
            hits, n = sum(r.get(key, 0) for r in rows), sum(r["valid"] for r in rows)
            pooled[f"{key}/{group}"] = {"hits": hits, "n": n, "wilson": wilson(hits, n)}
    return {"cases": per_case, "pooled": pooled}


def run_loop(folder: Path, *, jobs: int = 2, seeds: int = SEEDS, seed_offset: int = 0,
             only: str | None = None) -> dict:
    """Every run of the loop family, in ``jobs`` worker processes; the records and the scores."""
    specs = loop_specs(seeds=seeds, seed_offset=seed_offset, only=only)
    with get_context("fork").Pool(jobs) as pool:
        records = pool.starmap(evaluate_loop_run, [(s, folder) for s in specs], chunksize=1)
    return {"runs": records, **score_loop(records)}


def _healthy_record(spec: RunSpec, folder: Path) -> dict:
    torch.set_num_threads(1)
    path = train_run(spec, folder)
    truth = json.loads((path / TRUTH_FILE).read_text())
    with open_recording(path) as rec:
        ok, note = healthy_check(truth, rec)
    diagnosis = analyze(path, store=False)
    loop = [h for h in diagnosis.hypotheses if h.chain.root.family == LOOP_FAMILY]
    return {"name": spec.name, "family": spec.family, "valid": bool(ok), "validation": note,
            "loop_alarms": [f"{h.type} ({h.origin}) at step {h.onset}" for h in loop],
            "alarm": bool(diagnosis.hypotheses), "notes": list(diagnosis.notes)}


def healthy_bench_alarms(folder: Path, *, jobs: int = 2, seeds: int = 2, seed_offset: int = 0) -> dict:
    """The healthy controls of the architecture families, ``seeds`` seeds each: how many valid ones carry a
    loop-invariant hypothesis (and, for comparison, any hypothesis)."""
    specs = [healthy_spec(c, HEALTHY_SEED_BASE + seed_offset + s) for c in healthy_configs() for s in range(seeds)]
    with get_context("fork").Pool(jobs) as pool:
        records = pool.starmap(_healthy_record, [(s, folder) for s in specs], chunksize=1)
    chosen = [r for r in records if r["valid"]]
    loop_hits, any_hits = sum(bool(r["loop_alarms"]) for r in chosen), sum(r["alarm"] for r in chosen)
    n = len(chosen)
    return {"runs": records, "loop_alarm": {"hits": loop_hits, "n": n, "wilson": wilson(loop_hits, n)},
            "alarm": {"hits": any_hits, "n": n, "wilson": wilson(any_hits, n)}}


def _rate(entry: dict) -> str:
    low, high = entry["wilson"]
    interval = "" if math.isnan(low) else f" [{low:.2f}, {high:.2f}]"
    return f"{entry['hits']}/{entry['n']}{interval}"


def report_loop(result: dict) -> str:
    """The table of cases and the pooled figures, as text."""
    lines = ["loop family (scored on its own, outside the leave-one-family-out figures)",
             f"{'case':<24}{'kind':<13}{'valid':>7}  detected±2  top type  top cause  named  alarms  loop alarms"]
    for name, row in result["cases"].items():
        valid_runs = f"{row['valid']}/{row['runs']}"
        if row["kind"] == FAULT:
            cells = f"{row.get('detected', 0):>10}  {row.get('type', 0):>8}  {row.get('cause', 0):>9}  " \
                    f"{row.get('named', 0):>5}"
        else:
            cells = f"{'':>10}  {'':>8}  {'':>9}  {'':>5}  {row.get('alarm', 0):>6}  {row.get('loop_alarm', 0):>11}"
        lines.append(f"{name:<24}{row['kind']:<13}{valid_runs:>7}  {cells}")
    lines.append("")
    lines += [f"{key:<26}{_rate(entry)}" for key, entry in result["pooled"].items()]
    dropped = [r["name"] + ": " + r["validation"] for r in result["runs"] if not r["valid"]]
    if dropped:
        lines += ["", f"dropped ({len(dropped)}):"] + [f"  {d}" for d in dropped]
    bench = result.get("healthy_bench")
    if bench:
        lines += ["", f"healthy controls of the architecture families ({len(bench['runs'])} runs, "
                      f"{bench['loop_alarm']['n']} valid): with a loop-invariant hypothesis "
                      f"{_rate(bench['loop_alarm'])}, with any hypothesis {_rate(bench['alarm'])}"]
        lines += [f"  {r['name']}: {', '.join(r['loop_alarms'])}" for r in bench["runs"] if r["loop_alarms"]]
        notes = sorted({n.split(':')[0][:90] for r in bench["runs"] for n in r["notes"]})
        lines += [f"  note seen: {n}" for n in notes]
    return "\n".join(lines)


def write_loop(result: dict, path: Path) -> None:
    path.write_text(json.dumps(result, indent=1, default=float))


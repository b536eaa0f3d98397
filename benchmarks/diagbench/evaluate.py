"""One run, end to end, in a worker process: train and record it (or reuse its recording), validate its
symptom, analyse it once per grid entry, run the baselines, and store the results beside the recording
(``analysis.json`` of the default entry, as ``comgra_ndbg.analyze`` writes it, and ``diagbench.json``,
this record). The record is a plain dict that the scoring modules aggregate."""
from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import torch

from benchmarks.diagbench.baselines import b0_loss_only, b1_fixed_rules
from benchmarks.diagbench.checks import secondary_effects, validate
from benchmarks.diagbench.grid import GRID
from benchmarks.diagbench.specs import RunSpec
from benchmarks.diagbench.training import TRUTH_FILE, train_run
from comgra_ndbg import open_recording
from comgra_ndbg.analysis import Diagnosis, diagnose, to_dict
from comgra_ndbg.analysis.loading import load_series
from comgra_ndbg.store.results import write_results

RECORD_FILE = "diagbench.json"
MEASUREMENTS = ("loss", "spread")


def _hypotheses(diagnosis: Diagnosis) -> list[dict]:
    return [{"type": h.type, "origin": h.origin, "node": h.node, "onset": h.onset, "confidence": h.confidence,
             "features": list(h.features), "sentence": h.sentence,
             "chain": sorted({link.effect.label for link in h.chain.links})} for h in diagnosis.hypotheses]


def analyse(rec) -> dict[str, dict]:
    """Every grid entry's hypotheses for one recording (its series loaded once), with the seconds each took
    (loading included); the default entry's diagnosis is stored beside the recording."""
    started = time.perf_counter()
    series = load_series(rec)
    loading = time.perf_counter() - started
    out = {}
    for name, thresholds in GRID.items():
        started = time.perf_counter()
        diagnosis = diagnose(series, thresholds)
        out[name] = {"hypotheses": _hypotheses(diagnosis), "events": len(diagnosis.events),
                     "seconds": loading + time.perf_counter() - started}
        if name == "default":
            write_results(rec.location, to_dict(diagnosis), num_steps=diagnosis.num_steps,
                          last_step=diagnosis.last_step)
    return out


def evaluate_run(spec: RunSpec, folder: Path, reuse: bool = False, analysis: bool = True) -> dict:
    torch.set_num_threads(1)
    path = folder / spec.name
    if not (reuse and (path / TRUTH_FILE).exists()):
        shutil.rmtree(path, ignore_errors=True)
        train_run(spec, folder)
    truth = json.loads((path / TRUTH_FILE).read_text())
    with open_recording(path) as rec:
        valid, note = validate(truth, rec)
        effects = {} if spec.healthy else secondary_effects(truth, rec)
        results = analyse(rec) if analysis else {}
        b0, b1 = b0_loss_only(rec), b1_fixed_rules(rec)
        recorded_steps = len(rec.steps)
    record = {"name": spec.name, "family": spec.family, "seed": spec.seed, "healthy": spec.healthy,
              "truth": {k: v for k, v in truth.items() if k not in MEASUREMENTS}, "valid": bool(valid),
              "validation": note, "effects": effects, "recorded_steps": recorded_steps,
              "train_seconds": truth.get("train_seconds"), "analysis": results,
              "B0": asdict(b0) if b0 else None, "B1": asdict(b1) if b1 else None}
    (path / RECORD_FILE).write_text(json.dumps(record, indent=1, default=float))
    return record

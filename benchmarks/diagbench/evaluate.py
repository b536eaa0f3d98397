"""One run, end to end: train and record it (or reuse its recording), validate its symptom, analyse it,
run the baselines; the result is a plain dict that the metrics module aggregates."""
from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import torch

from benchmarks.diagbench.baselines import b0_loss_only, b1_fixed_rules
from benchmarks.diagbench.checks import secondary_effects, validate
from benchmarks.diagbench.runs import TRUTH_FILE, RunSpec, train_run, truth
from comgra_ndbg import open_recording
from comgra_ndbg.analysis import analyze
from comgra_ndbg.recorder import kernels


def evaluate_run(spec: RunSpec, folder: Path, reuse: bool = False) -> dict:
    torch.set_num_threads(1)
    path = folder / spec.name
    train_seconds = None
    if not (reuse and (path / TRUTH_FILE).exists()):
        shutil.rmtree(path, ignore_errors=True)
        started = time.perf_counter()
        train_run(spec, folder)
        train_seconds = time.perf_counter() - started
    ground = truth(spec)
    (path / TRUTH_FILE).write_text(json.dumps(ground, indent=1))
    with open_recording(path) as rec:
        valid, note, effects = True, "", {}
        if not spec.healthy:
            valid, note = validate(spec, rec)
            effects = secondary_effects(spec, rec, ground["chain"])
        started = time.perf_counter()
        diagnosis = analyze(rec, store=True)
        seconds = time.perf_counter() - started
        b0, b1 = b0_loss_only(rec), b1_fixed_rules(rec)
    top = diagnosis.top
    return {
        "name": spec.name, "seed": spec.seed, "healthy": spec.healthy, "truth": ground, "valid": bool(valid),
        "validation": note, "effects": effects, "analysis_seconds": seconds, "train_seconds": train_seconds,
        "hypotheses": [{"type": h.type, "origin": h.origin, "node": h.node, "onset": h.onset,
                        "confidence": h.confidence, "features": list(h.features), "sentence": h.sentence}
                       for h in diagnosis.hypotheses],
        "chain": sorted({link.effect.label for link in top.chain.links}) if top else [],
        "num_events": len(diagnosis.events),
        "B0": asdict(b0) if b0 else None, "B1": asdict(b1) if b1 else None,
    }


def recording_overhead(folder: Path) -> float:
    """Wall time of one 400-step run with the recorder on, divided by the same run with it disabled (the
    summary kernels compiled beforehand: a one-time cost per process, not a recording cost)."""
    torch.set_num_threads(1)
    kernels.warm_up()
    from benchmarks.diagbench.runs import HEALTHY_CONFIGS, healthy_spec

    spec = healthy_spec(HEALTHY_CONFIGS[0], 0)
    timings = []
    for enabled in (False, True):
        target = folder / f"overhead-{'on' if enabled else 'off'}"
        shutil.rmtree(target, ignore_errors=True)
        started = time.perf_counter()
        train_run(spec, target, enabled=enabled)
        timings.append(time.perf_counter() - started)
        shutil.rmtree(target, ignore_errors=True)
    return timings[1] / timings[0]

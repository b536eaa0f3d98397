"""diagbench v2 smoke subset, trained, recorded, validated, analysed and scored leave-one-family-out as CI
does: three faults and two healthy configurations per family, one seed, the held-back family left out.

``FLOORS`` and ``CEILINGS`` bound the pooled scores of the analysis. They are set from the full run
(pooled TPR 0.986, type 0.986, origin 0.982, onset 1.000, FPR 0.006, ECE 0.082; see docs/diagnosis.md) less
the margin of one smoke run — on 18 faulty runs one miss is 0.056, on 11 healthy runs one false alarm 0.09
— so that a regression of the engine fails here and the noise of one seed does not. This subset scored
1.000 on every rate, FPR 0 and ECE 0.092 when they were set.
"""
from __future__ import annotations

import math
from pathlib import Path

from benchmarks.diagbench.__main__ import run
from benchmarks.diagbench.evaluate import RECORD_FILE
from benchmarks.diagbench.families import HELD_BACK, families
from benchmarks.diagbench.report import TITLES, report
from benchmarks.diagbench.specs import SMOKE
from benchmarks.diagbench.training import TRUTH_FILE

FLOORS = {"tpr": 0.94, "type_accuracy": 0.88, "origin_top1": 0.88, "origin_top3": 0.94, "onset_within_2": 0.94,
          "validation_rate": 0.9}
CEILINGS = {"fpr": 0.1, "early_alarms": 1, "ece": 0.25, "seconds_mean": 1.0}


def _value(scores: dict, name: str, missing: float) -> float:
    value = float(scores[name])
    return missing if math.isnan(value) else value


def test_smoke_subset_runs_validates_stores_and_scores(tmp_path: Path) -> None:
    result = run(smoke=True, jobs=2, folder=tmp_path)
    text = report(result)
    chosen = [f for f in families() if f not in HELD_BACK]
    runs = result["runs"]

    assert result["families"] == chosen, text
    faulty = sum(len(SMOKE[f][0]) for f in chosen)
    healthy = sum(len(SMOKE[f][1]) for f in chosen)
    assert (sum(not r["healthy"] for r in runs), sum(r["healthy"] for r in runs)) == (faulty, healthy), text
    assert {r["family"] for r in runs} == set(chosen)

    for r in runs:
        assert r["validation"], f"{r['name']} was not checked"
        if not r["valid"]:
            assert f"dropped {r['name']}: " in text, f"{r['name']} failed validation but is not listed"
        folder = tmp_path / r["name"]
        for stored in (TRUTH_FILE, RECORD_FILE, "analysis.json"):
            assert (folder / stored).is_file(), f"{stored} missing beside {r['name']}"

    for title in TITLES:
        assert f"== {title}" in text, f"report section {title!r} missing\n{text}"
    for family in chosen:
        assert family in text.split("== per-family")[1].splitlines()[1], f"no column for {family}"
    for family in HELD_BACK:
        assert family not in result["scores"]["analysis"] and f"{family}-" not in text and family not in text.split()

    pooled = result["scores"]["analysis"]["pooled"]
    for name, floor in FLOORS.items():
        assert _value(pooled, name, 0.0) >= floor, f"{name} = {pooled[name]} < {floor}\n{text}"
    for name, ceiling in CEILINGS.items():
        assert _value(pooled, name, 0.0) <= ceiling, f"{name} = {pooled[name]} > {ceiling}\n{text}"

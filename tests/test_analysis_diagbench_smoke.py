"""diagbench v2 smoke subset, trained, recorded, validated, analysed and scored leave-one-family-out as CI
does: three faults and two healthy configurations per family, one seed, the held-back family left out.

``FLOORS`` and ``CEILINGS`` bound the pooled scores of the analysis. They start at the weakest possible
values; raise them from the figures of the full run (``python -m benchmarks.diagbench``, see
docs/diagnosis.md) less a margin of one smoke run, so that a regression of the engine fails here.
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

FLOORS = {"tpr": 0.0, "type_accuracy": 0.0, "origin_top1": 0.0, "origin_top3": 0.0, "onset_within_2": 0.0,
          "validation_rate": 0.0}
CEILINGS = {"fpr": 1.0, "early_alarms": 18, "ece": 1.0, "seconds_mean": 10.0}


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

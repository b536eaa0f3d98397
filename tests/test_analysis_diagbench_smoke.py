"""diagbench smoke subset (13 faulty runs, one per fault, and 9 healthy runs, one per configuration),
trained, recorded, analysed and scored as CI does. The minimums come from the full run (docs/diagnosis.md:
every score 1.000 over 64 valid faulty and 90 healthy runs) less one miss out of the 13 faulty runs;
false alarms are not tolerated at all."""
from __future__ import annotations

from pathlib import Path

from benchmarks.diagbench.__main__ import report, run

MINIMUMS = {"tpr": 12 / 13, "type_accuracy": 12 / 13, "origin_top1": 12 / 13, "onset_within_2": 12 / 13,
            "validation_rate": 12 / 13, "chain_recall": 0.5}
MAXIMUMS = {"fpr": 0.0, "early_alarms": 0, "ece": 0.15, "analysis_seconds_mean": 1.0}


def test_smoke_subset_meets_the_minimum_scores(tmp_path: Path) -> None:
    result = run(smoke=True, jobs=2, folder=tmp_path, reuse=False, only=None, overhead=False)
    ours, b1 = result["scores"]["analysis"], result["scores"]["B1"]
    text = report(result)
    assert (ours["faulty_runs"], ours["healthy_runs"]) == (13, 9), text
    for name, minimum in MINIMUMS.items():
        assert ours[name] >= minimum, f"{name} = {ours[name]:.3f} < {minimum:.3f}\n{text}"
    for name, maximum in MAXIMUMS.items():
        assert ours[name] <= maximum, f"{name} = {ours[name]:.3f} > {maximum:.3f}\n{text}"
    assert ours["tpr"] > b1["tpr"] and ours["fpr"] < b1["fpr"] or ours["fpr"] == b1["fpr"] == 0.0, text
    stored = list(tmp_path.glob("*/analysis.json"))
    assert len(stored) == 22, "every analysed run stores its results beside the recording"

"""``comgra-ndbg explain --only``, the threshold overrides and the ``--json`` schema, on a real demo recording
(a trial whose output layer goes dead at step 16, and a fixed trial), plus the per-side gradient thresholds
the overrides map onto."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cli_support import demo_group, run_cli as run
from comgra_ndbg import cli
from comgra_ndbg.analysis import Thresholds, analyze
from comgra_ndbg.analysis.events import FAMILIES, CausalChain, Event, Hypothesis
from comgra_ndbg.analysis.gradient_health import gradient_events
from comgra_ndbg.analysis.series import build_series
from comgra_ndbg.analysis.sentences import TYPE_TEXT
from comgra_ndbg.analysis.synthetic import summary_rows
from comgra_ndbg.errors import InvalidArgumentError
from comgra_ndbg.explain import (EVENT_FAMILIES, EXPLAIN_FAMILIES, HYPOTHESIS_TYPES, hypothesis_families, only,
                                 overrides)
from comgra_ndbg.store.results import results_path

STEPS = 40
HYPOTHESIS_KEYS = ["rank", "type", "origin", "node", "onset", "confidence", "sentence", "remedy", "alternatives",
                   "family"]
EVENT_KEYS = ["family", "node", "kind", "from_state", "to_state", "onset", "end", "magnitude", "strength", "at_start"]


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_group(tmp_path_factory, "explain", STEPS)



def test_every_event_family_and_hypothesis_type_belongs_to_exactly_one_explain_family() -> None:
    assert tuple(EVENT_FAMILIES) == tuple(HYPOTHESIS_TYPES) == EXPLAIN_FAMILIES
    assert sorted(f for members in EVENT_FAMILIES.values() for f in members) == sorted(FAMILIES)
    assert sorted(t for members in HYPOTHESIS_TYPES.values() for t in members) == sorted(set(TYPE_TEXT) - {"unclear"})


def test_an_unclear_hypothesis_belongs_to_the_families_of_its_alternatives() -> None:
    root = Event("gradient_health", "h", "grad", "healthy", "vanishing", 5, 9, 2.0, 1.0)
    unclear = Hypothesis("unclear", "node", "h", 5, 0.4, "A or B.", CausalChain(root),
                         alternatives=("dead_units", "vanishing"))
    assert hypothesis_families(unclear) == ("dead", "gradients")
    bare = Hypothesis("unclear", "node", "h", 5, 0.4, "?", CausalChain(root))
    assert hypothesis_families(bare) == ("gradients",)  # no alternatives: its root event's family


def test_only_filters_hypotheses_and_events_by_family(group: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["explain", str(group), "--trial", "buggy", "--only", "dead"], capsys)
    top = analyze(group, trial="buggy", store=False).top
    assert code == 0 and f"  1. [dead_units, origin node, node 'output', step {top.onset}," in out
    assert f"steps {top.onset}-{STEPS - 1}: activation_regime normal -> dead in 'output' (value)" in out
    code, out, _ = run(["explain", str(group), "--trial", "buggy", "--only", "gradients"], capsys)
    assert code == 0 and out.splitlines() == [f"trial buggy: {STEPS} recorded steps (stored analysis)",
                                              "  no gradients failure found (--only gradients)"]
    code, out, _ = run(["explain", str(group), "--trial", "buggy", "--only", "optimizer", "--json"], capsys)
    record = json.loads(out)["trials"][0]
    assert record["hypotheses"] == record["events"] == record["diagnosis"]["hypotheses"] == []
    assert record["healthy"] is True
    with pytest.raises(SystemExit):  # argparse refuses a family it does not know, listing the choices
        cli.main(["explain", str(group), "--only", "weights"])
    err = capsys.readouterr().err
    assert "argument --only: invalid choice: 'weights'" in err and all(f in err for f in EXPLAIN_FAMILIES)
    with pytest.raises(InvalidArgumentError, match="unknown family 'weights'; choose one of gradients, dead"):
        only(analyze(group, trial="buggy", store=False), "weights")


def test_overrides_analyse_again_and_never_overwrite_the_stored_analysis(group: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    stored = results_path(group / "buggy").read_bytes()
    code, out, _ = run(["explain", str(group), "--trial", "buggy", "--activation-threshold", "0.3"], capsys)
    lines = out.splitlines()
    assert code == 0
    assert lines[0] == ("thresholds overridden: dead_enter=0.3, dead_exit=0.2333, saturated_enter=0.3, "
                        "saturated_exit=0.18 (analysed again with them; the stored analysis is unchanged)")
    assert lines[1] == f"trial buggy: {STEPS} recorded steps (re-analysed with overrides (not stored))"
    # 25-62% of the outputs are 0 over the first steps: at 0.3 that is a fault present from the start
    assert lines[3].startswith("  1. [dead_units, origin architecture, node 'output', step 0,")
    assert results_path(group / "buggy").read_bytes() == stored
    code, out, _ = run(["explain", str(group), "--trial", "buggy", "--json", "--activation-threshold", "0.3"], capsys)
    payload = json.loads(out)
    assert payload["overrides"] == {"dead_enter": 0.3, "dead_exit": 0.2333, "saturated_enter": 0.3,
                                    "saturated_exit": 0.18}
    record = payload["trials"][0]
    assert record["source"] == "re-analysed with overrides (not stored)" and record["analysed_now"] is True
    assert record["diagnosis"]["thresholds"]["dead_enter"] == 0.3
    assert (record["hypotheses"][0]["origin"], record["hypotheses"][0]["onset"]) == ("architecture", 0)
    assert results_path(group / "buggy").read_bytes() == stored
    code, out, _ = run(["explain", str(group), "--trial", "buggy"], capsys)
    assert "(stored analysis)" in out and "origin node, node 'output', step 16," in out


@pytest.mark.parametrize("argv, message", [
    (["--vanishing-threshold", "0"], "vanishing threshold must be a positive number of decades (1 = 10×), got 0.0"),
    (["--exploding-threshold", "-1"], "exploding threshold must be a positive number of decades"),
    (["--activation-threshold", "1.5"], "activation threshold must be a share of units in (0, 1], got 1.5"),
])
def test_bad_overrides_are_one_line_and_exit_status_2(group: Path, argv: list[str], message: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["explain", str(group), *argv], capsys)
    assert (code, out) == (2, "") and err.startswith(f"comgra-ndbg explain: {message}") and err.count("\n") == 1


def test_the_json_schema_has_its_documented_fields(group: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["explain", str(group), "--json"], capsys)
    payload = json.loads(out)
    assert code == 0
    assert list(payload) == ["schema", "schema_version", "path", "only", "overrides", "trials"]
    assert (payload["schema"], payload["schema_version"], payload["only"], payload["overrides"]) == (
        "comgra-ndbg-explain", 1, None, {})
    buggy, fixed = payload["trials"]
    assert list(buggy) == ["trial", "source", "analysed_now", "num_steps", "last_step", "healthy", "hypotheses",
                           "events", "diagnosis"]
    assert (buggy["source"], buggy["num_steps"], buggy["last_step"], buggy["healthy"]) == ("stored", STEPS,
                                                                                          STEPS - 1, False)
    assert [list(h) for h in buggy["hypotheses"]] == [HYPOTHESIS_KEYS]
    assert buggy["hypotheses"][0]["family"] == "dead" and buggy["hypotheses"][0]["rank"] == 1
    assert [list(e) for e in buggy["events"]] == [EVENT_KEYS]
    assert fixed["healthy"] is True and fixed["hypotheses"] == []


def test_the_gradient_overrides_move_only_their_own_side() -> None:
    decay = np.logspace(0, -3, 100)
    falling, rising = decay * 0.1, decay * 0.1
    falling[60:] *= 1e-3
    rising[60:] *= 1e3

    def events(hidden: np.ndarray, thresholds: Thresholds) -> list[tuple[str, int]]:
        series = build_series({("h", "grad"): summary_rows(rms=hidden), ("out", "grad"): summary_rows(rms=decay)},
                              roles={"h": "intermediate", "out": "output"}, kpis={})
        return [(e.to_state, e.onset) for e in gradient_events(series, thresholds)]

    assert events(falling, Thresholds()) == [("vanishing", 60)]
    assert events(rising, Thresholds()) == [("exploding", 60)]
    assert events(falling, Thresholds(vanishing_decades=4.0)) == []  # a 3-decade fall is under 4
    assert events(falling, Thresholds(exploding_decades=4.0)) == [("vanishing", 60)]
    assert events(rising, Thresholds(exploding_decades=4.0)) == []
    assert events(rising, Thresholds(vanishing_decades=4.0)) == [("exploding", 60)]
    assert overrides(vanishing=4.0, exploding=2.5) == {"vanishing_decades": 4.0, "exploding_decades": 2.5}


def test_the_evidence_names_the_threshold_the_gradient_rule_used() -> None:
    from comgra_ndbg.analysis.events import Evidence
    from comgra_ndbg.gui.evidence import threshold_for

    vanishing = Event("gradient_health", "h", "grad", "healthy", "vanishing", 60, 99, 3.0, 1.0)
    ratio = Evidence("h/grad/rms÷out/grad/rms", (60, 61), (1e-4, 1e-4), 0.1)
    assert threshold_for(vanishing, ratio, Thresholds().as_dict()) == (pytest.approx(0.01), "enter_decades")
    overridden = Thresholds(vanishing_decades=2.0).as_dict()
    assert threshold_for(vanishing, ratio, overridden) == (pytest.approx(0.001), "vanishing_decades")
    grew = Event("activation_regime", "h", "value", "normal", "exploding", 60, 70, 1.4, 0.9)  # not the gradient rule
    rms = Evidence("h/value/rms", (60, 61), (30.0, 40.0), 2.0)
    assert threshold_for(grew, rms, Thresholds(exploding_decades=3.0).as_dict()) == (20.0, "enter_decades")

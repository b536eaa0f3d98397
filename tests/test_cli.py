"""``comgra-ndbg explain``, ``info``, ``export``, ``--help`` and errors, on a real demo recording.

The group comes from the demo job itself (a buggy and a fixed trial, 40 steps each), so what the commands
print is checked against what the analysis and the reader say about the same files.
"""
from __future__ import annotations

import csv
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from cli_support import demo_group, run_cli as run
from comgra_ndbg import Recorder, cli, open_recording
from comgra_ndbg.analysis import analyze, diagnosis_from_dict, to_dict
from comgra_ndbg.export import SUMMARY_COLUMNS
from comgra_ndbg.stats.statistics import STATISTICS
from comgra_ndbg.store.results import results_path, write_results

STEPS = 40
SUBCOMMAND_NAMES = ("demo", "gui", "info", "explain", "export")


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_group(tmp_path_factory, "cli", STEPS)



def read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def test_explain_prints_the_ranked_hypothesis_and_events_of_each_trial(group: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["explain", str(group)], capsys)
    assert code == 0
    buggy, fixed = out.split("trial fixed:")
    top = analyze(group, trial="buggy", store=False).top
    assert buggy.startswith(f"trial buggy: {STEPS} recorded steps (stored analysis)")
    assert (f"  1. [dead_units, origin node, node 'output', step {top.onset}, confidence {top.confidence:.2f}]"
            in buggy)
    assert f"     {top.sentence}\n     Remedy: {top.remedy}\n" in buggy and top.remedy
    assert f"steps {top.onset}-{STEPS - 1}: activation_regime normal -> dead in 'output' (value)" in buggy
    assert fixed.splitlines()[:2] == [f" {STEPS} recorded steps (stored analysis)", "  no failure found"]


def test_explain_runs_the_analysis_when_none_is_stored_or_it_is_stale(group: Path, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    copy = tmp_path / "group"
    shutil.copytree(group, copy)
    results_path(copy / "fixed").unlink()
    stale = analyze(copy, trial="buggy", store=False)
    write_results(copy / "buggy", to_dict(stale), num_steps=STEPS - 5, last_step=STEPS - 6)
    code, out, _ = run(["explain", str(copy)], capsys)
    assert code == 0
    assert f"trial buggy: {STEPS} recorded steps (analysed now)" in out
    assert f"trial fixed: {STEPS} recorded steps (analysed now)" in out
    for trial in ("buggy", "fixed"):
        with open_recording(copy, trial) as recording:
            stored = recording.analysis()
            assert stored is not None and not stored.stale and stored.num_steps == STEPS
    code, out, _ = run(["explain", str(copy), "--trial", "fixed"], capsys)
    assert out.splitlines() == [f"trial fixed: {STEPS} recorded steps (stored analysis)", "  no failure found"]


def test_explain_json_parses_and_round_trips_the_diagnosis(group: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["explain", str(group), "--json"], capsys)
    assert code == 0
    payload = json.loads(out)
    assert payload["path"] == str(group) and [t["trial"] for t in payload["trials"]] == ["buggy", "fixed"]
    buggy = diagnosis_from_dict(payload["trials"][0]["diagnosis"])
    fresh = analyze(group, trial="buggy", store=False)
    assert buggy.hypotheses == fresh.hypotheses and buggy.events == fresh.events
    assert (buggy.top.type, buggy.top.node) == ("dead_units", "output")
    assert payload["trials"][1]["diagnosis"]["hypotheses"] == []
    assert payload["trials"][0]["analysed_now"] is False


def test_explain_limits_the_listed_events(group: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["explain", str(group), "--trial", "buggy", "--max-events", "0"], capsys)
    assert code == 0 and "... 1 more (--max-events, or --json for all)" in out


def test_info_shows_trials_steps_nodes_and_size_on_disk(group: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["info", str(group)], capsys)
    lines = out.splitlines()
    assert code == 0
    assert lines[0] == f"trial buggy: {STEPS} recorded steps 0–{STEPS - 1}, complete"
    assert "  9 nodes, 12 tensors, kinds value, grad, update" in lines
    assert lines[5] == f"trial fixed: {STEPS} recorded steps 0–{STEPS - 1}, complete"
    sizes = {t: sum(p.stat().st_size for p in (group / t).rglob("*") if p.is_file()) for t in ("buggy", "fixed")}
    assert lines[-1].startswith(f"on disk: {cli._human_size(sum(sizes.values()))} in 2 trials (buggy ")
    assert [cli._human_size(n) for n in (0, 1023, 1536, 5 * 2**20, 3 * 2**30)] == [
        "0 B", "1023 B", "1.5 KiB", "5.0 MiB", "3.0 GiB"]


def test_info_and_explain_count_in_words_for_empty_and_one_step_trials(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    Recorder(tmp_path, "empty").close()  # a trial that recorded nothing
    with Recorder(tmp_path, "one") as rec:
        with rec.step(4):
            rec.register_tensor("x", torch.ones(2))
    code, out, _ = run(["info", str(tmp_path)], capsys)
    assert code == 0
    assert out.splitlines()[:5] == ["trial empty: no recorded step yet, complete", "  0 nodes, 0 tensors",
                                    "trial one: 1 recorded step (4), complete", "  step type default: 1 step",
                                    "  1 node, 1 tensor, kinds value"]
    code, out, _ = run(["explain", str(tmp_path), "--trial", "one"], capsys)
    assert out.splitlines()[0] == "trial one: 1 recorded step (analysed now)"


def test_export_csv_is_a_tidy_table_matching_the_reader(group: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["export", str(group), "--to", "csv", "--out", str(tmp_path / "x")], capsys)
    assert code == 0
    assert out.splitlines() == [str(tmp_path / "x" / f"{n}.csv") for n in ("summaries", "events", "hypotheses")]
    header, rows = read_csv(tmp_path / "x" / "summaries.csv")
    assert header == list(SUMMARY_COLUMNS)
    assert {r["trial"] for r in rows} == {"buggy", "fixed"} and {r["statistic"] for r in rows} == set(STATISTICS)
    with open_recording(group, "buggy") as recording:
        for tensor, kind, stat in [("output", "value", "dead_fraction"), ("model.head.weight", "update", "rms"),
                                   ("hidden.0", "grad", "mean"), ("loss", "value", "max")]:
            steps, values = recording.summary(tensor, kind, stat)
            chosen = [r for r in rows if (r["trial"], r["tensor"], r["kind"], r["statistic"])
                      == ("buggy", tensor, kind, stat)]
            assert [int(r["step"]) for r in chosen] == steps.tolist()
            np.testing.assert_allclose([float(r["value"]) for r in chosen], values, rtol=1e-12)
            info = next(t for t in recording.tensors if t.name == tensor)
            assert {(r["node"], r["role"]) for r in chosen} == {(info.node, info.role)}
        series = len(recording.catalog.series)
    assert sum(r["trial"] == "buggy" for r in rows) == series * len(STATISTICS) * STEPS
    header, events = read_csv(tmp_path / "x" / "events.csv")
    assert header[:2] == ["trial", "family"] and [(e["trial"], e["node"], e["to_state"]) for e in events] == [
        ("buggy", "output", "dead")]
    header, hypotheses = read_csv(tmp_path / "x" / "hypotheses.csv")
    assert [(h["trial"], h["rank"], h["type"], h["node"]) for h in hypotheses] == [
        ("buggy", "1", "dead_units", "output")]
    assert 0 < float(hypotheses[0]["confidence"]) < 1 and "'output'" in hypotheses[0]["sentence"]


def test_export_json_with_chosen_statistics_and_one_trial(group: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["export", str(group), "--to", "json", "--out", str(tmp_path), "--trial", "fixed",
                        "--stat", "mean", "saturated_fraction"], capsys)
    assert code == 0 and out.strip() == str(tmp_path / "export.json")
    payload = json.loads((tmp_path / "export.json").read_text())
    assert payload["trials"] == ["fixed"] and payload["columns"]["summaries"] == list(SUMMARY_COLUMNS)
    assert {r["statistic"] for r in payload["summaries"]} == {"mean", "saturated_fraction"}
    assert payload["events"] == [] and payload["hypotheses"] == []
    with open_recording(group, "fixed") as recording:
        _, values = recording.summary("output", "value", "mean")
    got = [r["value"] for r in payload["summaries"] if (r["tensor"], r["kind"], r["statistic"])
           == ("output", "value", "mean")]
    np.testing.assert_allclose(got, values, rtol=1e-12)
    no_bounds = [r["value"] for r in payload["summaries"] if r["statistic"] == "saturated_fraction"]
    assert set(no_bounds) == {"nan"} and not any(isinstance(v, float) and math.isnan(v) for v in no_bounds)


def test_export_defaults_to_a_folder_inside_the_group(group: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    copy = tmp_path / "group"
    shutil.copytree(group, copy)
    code, out, _ = run(["export", str(copy), "--to", "csv", "--stat", "rms"], capsys)
    assert code == 0 and out.splitlines()[0] == str(copy / "export" / "summaries.csv")
    code, out, _ = run(["info", str(copy)], capsys)  # the export folder is not mistaken for a trial
    assert code == 0 and "in 2 trials" in out


@pytest.mark.parametrize("argv", [["info"], ["explain"], ["explain", "--json"], ["export", "--to", "csv"],
                                  ["gui"]])
def test_a_missing_path_is_one_line_and_exit_status_2(argv: list[str], tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nothing"
    code, out, err = run([argv[0], str(missing), *argv[1:]], capsys)
    assert code == 2 and out == ""
    assert err == (f"comgra-ndbg {argv[0]}: {missing} does not exist; pass the folder given to Recorder(...) "
                   f"or a trial folder inside it\n")


@pytest.mark.parametrize("command", ["info", "explain", "export"])
def test_a_path_without_a_recording_says_what_to_do(command: str, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    extra = ["--to", "csv"] if command == "export" else []
    code, _, err = run([command, str(tmp_path / "empty"), *extra], capsys)
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"comgra-ndbg {command}: {tmp_path / 'empty'} holds no recording") and "Recorder(" in err
    (tmp_path / "notes.h5").write_text("not hdf5")
    code, _, err = run([command, str(tmp_path / "notes.h5"), *extra], capsys)
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"comgra-ndbg {command}: {tmp_path / 'notes.h5'} is not a readable HDF5 recording")


def test_an_unknown_trial_is_one_line(group: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["explain", str(group), "--trial", "nope"], capsys)
    assert code == 2 and err == f"comgra-ndbg explain: no trial 'nope' in {group}; trials are ['buggy', 'fixed']\n"


def test_an_unwritable_export_folder_is_one_line(group: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, _, err = run(["export", str(group), "--to", "csv", "--out", str(blocker / "sub")], capsys)
    assert code == 2 and err.startswith(f"comgra-ndbg export: cannot create the export folder {blocker / 'sub'}")
    assert err.count("\n") == 1


@pytest.mark.parametrize("command", SUBCOMMAND_NAMES)
def test_every_subcommand_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main([command, "--help"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: comgra-ndbg {command} ")


def test_the_console_script_reports_errors_without_a_traceback(tmp_path: Path) -> None:
    script = Path(sys.executable).with_name("comgra-ndbg")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "comgra_ndbg.cli"]
    done = subprocess.run([*command, "explain", str(tmp_path / "nothing")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"comgra-ndbg explain: {tmp_path / 'nothing'} does not exist")
    done = subprocess.run([*command, "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and all(name in done.stdout for name in SUBCOMMAND_NAMES)


def test_a_reader_that_closes_the_pipe_early_ends_the_command_quietly(group: Path) -> None:
    script = Path(sys.executable).with_name("comgra-ndbg")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "comgra_ndbg.cli"]
    process = subprocess.Popen([*command, "explain", str(group)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()  # like `| head -0`: gone before the command writes anything
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 141 and b"Traceback" not in stderr and b"BrokenPipe" not in stderr

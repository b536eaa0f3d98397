"""The demo job: both trials recorded and explained, the bug named, the GUI served on 127.0.0.1."""
from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import torch

from comgra_ndbg import cli, open_recording
from comgra_ndbg.demo import Progress, run_demo
from comgra_ndbg.gui import app as gui_app
from comgra_ndbg.store.reader import list_trials

STEPS = 40


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Calls of ``serve`` (which would block), recorded instead of run."""
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(gui_app, "serve", lambda app, **kwargs: calls.append({"app": app, **kwargs}))
    return calls


def test_demo_without_gui_explains_both_trials_and_names_the_bug(tmp_path: Path, served: list[dict[str, Any]],
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    threads = torch.get_num_threads()
    assert cli.main(["demo", "--no-gui", "--steps", str(STEPS), "--path", str(tmp_path / "g")]) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert torch.get_num_threads() == threads and served == []
    assert f"recording {STEPS} steps per trial to {tmp_path / 'g'}" in out
    buggy, fixed = out.split("\ntrial fixed")
    assert "\ntrial buggy (last loss " in buggy
    assert "  1. Dead units originated in 'output' at step " in buggy
    assert float(buggy.split("(confidence ")[1][:4]) >= 0.5
    assert "Remedy: the model's output 'output' is 0 for every sample" in buggy
    assert f"  no failure found in {STEPS} recorded steps." in fixed
    assert f"`comgra-ndbg gui {tmp_path / 'g'}`" in fixed
    assert [line.split(" [")[0].strip() for line in captured.err.splitlines()] == ["buggy", "fixed"]
    assert f"] {STEPS}/{STEPS} " in captured.err
    assert list_trials(tmp_path / "g") == ["buggy", "fixed"]
    for trial in ("buggy", "fixed"):
        with open_recording(tmp_path / "g", trial) as recording:
            assert recording.is_complete and len(recording.steps) == STEPS
            assert recording.analysis() is not None and not recording.analysis().stale


def test_demo_serves_the_explorer_on_localhost_and_needs_a_fresh_folder(
        tmp_path: Path, served: list[dict[str, Any]], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli.main(["demo", "--steps", "30", "--port", "8123"]) == 0
    out = capsys.readouterr().out
    [group] = list((tmp_path / "runs").iterdir())
    assert group.name.startswith("demo-") and f"to {Path('runs') / group.name}\n" in out
    assert [(c["host"], c["port"]) for c in served] == [("127.0.0.1", 8123)]
    assert served[0]["app"].title == "comgra_ndbg explorer"
    assert (f"explorer for {Path('runs') / group.name} on http://127.0.0.1:8123/ (Ctrl+C to stop); in trial "
            f"'buggy' the graph marks node 'output'") in out
    assert cli.main(["demo", "--no-gui", "--path", str(group)]) == 2
    err = capsys.readouterr().err
    assert err == (f"comgra-ndbg demo: {group / 'buggy'} already exists; give the demo a new folder with --path, "
                   f"or leave --path out to get a fresh one\n")


def test_demo_refuses_too_few_steps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["demo", "--no-gui", "--steps", "5", "--path", str(tmp_path / "g")]) == 2
    assert "at least 30 steps" in capsys.readouterr().err and not (tmp_path / "g").exists()


def test_run_demo_returns_the_diagnoses(tmp_path: Path) -> None:
    out = io.StringIO()
    result = run_demo(tmp_path, steps=STEPS, seed=1, stream=out, progress_stream=io.StringIO())
    assert result.path == tmp_path and set(result.losses) == {"buggy", "fixed"}
    top = result.diagnoses["buggy"].top
    assert (top.type, top.origin, top.node) == ("dead_units", "node", "output")
    assert result.diagnoses["fixed"].healthy
    assert result.losses["buggy"] > 2 * result.losses["fixed"]  # the bug costs accuracy, and nothing crashes
    assert out.getvalue().count("\ntrial ") == 2


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_redraws_on_a_terminal_and_writes_one_line_elsewhere() -> None:
    log = io.StringIO()
    bar = Progress("run", 4, stream=log, width=8)
    for _ in range(4):
        bar.update()
    bar.close()
    assert log.getvalue().count("\n") == 1 and log.getvalue().startswith("run [########] 4/4 ")
    terminal = _Terminal()
    bar = Progress("run", 4, stream=terminal, width=8, interval=0.0)
    bar.update(2)
    assert terminal.getvalue().startswith("\rrun [####----] 2/4 ")
    bar.update(5)
    bar.close()
    assert terminal.getvalue().count("\r") == 3 and terminal.getvalue().endswith("s\n") and bar.done == 4

"""The ``comgra-ndbg`` command line: ``gui`` and ``info``, called in-process through ``main``."""
from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
from test_gui_support import make_recording

from comgra_ndbg import cli
from comgra_ndbg.gui import app as gui_app

CHECK_ADDRESS = gui_app.check_address


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_recording(tmp_path_factory.mktemp("group"), steps=4)


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Calls of ``serve`` (which would block), recorded instead of run; any port counts as free (another
    program on this machine may hold 8055)."""
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(gui_app, "serve", lambda app, **kwargs: calls.append({"app": app, **kwargs}))
    monkeypatch.setattr(gui_app, "check_address", lambda host, port: None)
    return calls


def test_gui_binds_localhost_on_8055_by_default(group: Path, served: list[dict[str, Any]],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["gui", str(group)]) == 0
    assert [(c["host"], c["port"]) for c in served] == [("127.0.0.1", 8055)]
    assert f"explorer for {group} on http://127.0.0.1:8055/" in capsys.readouterr().out


def test_gui_host_port_and_visualization_file(group: Path, served: list[dict[str, Any]], tmp_path: Path) -> None:
    viz = tmp_path / "viz.py"
    viz.write_text("def visualize(recording, selection):\n    return 'hello'\n")
    trial = group / "b"
    assert cli.main(["gui", str(trial), "--host", "0.0.0.0", "--port", "9001",
                     "--visualization-file", str(viz)]) == 0
    assert (served[0]["host"], served[0]["port"]) == ("0.0.0.0", 9001)
    assert served[0]["app"].title == "comgra_ndbg explorer"


def test_gui_reports_a_missing_recording_or_a_broken_visualization_in_one_line(
        group: Path, served: list[dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["gui", str(tmp_path / "nothing")]) == 2
    assert capsys.readouterr().err.startswith(f"comgra-ndbg gui: {tmp_path / 'nothing'} does not exist")
    broken = tmp_path / "viz.py"
    broken.write_text("import not_a_module_anywhere\n")
    assert cli.main(["gui", str(group), "--visualization-file", str(broken)]) == 2
    assert "ModuleNotFoundError" in capsys.readouterr().err and served == []


def test_a_port_in_use_is_reported_as_such_before_anything_claims_to_be_served(
        group: Path, served: list[dict[str, Any]], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gui_app, "check_address", CHECK_ADDRESS)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert cli.main(["gui", str(group), "--port", str(port)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and served == []
    assert err == (f"comgra-ndbg gui: port {port} on 127.0.0.1 is already in use (another explorer or server is "
                   f"listening there): stop it, or pass --port with a free port\n")
    assert cli.main(["gui", str(group), "--host", "192.0.2.1"]) == 2  # TEST-NET: no address of this machine
    assert "cannot listen on 192.0.2.1:8055" in capsys.readouterr().err


def test_info_summarizes_each_trial(group: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["info", str(group)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:6] == [
        "trial a: 4 recorded steps 0–3, complete",
        "  step type long: 2 steps",
        "  step type short: 2 steps",
        "  7 nodes, 9 tensors, kinds value, grad, update",
        "  KPIs: loss",
        "  1 notes",
    ]
    assert lines[6] == "trial b: 4 recorded steps 0–3, complete"


def test_a_subcommand_is_required() -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main([])
    assert exit_info.value.code == 2

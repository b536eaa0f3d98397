"""Arguments of ``comgra-ndbg`` that can never work are refused before any work is done: in one line, with exit
status 2 and no traceback. Ports out of range, negative counts of listed items, output files in a missing folder
or onto a folder, a Dask scheduler that cannot be reached, and ``--reference-trial`` without ``--reference``."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from cli_support import demo_group
from comgra_ndbg import NeuralDbg, cli
from comgra_ndbg.gui import app as gui_app

try:  # the sweep extra; without it the sweep tests skip themselves
    import dask
    import distributed
    import pandas
except ImportError:
    dask = distributed = pandas = None

STEPS = 30
PORT_ERROR = "argument --port: expected a port number from 1 to 65535, got {}"
COUNT_ERROR = "argument {}: expected a whole number of 0 or more, got {}"
requires_sweep = pytest.mark.skipif(dask is None or distributed is None or pandas is None,
                                    reason="needs the sweep extra (pip install 'comgra-ndbg[sweep]')")


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_group(tmp_path_factory, "arguments", STEPS)


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A recording with a profile of four modules (the Sequential and its three layers)."""
    folder = tmp_path_factory.mktemp("profiled") / "runs"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with NeuralDbg(model, path=folder, trial="p", profile=True):
        for _ in range(20):
            loss = model(torch.randn(32, 8)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return folder


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Calls of ``serve`` (which would block), recorded instead of run."""
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(gui_app, "serve", lambda app, **kwargs: calls.append({"app": app, **kwargs}))
    return calls


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``comgra-ndbg argv`` in this process, argparse's refusals included: (exit code, stdout, stderr)."""
    try:
        code = cli.main(argv)
    except SystemExit as done:
        code = done.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_refused_while_parsing(code: int, out: str, err: str, command: str, message: str) -> None:
    """argparse's refusal: the usage, then one line naming the argument and what is wrong with it."""
    assert code == 2 and out == "" and "Traceback" not in err
    assert err.startswith(f"usage: comgra-ndbg {command} ")
    assert err.splitlines()[-1] == f"comgra-ndbg {command}: error: {message}"


@pytest.mark.parametrize("port", ["99999", "65536", "-1", "0"])
def test_gui_refuses_a_port_outside_1_to_65535(port: str, group: Path, served: list[dict[str, Any]],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["gui", str(group), "--port", port], capsys)
    assert_refused_while_parsing(code, out, err, "gui", PORT_ERROR.format(port))
    assert served == []


@pytest.mark.parametrize("interval", ["0", "-5", "99"])
def test_gui_refuses_a_refresh_interval_under_100_ms(interval: str, group: Path, served: list[dict[str, Any]],
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["gui", str(group), "--refresh-ms", interval], capsys)
    assert_refused_while_parsing(code, out, err, "gui", f"argument --refresh-ms: expected milliseconds, a whole "
                                                        f"number of 100 or more, got {int(interval)}")
    assert served == []


def test_demo_refuses_a_bad_port_before_recording_anything(tmp_path: Path, served: list[dict[str, Any]],
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["demo", "--steps", str(STEPS), "--port", "99999", "--path", str(tmp_path / "g")], capsys)
    assert_refused_while_parsing(code, out, err, "demo", PORT_ERROR.format(99999))
    assert served == [] and not (tmp_path / "g").exists()


def test_explain_refuses_a_negative_max_events(group: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["explain", str(group), "--trial", "buggy", "--max-events", "-1"], capsys)
    assert_refused_while_parsing(code, out, err, "explain", COUNT_ERROR.format("--max-events", -1))


def test_profile_refuses_a_negative_limit_and_lists_no_module_with_0(profiled: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["profile", str(profiled), "--limit", "-2"], capsys)
    assert_refused_while_parsing(code, out, err, "profile", COUNT_ERROR.format("--limit", -2))
    code, out, _ = run(["profile", str(profiled), "--limit", "0"], capsys)
    lines = out.splitlines()
    assert code == 0 and lines[1].startswith("module ") and lines[2] == "  ... 4 more modules"


def test_explain_refuses_a_reference_trial_without_a_reference(group: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["explain", str(group), "--trial", "buggy", "--reference-trial", "fixed"], capsys)
    assert code == 2 and out == ""
    assert err == ("comgra-ndbg explain: --reference-trial fixed names a trial of the healthy reference run; pass "
                   "that run with --reference GOOD too\n")


@pytest.mark.parametrize("case", ["missing folder", "a folder", "a file as folder"])
def test_signature_refuses_an_output_it_cannot_write_before_drawing(case: str, group: Path, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file").write_text("")
    out, expected = {
        "missing folder": (tmp_path / "missing" / "x.png",
                           f"-o {tmp_path / 'missing' / 'x.png'}: the folder {tmp_path / 'missing'} does not exist; "
                           f"create it first"),
        "a folder": (tmp_path, f"-o {tmp_path} is a folder; name the file to write in it"),
        "a file as folder": (tmp_path / "file" / "x.png",
                             f"-o {tmp_path / 'file' / 'x.png'}: {tmp_path / 'file'} is not a folder"),
    }[case]
    code, printed, err = run(["signature", str(group), "--trial", "buggy", "-o", str(out)], capsys)
    assert code == 2 and printed == "" and err == f"comgra-ndbg signature: {expected}\n"


@requires_sweep
@pytest.mark.parametrize("case", ["missing folder", "a folder"])
def test_sweep_refuses_a_csv_it_cannot_write_before_analysing(case: str, group: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    csv, expected = {
        "missing folder": (tmp_path / "missing" / "x.csv",
                           f"--csv {tmp_path / 'missing' / 'x.csv'}: the folder {tmp_path / 'missing'} does not "
                           f"exist; create it first"),
        "a folder": (tmp_path, f"--csv {tmp_path} is a folder; name the file to write in it"),
    }[case]
    code, out, err = run(["sweep", str(group / "*"), "--threads", "--workers", "1", "--csv", str(csv)], capsys)
    assert code == 2 and out == "" and err == f"comgra-ndbg sweep: {expected}\n"


@requires_sweep
@pytest.mark.parametrize("address, reason", [("tcp://127.0.0.1:1", "Timed out trying to connect"),
                                             ("not-an-address", "missing port number")])
def test_sweep_reports_a_scheduler_it_cannot_reach_in_one_line(address: str, reason: str, group: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    with dask.config.set({"distributed.comm.timeouts.connect": "1s"}):
        code, out, err = run(["sweep", str(group / "*"), "--scheduler", address], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith(f"comgra-ndbg sweep: cannot reach the Dask scheduler at {address} (") and reason in err
    assert err.endswith("or leave out --scheduler to start a local cluster\n")


def test_the_console_script_refuses_bad_arguments_without_a_traceback(group: Path, tmp_path: Path) -> None:
    script = Path(sys.executable).with_name("comgra-ndbg")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "comgra_ndbg.cli"]
    done = subprocess.run([*command, "gui", str(group), "--port", "99999"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1] == f"comgra-ndbg gui: error: {PORT_ERROR.format(99999)}"
    done = subprocess.run([*command, "signature", str(group), "--trial", "buggy", "-o", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr == f"comgra-ndbg signature: -o {tmp_path} is a folder; name the file to write in it\n"

"""What the command-line tests share: the demo's buggy and fixed runs to point commands at, and a call of
``comgra-ndbg`` that hands back its exit code and what it printed."""
from __future__ import annotations

import io
from pathlib import Path

import pytest

from comgra_ndbg import cli
from comgra_ndbg.demo import run_demo


def demo_group(tmp_path_factory: pytest.TempPathFactory, name: str, steps: int) -> Path:
    """A group folder holding the demo's trials ``buggy`` and ``fixed``, ``steps`` steps each."""
    folder = tmp_path_factory.mktemp(name) / "group"
    run_demo(folder, steps=steps, stream=io.StringIO(), progress_stream=io.StringIO())
    return folder


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``comgra-ndbg argv`` in this process: (exit code, stdout, stderr)."""
    code = cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err

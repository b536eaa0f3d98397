"""docs/comgra.md says what the code does: its table names every call and argument of ``ComgraRecorder``, its
switch is the tutorial's import lines, its native examples run as written and record what they say, and
its links and file names lead somewhere."""
from __future__ import annotations

import inspect
import re
from pathlib import Path

import numpy as np

from comgra_ndbg import open_recording
from comgra_ndbg.compat.comgra import objects, tutorial
from comgra_ndbg.compat.comgra.recorder import ComgraRecorder

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "comgra.md"
TEXT = DOC.read_text()


def section(title: str) -> str:
    start = TEXT.index(f"\n## {title}\n")
    end = TEXT.find("\n## ", start + 1)
    return TEXT[start:end if end >= 0 else None]


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, re.S)


def test_the_table_names_every_call_and_argument_of_comgras_recorder() -> None:
    table = section("Every call and argument")
    calls = {name: f for name, f in inspect.getmembers(ComgraRecorder, inspect.isfunction)
             if not name.startswith("_") or name == "__init__"}
    assert len(calls) == 17
    for name, function in calls.items():
        if name != "__init__":
            assert re.search(rf"^\| [^|]*`{name}\(", table, re.M), f"no row for {name}()"
        for parameter in list(inspect.signature(function).parameters)[1:]:
            assert re.search(rf"`[^`|]*\b{parameter}\b[^`|]*`", table), f"{name}: argument {parameter} not in the table"
    for maker in objects.__all__:
        assert f"`{maker}" in table, maker


def test_every_warned_argument_is_marked_as_warning() -> None:
    """The rows marked ⚠ are exactly the arguments the layer warns about (tests/test_compat_comgra.py
    triggers each warning)."""
    table = section("Every call and argument")
    warned = [re.match(r"\| (?:↳ )?(?:\(not in Comgra\) )?`([a-z_]+)", row).group(1)
              for row in table.splitlines() if row.startswith("| ") and "⚠ warns" in row]
    assert sorted(warned) == sorted([
        "max_num_mappings_to_save_at_once_during_serialization",
        "type_of_serialization", "calculate_svd_and_other_expensive_operations_of_parameters",
        "record_all_tensors_per_batch_index_by_default", "index_of_batch_dimension", "recording_type",
        "record_per_batch_index", "add_tensor_connection", "record_current_gradients", "timepoint"])


def test_the_switch_is_the_tutorials_import_lines_and_imports() -> None:
    block = python_blocks(section("The switch"))[0]
    lines = [line.split("#")[0].rstrip() for line in block.strip().splitlines()]
    assert tuple(lines) == tutorial.LAYER_IMPORTS
    namespace: dict = {}
    exec(block, namespace)
    assert namespace["ComgraRecorder"] is ComgraRecorder and namespace["comgra"].my_recorder is None


def test_the_native_examples_run_as_written_and_record_what_they_say(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    minimal, recurrent = python_blocks(section("Moving to the native API"))
    exec(compile(minimal, f"{DOC}: minimal example", "exec"), {"__name__": "doc"})
    with open_recording(tmp_path / "runs" / "name_of_experiment_group") as recording:
        assert recording.trials == ["example_trial"] and len(recording.steps) == 100
        assert recording.snapshot_steps("outputs").tolist() == list(range(0, 100, 10))  # as Comgra's (10)
        assert np.all(np.diff(recording.kpi("loss")[1]) < 0)
        assert recording.notes[0].text.startswith("This is an optional log message")
        assert recording.snapshot(0, "outputs").dense().shape == (100, 5)  # num_samples=100: every sample
    exec(compile(recurrent, f"{DOC}: recurrent example", "exec"), {"__name__": "doc"})
    with open_recording(tmp_path / "runs" / "recurrent") as recording:
        assert recording.step_types == ["01_iterations", "02_iterations", "03_iterations", "04_iterations"]
        assert recording.snapshot_steps("loss").tolist() == [0, 1, 2, 3]  # each type's first step
        assert recording.step_iterations.tolist()[:4] == [2, 3, 4, 5]  # the initial value, then the passes
        assert sorted(t.label for t in recording.tensors_of("memory")) == ["initial", "out"]
        assert recording.summary_rows("memory.initial", iteration=0)[0].tolist() == list(range(20))
        assert recording.summary_rows("input", iteration=0)[0].tolist() == []
        edges = {(e.source, e.target) for e in recording.graph("03_iterations").graph.edges}
        assert {("memory", "output"), ("input", "memory"), ("cell", "memory"), ("memory", "memory"),
                ("output", "loss")} <= edges
        assert recording.snapshot(2, "memory.out", "grad", iteration=3).dense().shape == (8, 3)


def test_the_doc_is_linked_and_names_files_that_exist() -> None:
    assert "[docs/comgra.md](docs/comgra.md)" in (ROOT / "README.md").read_text()
    for target in re.findall(r"\]\(([^)#:]+)\)", TEXT):
        assert (DOC.parent / target).exists(), target
    code = TEXT[TEXT.index("Code: "):TEXT.index("\n\n", TEXT.index("Code: "))]
    for name in re.findall(r"`([a-z_]+\.py)`", code):
        assert (ROOT / "comgra_ndbg" / "compat" / "comgra" / name).exists() or (ROOT / "tests" / name).exists() \
            or (ROOT / name).exists(), name
    for path in re.findall(r"`((?:tests|comgra_ndbg)/[\w/]+(?:\.py)?/?)`", TEXT):
        assert (ROOT / path).exists(), path
    assert "BENCHMARK" not in TEXT

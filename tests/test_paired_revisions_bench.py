"""``benchmarks/paired_revisions.py``: a revision is copied out of git as a package of its own name, every
reference to the package renamed, importable beside this one; a round runs the four loops side by side, one
step each in turn, and both recorded loops record every step."""
from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import torch

from benchmarks import overhead, paired_revisions
from comgra_ndbg import NeuralDbg, Recorder, open_recording


def test_renamed_touches_the_package_as_a_module_and_nothing_else() -> None:
    source = ("import comgra_ndbg\nfrom comgra_ndbg.stats import kernels\n'comgra_ndbg_cache' \n"
              "os.environ['COMGRA_NDBG_CACHE_DIR']\nmy_comgra_ndbg = 1\n")
    assert paired_revisions.renamed(source, "comgra_ndbg_x") == (
        "import comgra_ndbg_x\nfrom comgra_ndbg_x.stats import kernels\n'comgra_ndbg_cache' \n"
        "os.environ['COMGRA_NDBG_CACHE_DIR']\nmy_comgra_ndbg = 1\n")


def test_a_revision_is_exported_as_a_package_of_its_own_that_imports_beside_this_one(tmp_path: Path) -> None:
    root = paired_revisions.ROOT
    listed = subprocess.run(["git", "-C", str(root), "ls-tree", "-r", "--name-only", "HEAD", "comgra_ndbg"],
                            capture_output=True, text=True, check=True).stdout.split()
    folder = paired_revisions.export_revision("HEAD", tmp_path, "comgra_ndbg_exported")
    written = sorted(str(p.relative_to(tmp_path / "comgra_ndbg_exported")) for p in
                     (tmp_path / "comgra_ndbg_exported").rglob("*") if p.is_file())
    assert written == sorted(str(Path(name).relative_to("comgra_ndbg")) for name in listed)
    for path in (tmp_path / "comgra_ndbg_exported").rglob("*.py"):
        text = path.read_text()
        assert "import comgra_ndbg\n" not in text and "from comgra_ndbg." not in text, path
    sys.path.insert(0, str(folder))
    try:
        exported = importlib.import_module("comgra_ndbg_exported.store.schema")
        from comgra_ndbg.store import schema
        assert exported is not schema and exported.__file__.startswith(str(tmp_path))
        assert exported.FIELD == schema.FIELD
    finally:
        sys.path.remove(str(folder))
        for name in [m for m in sys.modules if m.startswith("comgra_ndbg_exported")]:
            del sys.modules[name]


def test_the_working_tree_is_exported_as_it_is_now_uncommitted_changes_included(tmp_path: Path) -> None:
    root = paired_revisions.ROOT
    folder = paired_revisions.export_revision(None, tmp_path, "comgra_ndbg_now")
    for relative in ("__init__.py", "recorder/step_rows.py", "stats/reducer.py"):
        now = (root / "comgra_ndbg" / relative).read_text()
        assert (folder / "comgra_ndbg_now" / relative).read_text() == paired_revisions.renamed(now, "comgra_ndbg_now")
    tracked = subprocess.run(["git", "-C", str(root), "ls-files", "comgra_ndbg"], capture_output=True, text=True,
                             check=True).stdout.split()
    written = {str(p.relative_to(folder / "comgra_ndbg_now")) for p in (folder / "comgra_ndbg_now").rglob("*")
               if p.is_file()}
    assert written == {str(Path(name).relative_to("comgra_ndbg")) for name in tracked if (root / name).is_file()}


def test_a_round_runs_the_four_loops_in_turn_and_both_recorders_record_every_step(
        tmp_path: Path, overhead_models: list) -> None:
    data = overhead.make_data(6)
    times = paired_revisions.paired_round(data, str(tmp_path), Recorder, Recorder, "0")
    assert list(times) == ["bare", "earlier", "this", "floor"]
    assert all(len(t) == 6 and min(t) > 0 for t in times.values())
    for trial in ("earlier0", "this0"):
        with open_recording(tmp_path, trial) as recording:
            assert recording.steps.tolist() == list(range(6))
    assert len(overhead_models) == 4  # bare, the two recorded loops, the floor: each its own model
    for p, q in zip(overhead_models[1].parameters(), overhead_models[2].parameters()):
        assert torch.equal(p, q)  # both recorders leave the training untouched, step for step


def test_a_neuraldbg_round_records_every_step_of_both_loops(tmp_path: Path) -> None:
    data = overhead.make_data(5)
    times = paired_revisions.paired_round(data, str(tmp_path), NeuralDbg, NeuralDbg, "0")
    assert list(times) == ["bare", "earlier", "this", "floor"] and all(len(t) == 5 for t in times.values())
    losses = []
    for trial in ("earlier0", "this0"):
        with open_recording(tmp_path, trial) as recording:
            assert recording.steps.tolist() == list(range(5))
            assert "update" in recording.kinds("model.stem.weight")  # every statistic every step
            losses.append(recording.summary("loss", "value", "mean")[1].tolist())
    assert losses[0] == losses[1] and len(set(losses[0])) == 5  # the same training, step for step

"""Comgra's tutorial and minimal example, end to end on the Comgra layer: what the recording holds, the GUI's
selectors Comgra's README walks through, the training left unchanged, the bug visible in the summaries, and
(where Comgra 0.11.5 is installed) the same script run on real Comgra recording the same steps, tensors,
roles, iterations and values."""
from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import comgra_ndbg.compat.comgra as comgra
from comgra_ndbg import open_recording
from comgra_ndbg.analysis.api import analyze
from comgra_ndbg.compat.comgra import CompatibilityWarning
from comgra_ndbg.compat.comgra.tutorial import CONFIGURATIONS, Demonstration, source_for_comgra
from comgra_ndbg.gui import callbacks, panels
from comgra_ndbg.gui.state import ReaderCache, Selection, ViewOptions

SMALL = dict(steps=26, batch_size=8, hidden_size=16, memory_size=6, dataset_size=64,
             min_training_steps_difference=20)
"""Every type of execution (12, one per step modulo 12) is recorded at its first step, then again 24 steps
later: snapshots at steps 0-11, 24 and 25."""
BUGGED, FIXED = CONFIGURATIONS


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tutorial")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CompatibilityWarning)  # the tutorial asks for singular values, as Comgra's does
        Demonstration(root, "tutorial", **SMALL).run_all_configurations()
    return root / "tutorial"


def test_the_tutorial_records_both_trials_with_comgras_structure(group: Path) -> None:
    with open_recording(group, trial=f"trial_{BUGGED}") as recording:
        assert recording.trials == [f"trial_{BUGGED}", f"trial_{FIXED}"]
        assert recording.steps.tolist() == list(range(26))
        assert recording.step_types == [f"{n:02d}_iterations" for n in (*range(1, 11), 15, 20)]
        assert recording.snapshot_steps("loss").tolist() == [*range(12), 24, 25]
        assert recording.step_iterations[4] == 6  # 05_iterations: the initial memory, then 5 passes
        assert sorted(t.label for t in recording.tensors_of("memory")) == ["initial_memory", "memory_out"]
        helper = sorted(t.label for t in recording.tensors_of("helper_partial_sums"))
        assert helper[:3] == ["final", "up_to_iteration_00", "up_to_iteration_01"] and len(helper) == 20
        assert sorted(t.label for t in recording.tensors_of("root_module.subnet_pre")) == [
            "fnn1.bias", "fnn1.weight", "fnn2.bias", "fnn2.weight"]  # prefixes_..._in_nodes: one node
        roles = {t.name: t.role for t in recording.tensors}
        assert (roles["input"], roles["target"], roles["loss"], roles["output"]) == ("input", "target", "loss",
                                                                                     "intermediate")
        graph = recording.graph("05_iterations").graph
        edges = {(e.source, e.target, e.kind) for e in graph.edges}
        assert {("input", "helper_partial_sums", "manual"), ("memory", "root_module.subnet_pre__hidden_state",
                                                            "iteration"),
                ("root_module.subnet_mem__out", "memory", "forward"), ("output", "loss_per_sample", "forward"),
                ("root_module.subnet_pre", "root_module.subnet_pre__hidden_state", "forward")} <= edges
        assert recording.kpi_names == ["loss", "accuracy/all", "accuracy/first_ten_samples"]
        assert recording.kpi("loss")[0].tolist() == list(range(26))
        notes = [n.text for n in recording.notes]
        assert notes[0] == f"Configuration: {BUGGED}, 26 steps" and len(notes) == 1 + 12 + 14
        # test batches (15 and 20 iterations) take no optimizer step: their update is exactly zero
        steps, norms = recording.summary("root_module.subnet_out.fnn2", "update", "l2", tensor="weight")
        tested = np.isin(steps, recording.steps_of_type("15_iterations").tolist()
                         + recording.steps_of_type("20_iterations").tolist())
        assert np.all(norms[tested] == 0) and np.all(norms[~tested] > 0)


def test_the_gui_offers_the_selectors_comgras_readme_walks_through(group: Path) -> None:
    cache = ReaderCache(group)
    try:
        out = callbacks.update_selection(cache, None, None, None)
        assert out["trial_options"] == [f"trial_{BUGGED}", f"trial_{FIXED}"]
        out = callbacks.update_selection(cache, "step_type", "05_iterations", out["store"])  # type of training step
        assert (out["step_type"], out["node"], out["iteration_options"]) == ("05_iterations", "loss", [5])
        out = callbacks.update_selection(cache, "node", "input", out["store"])
        assert out["iteration_options"] == [1, 2, 3, 4, 5]
        out = callbacks.update_selection(cache, "step", 0, out["store"])  # the slider's first 05_iterations step
        assert out["step_label"] == "step 4 · 1 of 2 05_iterations steps"
        out = callbacks.update_selection(cache, "iteration", 5, out["store"])  # the last iteration
        out = callbacks.update_selection(cache, "sample", 0, out["store"])  # batch index: "Sample 0"
        assert (out["node"], out["iteration"], out["sample"]) == ("input", 5, 0)
        assert [o["value"] for o in out["sample_options"]] == ["batch", 0, 1, 2, 3, 4]
        out = callbacks.update_selection(cache, "node", "helper_partial_sums", out["store"])
        assert [o["label"] for o in out["tensor_options"]][:2] == ["final", "up_to_iteration_00"]  # role of tensor
        out = callbacks.update_selection(cache, "tensor", "helper_partial_sums.final", out["store"])
        panel = panels.tensor_panel(cache, Selection.from_dict(out["store"]["selection"]), ViewOptions())
        assert panel["header"].startswith("helper_partial_sums / final · value · step ")
        assert "iteration 5 · sample 0" in panel["header"]
        out = callbacks.update_selection(cache, "trial", f"trial_{FIXED}", out["store"])  # the fixed trial
        assert (out["trial"], out["node"], out["tensor"]) == (f"trial_{FIXED}", "helper_partial_sums",
                                                              "helper_partial_sums.final")
    finally:
        cache.close()


def test_recording_leaves_the_training_as_it_was(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CompatibilityWarning)
        on = Demonstration(tmp_path, "on", **SMALL)
        on.run_configuration(BUGGED)
    off = Demonstration(tmp_path, "off", **SMALL, comgra_is_active=False)
    off.run_configuration(BUGGED)
    assert on.losses[BUGGED] == off.losses[BUGGED]
    assert not (tmp_path / "off").exists()


@pytest.mark.slow
def test_the_bug_shows_in_the_recorded_output(tmp_path: Path) -> None:
    """The tutorial's bug as the README finds it: in the bugged trial the outputs cannot go far below 0.5
    (their minimum over the batch stays there), in the fixed trial they approach 0 for targets of 0; the
    diagnosis names the squashing output layer of the bugged trial, and not of the fixed one."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CompatibilityWarning)
        Demonstration(tmp_path, "bug", steps=300, min_training_steps_difference=1000).run_all_configurations()
    lowest = {}
    for configuration in CONFIGURATIONS:
        with open_recording(tmp_path / "bug", trial=f"trial_{configuration}") as recording:
            steps, minima = recording.summary("output", "value", "min")
            lowest[configuration] = float(minima[steps >= 250].min())
            assert recording.kpi("loss")[0].tolist() == list(range(300))
    assert lowest[BUGGED] > 0.45 and lowest[FIXED] < 0.1
    bugged = analyze(tmp_path / "bug", trial=f"trial_{BUGGED}", store=False).top
    assert (bugged.type, bugged.node) == ("output_range", "root_module.subnet_out__out")
    fixed = analyze(tmp_path / "bug", trial=f"trial_{FIXED}", store=False)
    assert all(h.type != "output_range" for h in fixed.hypotheses)


def test_comgras_minimal_example_runs_on_the_layer(tmp_path: Path) -> None:
    """Comgra's README minimal example, with its import lines changed and its path set."""
    import torch
    import torch.nn as nn
    import torch.optim as optim
    from comgra_ndbg.compat.comgra.objects import DecisionMakerForRecordingsFrequencyPerType
    from comgra_ndbg.compat.comgra.recorder import ComgraRecorder

    class SimpleModel(nn.Module):
        def __init__(self):
            super(SimpleModel, self).__init__()
            self.layer0 = nn.Linear(5, 5)
            self.layer1 = nn.Linear(5, 5)

        def forward(self, x):
            x = self.layer0(x)
            return self.layer1(x)

    with pytest.warns(CompatibilityWarning, match="calculate_svd"):
        comgra.my_recorder = ComgraRecorder(
            comgra_root_path=tmp_path,
            group="name_of_experiment_group",
            trial_id="example_trial",
            decision_maker_for_recordings=DecisionMakerForRecordingsFrequencyPerType(min_training_steps_difference=10),
        )
    comgra.my_recorder.add_note("This is an optional log message that will show up in the 'Notes' tab.")
    torch.manual_seed(0)
    model = SimpleModel()
    criterion = nn.MSELoss()
    optimizer = optim.SGD(model.parameters(), lr=0.01)
    comgra.my_recorder.track_module("main_model", model)
    inputs = torch.randn(100, 5)
    targets = 2 * inputs + torch.randn(100, 5) * 0.1
    num_epochs = 100
    for epoch in range(num_epochs):
        comgra.my_recorder.start_batch(epoch, inputs.shape[0])
        comgra.my_recorder.start_iteration()
        comgra.my_recorder.register_tensor("inputs", inputs, is_input=True)
        outputs = model(inputs)
        comgra.my_recorder.register_tensor("outputs", outputs)
        comgra.my_recorder.register_tensor("targets", targets, is_target=True)
        loss = criterion(outputs, targets)
        comgra.my_recorder.register_tensor("loss", loss, is_loss=True)
        comgra.my_recorder.record_kpi_in_graph("loss", "", loss)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        comgra.my_recorder.record_current_gradients("gradients")
        comgra.my_recorder.finish_iteration()
        comgra.my_recorder.finish_batch()
    comgra.my_recorder.finalize()
    with open_recording(tmp_path / "name_of_experiment_group") as recording:
        assert recording.trials == ["example_trial"] and recording.step_types == ["main_execution_type"]
        assert len(recording.steps) == 100 and recording.snapshot_steps("outputs").tolist() == list(range(0, 100, 10))
        losses = recording.kpi("loss")[1]
        assert len(losses) == 100 and np.all(np.diff(losses) < 0)  # full-batch gradient descent
        assert [n.text for n in recording.notes][0].startswith("This is an optional log message")
        edges = sorted((e.source, e.target, e.kind) for e in recording.graph("main_execution_type").graph.edges)
        assert edges == [("inputs", "outputs", "forward"), ("main_model.layer0", "outputs", "forward"),
                         ("main_model.layer1", "outputs", "forward"), ("outputs", "loss", "forward"),
                         ("targets", "loss", "forward")]


# ---- against real Comgra ---------------------------------------------------------------------------------------
def comgra_records(trial: Path) -> dict[int, tuple[str, dict[tuple, object]]]:
    """Each recorded step of a real Comgra trial: its type of execution and its records (key -> value)."""
    msgpack = pytest.importorskip("msgpack")
    from comgra.utilities import PseudoDb

    steps = {}
    for folder in (trial / "recordings").iterdir():
        step, kind = folder.name.split("__", 1)
        records: dict[tuple, object] = {}
        for file in folder.glob("*.msgpack"):
            with open(file, "rb") as handle:
                records.update(PseudoDb(None).deserialize(msgpack.load(handle, strict_map_key=False)["recordings"])
                               .record_set)
        steps[int(step)] = (kind, records)
    return steps


def key_of(node: str, role: str, parameters: set[str]) -> tuple[str, str]:
    """A registration's identity shared by both recordings: a parameter by its full name, any other tensor by
    node and role (Comgra prefixes its node names with ``node__``)."""
    node = node.removeprefix("node__")
    return ("parameter", role) if role in parameters else (node, role)


@pytest.mark.slow
def test_real_comgra_records_the_same_steps_tensors_roles_iterations_and_values(group: Path,
                                                                                 tmp_path: Path) -> None:
    pytest.importorskip("comgra", reason="comparing with Comgra needs comgra==0.11.5 (the 'bench' extra)")
    script = tmp_path / "comgra_tutorial.py"
    script.write_text(source_for_comgra())
    driver = (f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import comgra_tutorial as t; "
              f"t.Demonstration({str(tmp_path)!r}, 'tutorial', **{SMALL!r}).run_configuration({BUGGED!r})")
    subprocess.run([sys.executable, "-c", driver], check=True, cwd=tmp_path, timeout=600)
    theirs = comgra_records(tmp_path / "tutorial" / "trials" / f"trial_{BUGGED}")
    with open_recording(group, trial=f"trial_{BUGGED}") as ours:
        assert sorted(theirs) == ours.snapshot_steps("loss").tolist()
        assert {step: kind for step, (kind, _) in theirs.items()} == {s: ours.step_type_of(s) for s in theirs}
        parameters = {t.name for t in ours.tensors if t.role == "parameter"}
        by_key = {("parameter", t.name) if t.role == "parameter" else (t.node, t.label): t for t in ours.tensors}
        iterations = dict(zip(ours.steps.tolist(), ours.step_iterations.tolist()))
        present = {(t.name, it): set(ours.summary_rows(t.name, iteration=it)[0].tolist())
                   for t in ours.tensors for it in range(max(iterations.values()))}
        compared = 0
        for step, (kind, records) in theirs.items():
            registered = {(it, key_of(node, role, parameters)) for (_, _, _, it, node, role, what, item, _) in records
                          if what == "meta_information" and item == "tensor_shape" and not node.endswith("*old")}
            ours_registered = {(it - 1, key) for key, t in by_key.items() for it in range(iterations[step])
                               if step in present[(t.name, it)]}
            assert registered == ours_registered, step
            for (_, recording, aggregate, it, node, role, what, item, _), value in records.items():
                if (what != "data" or item != "mean" or node.endswith("*old")
                        or aggregate not in ("batch_mean", "has_no_batch_dimension")):
                    continue
                tensor = by_key[key_of(node, role, parameters)]
                ours_kind = "value" if recording == "forward" else "grad"
                expected = value["val"] if "val" in value else records[tuple(value["redirect"])]["val"]
                found = []
                if ours_kind in ours.kinds(tensor.name):
                    steps, means = ours.summary(tensor.name, ours_kind, "mean", iteration=it + 1)
                    found = means[steps == step]
                if not len(found):
                    assert expected == 0.0, (step, tensor.name, ours_kind, it)  # Comgra: 0 where no gradient came
                    continue
                assert found[0] == pytest.approx(expected, rel=1e-4, abs=1e-7), (step, tensor.name, ours_kind, it)
                compared += 1
            passes = int(kind.split("_")[0])  # the output of the last pass: iteration passes here, passes - 1 there
            values = ours.snapshot(step, "output", iteration=passes).dense()
            neurons = [records[(step, "forward", "Sample 0", passes - 1, "node__output", "output", "data", "neuron",
                                str(j))]["val"] for j in range(5)]
            np.testing.assert_allclose(values[0], neurons, rtol=1e-6)
    assert compared > 1000


def test_the_layer_has_comgras_calls_with_comgras_arguments_and_defaults() -> None:
    """Every public method of Comgra 0.11.5's ComgraRecorder and decision makers, with the same arguments in
    the same order and the same defaults (the layer adds keyword-only extras at the end: ``is_output``,
    ``recorder_options``)."""
    pytest.importorskip("comgra", reason="comparing with Comgra needs comgra==0.11.5 (the 'bench' extra)")
    import inspect

    import comgra.objects
    import comgra.recorder

    from comgra_ndbg.compat.comgra import objects
    from comgra_ndbg.compat.comgra.recorder import ComgraRecorder

    pairs = [(comgra.recorder.ComgraRecorder, ComgraRecorder)] + [
        (getattr(comgra.objects, name), getattr(objects, name)) for name in objects.__all__]
    for theirs, ours in pairs:
        for name, function in inspect.getmembers(theirs, inspect.isfunction):
            if name.startswith("_") and name not in ("__init__",):
                continue
            assert hasattr(ours, name), f"{ours.__name__}.{name}"
            expected = [(p.name, p.default) for p in inspect.signature(function).parameters.values()]
            found = [(p.name, p.default) for p in inspect.signature(getattr(ours, name)).parameters.values()]
            assert found[:len(expected)] == expected, f"{ours.__name__}.{name}"
            assert [n for n, _ in found[len(expected):]] in ([], ["is_output"], ["recorder_options"]), name

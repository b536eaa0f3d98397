"""Cached readers and selection logic of the explorer, on recordings made with the real Recorder."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from test_gui_support import make_recording, make_recurrent, new_model, train_steps

import comgra_ndbg
from comgra_ndbg import Recorder, open_recording
from comgra_ndbg.gui.queries import element_values, statistics_at, timeline_curves
from comgra_ndbg.gui.selection import resolve, snapshot_neighbour, step_neighbour, wanted_from_trigger
from comgra_ndbg.gui.state import ReaderCache, Selection
from comgra_ndbg.stats.statistics import derive


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_recording(tmp_path_factory.mktemp("group"))


@pytest.fixture
def cache(group: Path) -> ReaderCache:
    cache = ReaderCache(group)
    yield cache
    cache.close()


def test_default_selection_is_the_output_at_the_last_snapshot_of_the_last_step_type(cache: ReaderCache) -> None:
    selection, choices = resolve(cache, {})
    assert selection == Selection(trial="a", step_type="short", step=11, iteration=0, node="output",
                                  tensor="output", kind="value", sample=None, stat="mean")
    assert choices.trials == ["a", "b"] and choices.step_types == ["long", "short"]
    assert choices.steps.tolist() == [1, 3, 5, 7, 9, 11]
    assert choices.nodes == ["input", "model.0", "target", "hidden", "model.2", "output", "loss"]
    assert choices.kinds == ["value", "grad"] and choices.samples == [0, 1, 2, 3]


def test_wanted_choices_survive_contexts_where_they_are_invalid(cache: ReaderCache) -> None:
    wanted = {"node": "model.2", "kind": "update", "tensor": "model.2.weight", "step": 4, "step_type": "long"}
    selection, _ = resolve(cache, wanted)
    assert (selection.node, selection.tensor, selection.kind, selection.step) == ("model.2", "model.2.weight",
                                                                                  "update", 4)
    at_input, _ = resolve(cache, {**wanted, "node": "input"})
    assert (at_input.node, at_input.tensor, at_input.kind, at_input.step) == ("input", "input", "value", 4)
    back, _ = resolve(cache, {**wanted, "node": "model.0"})
    assert (back.tensor, back.kind) == ("model.0.weight", "update")  # same role in the node, same kind


def test_step_type_change_keeps_the_nearest_step(cache: ReaderCache) -> None:
    selection, _ = resolve(cache, {"step_type": "short", "step": 4})
    assert selection.step == 3  # 3 and 5 are equally near: the earlier one
    selection, _ = resolve(cache, {"step_type": "short", "step": 100})
    assert selection.step == 11


def test_a_closed_module_box_stands_for_its_nodes_and_choosing_a_node_inside_opens_it(cache: ReaderCache) -> None:
    selection, choices = resolve(cache, {"boxes": ["-model"], "node": "model.2", "tensor": "model.2.bias"})
    assert (selection.node, selection.tensor, selection.boxes) == ("model.2", "model.2.bias", ("-model",))
    assert choices.tensors == [("model.2.bias", "bias"), ("model.2.weight", "weight")]
    drawn = cache.drawn("a", "short", ("-model",))
    assert drawn.collapsed == ("model",) and drawn.view.shown_as["model.2"] == "box:model"
    assert sorted(i.id for i in drawn.view.items) == ["box:model", "hidden", "input", "loss", "output", "target"]
    closed, _ = resolve(cache, {"boxes": ["-model"]})
    wanted = wanted_from_trigger({"boxes": ["-model"]}, "search", "model.0", closed, None, cache)
    assert wanted == {"boxes": ["+model"], "node": "model.0"}
    clicked = wanted_from_trigger({"boxes": ["-model"]}, "graph", ("box:model", "box"), closed, None, cache)
    assert clicked == {"boxes": ["+model"]}


def test_triggers_update_only_what_the_user_changed(cache: ReaderCache) -> None:
    current, choices = resolve(cache, {})
    wanted = wanted_from_trigger({}, "stepper", ("step", -1), current, choices, cache)
    assert wanted == {"step": 9}
    assert wanted_from_trigger(wanted, "step", 0, current, choices, cache) == {"step": 1}
    assert wanted_from_trigger(wanted, "sample", "batch", current, choices, cache) == {"step": 9, "sample": None}
    assert wanted_from_trigger({}, "stepper", ("node", 1), current, choices, cache) == {"node": "loss", "boxes": []}
    assert wanted_from_trigger({}, "stepper", ("sample", 1), current, choices, cache) == {"sample": 0}
    assert wanted_from_trigger({}, "timeline", 4, current, choices, cache) == {"step_type": "long", "step": 4}
    assert wanted_from_trigger({}, "jump", ("hidden", 7, "grad"), current, choices, cache) == {
        "step_type": "short", "step": 7, "node": "hidden", "kind": "grad", "boxes": []}
    assert wanted_from_trigger({}, "jump", ("hidden", 7, ""), current, choices, cache) == {
        "step_type": "short", "step": 7, "node": "hidden", "boxes": []}


def test_a_jump_goes_to_the_nearest_recorded_step_and_ignores_pseudo_nodes(cache: ReaderCache) -> None:
    current, choices = resolve(cache, {})
    kept = {"node": "model.2", "kind": "update"}
    assert wanted_from_trigger(kept, "jump", ("optimizer", 30, "update"), current, choices, cache) == {
        "node": "model.2", "kind": "update", "step_type": "short", "step": 11}
    assert wanted_from_trigger(kept, "jump", ("", -3, ""), current, choices, cache) == {
        "node": "model.2", "kind": "update", "step_type": "long", "step": 0}
    assert wanted_from_trigger({}, "timeline", 4.4, current, choices, cache) == {"step_type": "long", "step": 4}
    assert wanted_from_trigger({"a": 1}, None, None, current, choices, cache) == {"a": 1}


def test_step_neighbour_clamps_at_the_ends() -> None:
    steps = np.array([1, 3, 5])
    assert [step_neighbour(steps, 3, d) for d in (-2, -1, 1, 2)] == [1, 1, 5, 5]
    assert step_neighbour(np.zeros(0, int), 3, 1) is None


def test_statistics_at_equal_the_readers_summary_and_the_snapshots_sample_stats(cache: ReaderCache,
                                                                                 group: Path) -> None:
    selection, _ = resolve(cache, {"node": "hidden", "step": 5, "step_type": "short"})
    stats = statistics_at(cache, selection)
    steps, rows = open_recording(group).summary_rows("hidden")
    assert stats == {k: float(v) for k, v in derive(rows[list(steps).index(5)]).items()}
    one = statistics_at(cache, Selection(**{**selection.__dict__, "sample": 2}))
    snapshot = open_recording(group).snapshot(5, "hidden")
    assert one["count"] == 8.0
    assert np.isclose(one["mean"], float(np.mean(snapshot.dense()[2], dtype=np.float64)), rtol=1e-6)
    assert statistics_at(cache, Selection(**{**selection.__dict__, "sample": 5})) is None


def test_element_values_of_the_batch_and_of_one_sample(cache: ReaderCache, group: Path) -> None:
    snapshot = open_recording(group).snapshot(5, "hidden")
    whole = element_values(snapshot, None)
    assert whole.shape == (4, 8) and whole.first_axis.tolist() == [0, 1, 2, 3]
    one = element_values(snapshot, 1)
    assert one.shape == (8,) and one.values.tolist() == snapshot.dense()[1].tolist()
    assert element_values(snapshot, 5) is None


def test_timeline_curves_split_the_series_by_step_type(cache: ReaderCache, group: Path) -> None:
    selection, _ = resolve(cache, {"node": "loss"})
    curves = timeline_curves(cache, selection)
    steps, values = open_recording(group).summary("loss")
    assert list(curves) == ["long", "short"]
    assert curves["long"][0].tolist() == [0, 2, 4, 6, 8, 10]
    assert curves["short"][1].tolist() == values[1::2].tolist()


def test_iterations_are_selectable_where_the_tensor_was_recorded(tmp_path: Path) -> None:
    cache = ReaderCache(make_recurrent(tmp_path))
    state, choices = resolve(cache, {"node": "state", "iteration": 1})
    assert (state.iteration, choices.iterations) == (1, [0, 1])
    readout, choices = resolve(cache, {"node": "readout", "iteration": 0})
    assert (readout.iteration, choices.iterations) == (1, [1])
    assert open_recording(tmp_path).step_iterations.tolist() == [2, 2, 2]
    assert cache.iterations("rnn") == {0: 2, 1: 2, 2: 2}
    first, _ = resolve(cache, {"node": "state", "iteration": 0})
    assert statistics_at(cache, first) != statistics_at(cache, state)


def test_refresh_is_cheap_when_nothing_changed_and_sees_new_steps(tmp_path: Path) -> None:
    model = new_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    recorder = Recorder(tmp_path, trial="live", snapshots=1, flush_every_steps=1)
    recorder.track_module("model", model)
    train_steps(recorder, model, optimizer, range(3))
    cache = ReaderCache(tmp_path)
    selection, _ = resolve(cache, {"node": "loss"})
    before = timeline_curves(cache, selection)
    assert cache.refresh() == {"live": 0}
    assert timeline_curves(cache, selection) is before  # memoized, nothing re-read
    train_steps(recorder, model, optimizer, range(3, 5))
    assert cache.refresh() == {"live": 1}
    selection, choices = resolve(cache, {"node": "loss"})
    assert choices.steps.tolist() == [0, 2, 4] and selection.generation == 1
    assert timeline_curves(cache, selection)["long"][0].tolist() == [0, 2, 4]
    recorder.close()
    cache.close()


def test_the_stored_diagnosis_is_read_once_per_analysis_and_turns_stale_when_the_run_grows(tmp_path: Path) -> None:
    model = new_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    recorder = Recorder(tmp_path, trial="live", snapshots=1, flush_every_steps=1)
    recorder.track_module("model", model)
    train_steps(recorder, model, optimizer, range(6))
    cache = ReaderCache(tmp_path)
    assert (cache.diagnosis("live"), cache.analysis_stamp("live"), cache.analysis_stamps()) == (None, None,
                                                                                                 {"live": None})
    comgra_ndbg.analyze(cache.recording("live"))
    stored = cache.diagnosis("live")
    assert (stored.stale, stored.num_steps, stored.diagnosis.num_steps) == (False, 6, 6)
    assert cache.diagnosis("live") is stored  # memoized while the stored file is unchanged
    stamp = cache.analysis_stamp("live")
    assert cache.analysis_stamps() == {"live": stamp}
    train_steps(recorder, model, optimizer, range(6, 8))
    assert cache.refresh() == {"live": 1}
    grown = cache.diagnosis("live")
    assert (grown.stale, grown.num_steps, grown.diagnosis.num_steps) == (True, 8, 6)
    comgra_ndbg.analyze(cache.recording("live"))
    assert cache.analysis_stamp("live") != stamp and cache.diagnosis("live").stale is False
    recorder.close()
    cache.close()


def test_shown_nodes_follow_closed_module_boxes(cache: ReaderCache) -> None:
    assert cache.shown_nodes("a", "short") == {n: n for n in ("model.0", "model.2", "input", "target", "hidden",
                                                               "output", "loss")}
    collapsed = cache.shown_nodes("a", "short", ("-model",))
    assert (collapsed["model.0"], collapsed["model.2"], collapsed["hidden"]) == ("box:model", "box:model", "hidden")


def test_snapshot_stepping_goes_to_the_nearest_snapshot_of_any_step_type(tmp_path: Path) -> None:
    from test_gui_support import make_faulty
    cache = ReaderCache(make_faulty(tmp_path))  # snapshots every 2 steps
    first, _ = resolve(cache, {})
    assert first.step == 22  # the first view lands on a step with a snapshot, not on the last step 23
    odd, _ = resolve(cache, {"step": 15})
    assert [snapshot_neighbour(cache, odd, d) for d in (-1, 1)] == [14, 16]
    cache.close()

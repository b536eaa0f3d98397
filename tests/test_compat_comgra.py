"""The Comgra layer (``comgra_ndbg.compat.comgra``) on real training runs written the way Comgra scripts are:
what lands in the recording, Comgra's decisions, iterations, roles and nodes, and the training left as it
was. Real Comgra is not needed here (``test_compat_comgra_tutorial.py`` compares with it)."""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import comgra_ndbg.compat.comgra as comgra
from comgra_ndbg import open_recording
from comgra_ndbg.compat.comgra import CompatibilityWarning
from comgra_ndbg.compat.comgra.objects import (DecisionMakerForRecordings, DecisionMakerForRecordingsFrequencyPerType,
                                               DecisionMakerForRecordingsHardcoded)
from comgra_ndbg.compat.comgra.recorder import ComgraRecorder
from comgra_ndbg.errors import RecorderStateError
from comgra_ndbg.recorder.policy import EveryK

BATCH, WIDTH = 6, 4


@pytest.fixture(autouse=True)
def no_compat_warnings_by_default():
    """The runs here pass calculate_svd...=False; a test that wants a warning catches it itself."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompatibilityWarning)
        yield


class Cell(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.read = nn.Linear(2 * WIDTH, WIDTH)
        self.out = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        state = torch.tanh(self.read(torch.cat([x, state], dim=1)))
        comgra.my_recorder.register_tensor(f"{comgra.my_recorder.get_name_of_module(self)}__state", state)
        return self.out(state), state


def new_recorder(root: Path, trial: str = "t", maker: object = None, **kwargs: object) -> ComgraRecorder:
    kwargs.setdefault("calculate_svd_and_other_expensive_operations_of_parameters", False)
    return ComgraRecorder(root, "group", trial, maker or DecisionMakerForRecordingsFrequencyPerType(3), **kwargs)


def run(recorder: ComgraRecorder, steps: int = 6, *, initial: bool = True, iterations=lambda step: 1 + step % 3,
        seed: int = 0, types: bool = True) -> list[float]:
    """A recurrent run in Comgra's style; returns the losses. The step type is the iteration count."""
    torch.manual_seed(seed)
    model = Cell()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    comgra.my_recorder = recorder
    recorder.track_module("cell", model)
    recorder.add_note("before training")
    data = torch.Generator().manual_seed(seed)
    losses = []
    for step in range(steps):
        n = iterations(step)
        recorder.start_batch(step, BATCH, type_of_execution=f"{n:02d}_iterations" if types else None)
        state = torch.zeros(BATCH, WIDTH)
        if initial:
            recorder.register_tensor("initial_state", state, node_name="state", is_initial_value=True)
        xs = torch.randn(BATCH, n, WIDTH, generator=data)
        for i in range(n):
            recorder.start_iteration()
            x = xs[:, i]
            recorder.register_tensor("input", x, is_input=True)
            out, state = model(x, state)
            recorder.register_tensor("state_out", state, node_name="state")
            if i == n - 1:
                target = xs.sum(dim=(1, 2)).unsqueeze(1)
                recorder.register_tensor("target", target, is_target=True)
                loss = (out - target).pow(2).mean()
                recorder.register_tensor("loss", loss, is_loss=True)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                if not types:  # Comgra needs the type before a set of gradients
                    recorder.decide_recording_of_batch(f"{n:02d}_iterations", ["a", "b"] * (BATCH // 2))
                recorder.record_current_gradients("gradients")
                recorder.record_kpi_in_graph("loss", "", loss)
                losses.append(loss.item())
            recorder.finish_iteration()
        recorder.finish_batch()
    recorder.finalize()
    return losses


# ---- where the recording goes and what it holds ------------------------------------------------------------
def test_the_trial_is_a_recording_in_the_group_folder(tmp_path: Path) -> None:
    run(new_recorder(tmp_path, "first"))
    run(new_recorder(tmp_path, "second"), seed=1)
    assert (tmp_path / "group" / "first" / "recording.h5").is_file()
    with open_recording(tmp_path / "group") as recording:
        assert recording.trials == ["first", "second"]
        assert recording.steps.tolist() == [0, 1, 2, 3, 4, 5]  # summaries: every step
        assert recording.step_types == ["01_iterations", "02_iterations", "03_iterations"]
        roles = {t.name: (t.node, t.role, t.label) for t in recording.tensors if t.role != "parameter"}
        assert roles == {"initial_state": ("state", "intermediate", "initial_state"),
                         "input": ("input", "input", "input"),
                         "cell__state": ("cell__state", "intermediate", "cell__state"),
                         "state_out": ("state", "intermediate", "state_out"),
                         "target": ("target", "target", "target"), "loss": ("loss", "loss", "loss")}
        assert recording.kinds("cell.read.weight") == ["value", "grad", "update"]
        assert recording.kinds("input") == ["value", "grad"]  # registering asked for its gradient, as in Comgra
        assert recording.kpi_names == ["loss"] and recording.kpi("loss")[0].tolist() == [0, 1, 2, 3, 4, 5]
        assert [(n.step, n.text) for n in recording.notes] == [(-1, "before training")]


def test_the_decision_maker_decides_the_snapshots_and_is_marked_as_in_comgra(tmp_path: Path) -> None:
    maker = DecisionMakerForRecordingsFrequencyPerType(min_training_steps_difference=3, exponential_backoff_factor=2)
    run(new_recorder(tmp_path, maker=maker), steps=30, iterations=lambda step: 1)
    with open_recording(tmp_path / "group") as recording:
        assert recording.snapshot_steps("loss").tolist() == [0, 6, 18]  # gaps 6, 12, then 24
        assert len(recording.steps) == 30
        reasons = recording.step_reasons()
        assert reasons[6] == "every step; Comgra's DecisionMakerForRecordingsFrequencyPerType"
        assert reasons[7] == "every step"
    assert maker.identifier_to_last_recorded_step_and_min_difference == {"01_iterations": (18, 24)}


def test_each_type_of_execution_is_snapshotted_on_its_own_clock(tmp_path: Path) -> None:
    run(new_recorder(tmp_path, maker=DecisionMakerForRecordingsFrequencyPerType(4)), steps=12)
    with open_recording(tmp_path / "group") as recording:
        assert recording.snapshot_steps("loss").tolist() == [0, 1, 2, 6, 7, 8]
        assert recording.steps_of_type("02_iterations").tolist() == [1, 4, 7, 10]


def test_hardcoded_and_custom_decision_makers(tmp_path: Path) -> None:
    run(new_recorder(tmp_path, "hard", DecisionMakerForRecordingsHardcoded({1, 4})))

    class EveryOther(DecisionMakerForRecordings):
        def __init__(self) -> None:
            self.marked: list[tuple[int, str]] = []

        def is_record_on_this_step(self, training_step: int, type_of_execution: str | None) -> bool:
            return training_step % 2 == 1

        def mark_recording_on_this_step(self, training_step: int, type_of_execution: str) -> None:
            self.marked.append((training_step, type_of_execution))

    custom = EveryOther()
    run(new_recorder(tmp_path, "custom", custom))
    with open_recording(tmp_path / "group") as recording:
        assert recording.with_trial("hard").snapshot_steps("input").tolist() == [1, 4]
        assert recording.with_trial("custom").snapshot_steps("input").tolist() == [1, 3, 5]
    assert custom.marked == [(1, "02_iterations"), (3, "01_iterations"), (5, "03_iterations")]


def test_recording_is_active_is_comgras_decision_not_the_summaries(tmp_path: Path) -> None:
    recorder = new_recorder(tmp_path, maker=DecisionMakerForRecordingsHardcoded({1}))
    recorder.track_module("cell", Cell())
    answers = []
    for step, override in ((0, None), (1, None), (2, None), (3, True)):
        recorder.start_batch(step, BATCH, "train", override__recording_is_active=override)
        recorder.start_iteration()
        answers.append(recorder.recording_is_active())
        recorder.finish_iteration()
        recorder.finish_batch()
    recorder.finalize()
    assert answers == [False, True, False, True]


# ---- iterations, nodes and roles -----------------------------------------------------------------------------
def test_initial_values_get_iteration_0_and_the_passes_count_from_1(tmp_path: Path) -> None:
    run(new_recorder(tmp_path, "with"), steps=3, iterations=lambda step: 3)
    run(new_recorder(tmp_path, "without"), steps=3, iterations=lambda step: 3, initial=False)
    with open_recording(tmp_path / "group", trial="with") as recording:
        assert recording.step_iterations.tolist() == [4, 4, 4]
        iterations = {name: sorted({int(i) for i in range(4) if len(recording.summary_rows(name, iteration=i)[0])})
                      for name in ("initial_state", "input", "state_out", "loss")}
        assert iterations == {"initial_state": [0], "input": [1, 2, 3], "state_out": [1, 2, 3], "loss": [3]}
        graph = recording.graph("03_iterations").graph
        edges = {(e.source, e.target, e.kind) for e in graph.edges}
        assert ("state", "cell__state", "iteration") in edges  # initial value and earlier passes feed the next
        assert ("cell__state", "state", "forward") in edges
        assert ("state", "cell__state", "forward") not in edges  # the initial value is no cycle in pass 1
    with open_recording(tmp_path / "group", trial="without") as recording:
        assert recording.step_iterations.tolist() == [3, 3, 3]
        assert [i for i in range(3) if len(recording.summary_rows("input", iteration=i)[0])] == [0, 1, 2]


def test_a_node_with_several_roles_and_a_manual_connection(tmp_path: Path) -> None:
    recorder = new_recorder(tmp_path, maker=DecisionMakerForRecordingsHardcoded({0, 1}))
    comgra.my_recorder = recorder
    recorder.track_module("cell", Cell())
    for step, n in enumerate((2, 3)):
        recorder.start_batch(step, BATCH, f"{n:02d}_iterations")
        xs = torch.randn(BATCH, n, WIDTH)
        recorder.start_iteration()
        recorder.register_tensor("input", xs[:, 0], is_input=True)
        for i in range(n):
            partial = xs[:, :i + 1].sum(dim=1).detach()
            recorder.register_tensor(f"partial_{i:02}", partial, node_name="partial_sums",
                                     role_within_node="final" if i == n - 1 else f"up_to_{i:02}")
            recorder.add_tensor_connection("input", partial)
        recorder.finish_iteration()
        recorder.finish_batch()
    recorder.finalize()
    with open_recording(tmp_path / "group") as recording:
        assert sorted(t.label for t in recording.tensors_of("partial_sums")) == ["final", "up_to_00", "up_to_01"]
        final = recording.snapshot(1, "partial_sums", tensor="final")
        assert final.shape == (BATCH, WIDTH)
        assert ("input", "partial_sums", "manual") in {(e.source, e.target, e.kind)
                                                      for e in recording.graph("03_iterations").graph.edges}


def test_parameter_prefixes_make_one_node(tmp_path: Path) -> None:
    run(new_recorder(tmp_path, prefixes_for_grouping_module_parameters_in_nodes=["cell.read"]), steps=2)
    with open_recording(tmp_path / "group") as recording:
        assert sorted(t.label for t in recording.tensors_of("cell.read")) == ["bias", "weight"]
        assert {t.node for t in recording.tensors if t.name.startswith("cell.out")} == {"cell.out"}


class Attention(nn.Module):
    """Sibling modules whose names share a prefix that does not end at a dot (``attn_q``, ``attn_k``)."""

    def __init__(self) -> None:
        super().__init__()
        self.attn_q, self.attn_k = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH)
        self.ff, self.head = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mixed = torch.softmax(self.attn_q(x) * self.attn_k(x), dim=1)
        return self.head(torch.relu(self.ff(mixed)))


def record_attention(root: Path, visually: list[str] | None) -> Path:
    """Two steps of a Comgra run of ``Attention`` into ``root/group`` (returned), one trial ``t``."""
    root.mkdir()
    recorder = new_recorder(root, maker=DecisionMakerForRecordingsHardcoded({0}),
                            prefixes_for_grouping_module_parameters_visually=visually)
    comgra.my_recorder = recorder
    model = Attention()
    recorder.track_module("net", model)
    for step in range(2):
        recorder.start_batch(step, BATCH, "train")
        recorder.start_iteration()
        x = torch.randn(BATCH, WIDTH)
        recorder.register_tensor("input", x, is_input=True)
        loss = model(x).pow(2).mean()
        recorder.register_tensor("loss", loss, is_loss=True)
        loss.backward()
        recorder.record_current_gradients("gradients")
        recorder.finish_iteration()
        recorder.finish_batch()
    recorder.finalize()
    return root / "group"


def drawn_boxes(root: Path, visually: list[str] | None) -> tuple[dict[str, tuple[str, ...]], dict[str, str]]:
    """The boxes the explorer draws (path -> nodes) for :func:`record_attention` and, with every box open,
    the frame each parameter node is drawn in."""
    from comgra_ndbg.gui.state import ReaderCache

    cache = ReaderCache(record_attention(root, visually))
    boxes, _ = cache.boxes("t", "train")
    view = cache.drawn("t", "train", ("*",)).view  # every box open
    frames = {item.name: (item.parent or "") for item in view.items if item.name.startswith("net.")}
    return dict(boxes.members), frames


def test_visual_prefixes_draw_their_parameters_in_one_box(tmp_path: Path) -> None:
    """Comgra's visual grouping: the parameters each prefix is the first to match are drawn in one box of the
    explorer, also where the prefix does not end at a dot; without prefixes the boxes follow the modules."""
    members, frames = drawn_boxes(tmp_path / "grouped", ["net.attn_", "net"])
    assert members == {"net.attn_": ("net.attn_k", "net.attn_q"), "net": ("net.ff", "net.head")}
    assert frames == {"net.attn_k": "box:net.attn_", "net.attn_q": "box:net.attn_", "net.ff": "box:net",
                      "net.head": "box:net"}
    members, frames = drawn_boxes(tmp_path / "modules", None)
    assert members == {"net": ("net.attn_k", "net.attn_q", "net.ff", "net.head")}
    assert set(frames.values()) == {"box:net"}
    with open_recording(tmp_path / "grouped" / "group") as recording:
        assert recording.config["parameter_groups"] == ["net.attn_", "net"]


def test_gradient_sets_the_first_is_the_steps_gradient(tmp_path: Path) -> None:
    recorder = new_recorder(tmp_path, maker=DecisionMakerForRecordingsHardcoded({0}))
    comgra.my_recorder = recorder
    model = Cell()
    recorder.track_module("cell", model)
    recorder.start_batch(0, BATCH, "train")
    recorder.start_iteration()
    x = torch.randn(BATCH, WIDTH)
    recorder.register_tensor("input", x, is_input=True)
    out, _ = model(x, torch.zeros(BATCH, WIDTH))
    out.pow(2).mean().backward(retain_graph=True)
    recorder.record_current_gradients("main")
    out.abs().mean().backward()
    assert x.grad is not None  # a leaf that registration made require a gradient: autograd fills its .grad
    with pytest.warns(CompatibilityWarning, match="holds what the backward passes since the previous set added"):
        recorder.record_current_gradients("aux", set_gradients_to_zero_if_not_a_parameter=True)
    assert x.grad is None and all(p.grad is not None for p in model.parameters())  # Comgra's clearing
    recorder.finish_iteration()
    recorder.finish_batch()
    recorder.finalize()
    x_again = x.detach().requires_grad_()  # the same passes again, outside the recording
    out_again, _ = model(x_again, torch.zeros(BATCH, WIDTH))
    expected_main, expected_aux = (torch.autograd.grad(loss(out_again), x_again, retain_graph=True)[0].numpy()
                                   for loss in (lambda o: o.pow(2).mean(), lambda o: o.abs().mean()))
    with open_recording(tmp_path / "group") as recording:
        assert recording.kinds("input") == ["value", "grad", "grad:aux"]
        main = recording.snapshot(0, "input", "grad").dense()
        aux = recording.snapshot(0, "input", "grad:aux").dense()
        np.testing.assert_allclose(main, expected_main, rtol=1e-6)
        np.testing.assert_allclose(aux, expected_aux, rtol=1e-6)  # the second pass only, not the sum of both


def test_detach_while_keeping_connection_links_what_follows_to_the_node(tmp_path: Path) -> None:
    recorder = new_recorder(tmp_path)
    comgra.my_recorder = recorder
    model = Cell()
    recorder.track_module("cell", model)
    recorder.start_batch(0, BATCH, "train")
    state = torch.zeros(BATCH, WIDTH)
    for i in range(2):
        recorder.start_iteration()
        x = torch.randn(BATCH, WIDTH)
        out, state = model(x, state)
        recorder.register_tensor("state_out", state, node_name="state")
        state = recorder.detach_while_keeping_connection(state)
        assert state.requires_grad and state.grad_fn is None
        recorder.finish_iteration()
    out.sum().backward()
    recorder.finish_batch()
    recorder.finalize()
    with open_recording(tmp_path / "group") as recording:
        assert sorted(t.label for t in recording.tensors_of("state")) == ["state_out", "state_out__detached"]
        edges = {(e.source, e.target, e.kind) for e in recording.graph("train").graph.edges}
        assert ("state", "cell__state", "iteration") in edges


# ---- dynamic recordings ------------------------------------------------------------------------------------
def test_a_type_decided_at_the_end_keeps_balanced_samples(tmp_path: Path) -> None:
    run(new_recorder(tmp_path, max_num_batch_size_to_record=4), steps=4, types=False)
    with open_recording(tmp_path / "group") as recording:
        assert recording.step_types == ["01_iterations", "02_iterations", "03_iterations"]
        assert recording.snapshot_steps("loss").tolist() == [0, 1, 2, 3]  # step 3: type 01 again, 3 later
        snap = recording.snapshot(1, "input", iteration=1)
        assert snap.sample_index.tolist() == [0, 1, 2, 3] and snap.sample_categories == ("a", "b", "a", "b")
        assert recording.steps.tolist() == [0, 1, 2, 3]


def test_declaring_all_types_skips_tentative_work_and_rejects_a_new_type(tmp_path: Path) -> None:
    recorder = new_recorder(tmp_path, maker=DecisionMakerForRecordingsFrequencyPerType(10),
                            recorder_options={"summaries": EveryK(100)})
    recorder.track_module("cell", Cell())
    def step(number: int, kind: str | None, decided: str | None = None, finish: bool = True) -> None:
        recorder.start_batch(number, BATCH, kind)
        recorder.start_iteration()
        recorder.finish_iteration()
        if decided:
            recorder.decide_recording_of_batch(decided, ["x"] * BATCH)
        if finish:
            recorder.finish_batch()

    step(0, None, "a")
    step(1, None, "b")
    recorder.declare_that_all_different_types_of_execution_have_been_encountered()
    step(2, None, finish=False)
    assert not recorder.recording_is_active() and not recorder.recorder.is_recording  # a, b not due: no work
    recorder.decide_recording_of_batch("a", ["x"] * BATCH)
    recorder.finish_batch()
    step(10, None, finish=False)
    assert recorder.recording_is_active() and recorder.recorder.is_recording  # a and b are due again
    recorder.decide_recording_of_batch("c", ["x"] * BATCH)
    with pytest.raises(RecorderStateError, match="too early.*'c'"):
        recorder.finish_batch()
    step(11, "a")  # the step was written and closed before the error; 'a' is due (last at 0)
    recorder.finalize()
    with open_recording(tmp_path / "group") as recording:
        assert recording.snapshot_steps("cell.read.weight").tolist() == [0, 1, 10, 11]


def test_override_false_records_nothing_of_the_step_and_true_forces_a_snapshot(tmp_path: Path) -> None:
    recorder = new_recorder(tmp_path, maker=DecisionMakerForRecordingsHardcoded(set()))
    comgra.my_recorder = recorder
    model = Cell()
    recorder.track_module("cell", model)
    for step, override in enumerate((None, False, True)):
        recorder.start_batch(step, BATCH, "train", override__recording_is_active=override)
        recorder.start_iteration()
        x = torch.randn(BATCH, WIDTH)
        recorder.register_tensor("input", x, is_input=True)
        assert x.requires_grad is (override is not False)
        model(x, torch.zeros(BATCH, WIDTH))[0].sum().backward()
        recorder.record_kpi_in_graph("loss", "", 1.0)
        recorder.finish_iteration()
        recorder.finish_batch()
    recorder.finalize()
    with open_recording(tmp_path / "group") as recording:
        assert recording.steps.tolist() == [0, 2] and recording.snapshot_steps("input").tolist() == [2]
        assert recording.kpi("loss")[0].tolist() == [0, 2]


# ---- the training run is left as it was ----------------------------------------------------------------------
def test_recording_changes_no_loss_and_no_random_number(tmp_path: Path) -> None:
    recorded = run(new_recorder(tmp_path, "on"), steps=8)
    rng = torch.get_rng_state()
    bare = run(new_recorder(tmp_path, "off", comgra_is_active=False), steps=8)
    assert recorded == bare
    assert torch.equal(rng, torch.get_rng_state())


def test_inactive_returns_at_once_writes_nothing_and_names_modules(tmp_path: Path) -> None:
    recorder = ComgraRecorder(tmp_path / "missing", "group", "t", None, comgra_is_active=False)
    model = Cell()
    recorder.track_module("cell", model)
    assert recorder.get_name_of_module(model.read) == "cell.read"  # Comgra raises KeyError here
    recorder.start_batch(5, BATCH, "train")
    recorder.start_batch(3, BATCH, "train")  # nothing is checked either
    recorder.register_tensor("x", torch.ones(3))
    detached = recorder.detach_while_keeping_connection(torch.ones(2, requires_grad=True) * 2)
    assert detached.requires_grad and detached.grad_fn is None
    recorder.record_kpi_in_graph("loss", "", 1.0)
    recorder.finish_batch()
    recorder.finalize()
    assert not recorder.recording_is_active() and not (tmp_path / "missing").exists()


# ---- arguments without an equivalent ---------------------------------------------------------------------------
def test_arguments_without_an_equivalent_warn_once(tmp_path: Path) -> None:
    with pytest.warns(CompatibilityWarning) as caught:
        recorder = ComgraRecorder(tmp_path, "group", "t", DecisionMakerForRecordingsHardcoded({0}),
                                  prefixes_for_grouping_module_parameters_visually=["cell.read", "cell"],  # no warning
                                  max_num_mappings_to_save_at_once_during_serialization=10,
                                  type_of_serialization="json")
        comgra.my_recorder = recorder
        recorder.track_module("cell", Cell())
        for step in range(2):
            recorder.start_batch(step, BATCH, "train", record_all_tensors_per_batch_index_by_default=False)
            recorder.start_iteration()
            recorder.register_tensor("x", torch.randn(WIDTH, BATCH), index_of_batch_dimension=1)
            recorder.register_tensor("y", torch.randn(BATCH, WIDTH), recording_type="kpis",
                                     record_per_batch_index=False)
            recorder.record_kpi_in_graph("loss", "", 1.0, timepoint=step * 10)
            recorder.finish_iteration()
            recorder.finish_batch()
        recorder.finalize()
    messages = [str(w.message) for w in caught]
    assert len(messages) == 7 and len(set(messages)) == 7
    for argument in ("max_num_mappings", "type_of_serialization",
                     "calculate_svd", "record_all_tensors_per_batch_index_by_default", "index_of_batch_dimension",
                     "recording_type='kpis'", "timepoint"):
        assert sum(argument in m for m in messages) == 1, argument
    with open_recording(tmp_path / "group") as recording:
        assert [t.batched for t in recording.tensors if t.name in ("x", "y")] == [False, True]


def test_recorder_options_reach_the_recorder(tmp_path: Path) -> None:
    run(new_recorder(tmp_path, maker=DecisionMakerForRecordingsHardcoded({3}), recorder_options={"summaries": 2}))
    with open_recording(tmp_path / "group") as recording:
        assert recording.steps.tolist() == [0, 2, 3, 4] and recording.snapshot_steps("loss").tolist() == [3]

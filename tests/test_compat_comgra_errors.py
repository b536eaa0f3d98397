"""Misuse that Comgra 0.11.5 rejects (with bare asserts) gets the library's typed errors, with Comgra's meaning
in the message; what the layer cannot check does not crash."""
from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from comgra_ndbg.compat.comgra import CompatibilityWarning
from comgra_ndbg.compat.comgra.objects import (DecisionMakerForRecordingsFrequencyPerType,
                                               DecisionMakerForRecordingsHardcoded)
from comgra_ndbg.compat.comgra.recorder import ComgraRecorder
from comgra_ndbg.errors import (ComgraError, DuplicateTensorError, InvalidArgumentError, InvalidTensorError,
                                RecorderStateError, UnknownModuleError)

BATCH = 4


def recorder(root: Path, **kwargs: object) -> ComgraRecorder:
    kwargs.setdefault("calculate_svd_and_other_expensive_operations_of_parameters", False)
    return ComgraRecorder(root, "group", "t", DecisionMakerForRecordingsHardcoded({0, 1, 2}), **kwargs)


@pytest.fixture
def started(tmp_path: Path) -> Iterator[ComgraRecorder]:
    """A recorder inside iteration 0 of a recorded step."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompatibilityWarning)
        rec = recorder(tmp_path)
        rec.track_module("net", nn.Linear(3, 3))
        rec.start_batch(0, BATCH, "train")
        rec.start_iteration()
        yield rec


def x() -> torch.Tensor:
    return torch.randn(BATCH, 3)


MISUSE_IN_A_STEP: list[tuple[str, Callable[[ComgraRecorder], object], type, str]] = [
    ("two roles", lambda r: r.register_tensor("a", x(), is_input=True, is_target=True), InvalidArgumentError,
     "at most one of"),
    ("same name twice", lambda r: [r.register_tensor("a", x()), r.register_tensor("a", x(), node_name="n")],
     DuplicateTensorError, "unique names per iteration"),
    ("same role twice", lambda r: [r.register_tensor("a", x(), node_name="n", role_within_node="r"),
                                   r.register_tensor("b", x(), node_name="n", role_within_node="r")],
     DuplicateTensorError, "already has a tensor with the role 'r'"),
    ("batch dimension", lambda r: r.register_tensor("a", torch.randn(BATCH + 1, 3)), InvalidArgumentError,
     "must be the batch of 4 samples"),
    ("reserved prefix", lambda r: r.register_tensor("node__a", x()), InvalidArgumentError, "reserves"),
    ("asterisk", lambda r: r.register_tensor("a*", x()), InvalidArgumentError, "contains '\\*'"),
    ("not a tensor", lambda r: r.register_tensor("a", [1, 2]), InvalidTensorError, "needs a torch.Tensor"),
    ("recording type", lambda r: r.register_tensor("a", x(), recording_type="all"), InvalidArgumentError,
     "recording_type must be"),
    ("single value with a batch", lambda r: r.register_tensor("a", x(), recording_type="single_value"),
     InvalidArgumentError, "index_of_batch_dimension=None"),
    ("per sample without batch", lambda r: r.register_tensor("a", x(), index_of_batch_dimension=None,
                                                             record_per_batch_index=True),
     InvalidArgumentError, "needs a batch dimension"),
    ("initial value too late", lambda r: r.register_tensor("a", x(), is_initial_value=True), RecorderStateError,
     "before the first start_iteration"),
    ("iteration started twice", lambda r: r.start_iteration(), RecorderStateError, "start_iteration"),
    ("batch started twice", lambda r: r.start_batch(1, BATCH), RecorderStateError, "while step 0 is open"),
    ("batch finished in a pass", lambda r: r.finish_batch(), RecorderStateError, "after finish_iteration"),
    ("unknown connection", lambda r: r.add_tensor_connection("nowhere", x()), InvalidArgumentError,
     "no tensor named 'nowhere'"),
    ("connection to itself", lambda r: [t := x(), r.register_tensor("a", t), r.add_tensor_connection(t, "a")],
     InvalidArgumentError, "same tensor"),
    ("same gradient set", lambda r: [r.record_current_gradients("g"), r.record_current_gradients("g")],
     DuplicateTensorError, "already called"),
    ("older KPI", lambda r: [r.record_kpi_in_graph("k", "", 1.0, timepoint=0),
                             r.record_kpi_in_graph("k", "", 2.0, timepoint=0)],
     RecorderStateError, "newer timepoint"),
    ("types disagree", lambda r: r.decide_recording_of_batch("other", ["a"] * BATCH), InvalidArgumentError,
     "must agree"),
    ("module in a step", lambda r: r.track_module("m", nn.Linear(1, 1)), RecorderStateError, "inside a batch"),
]


@pytest.mark.parametrize("what, call, error, message", MISUSE_IN_A_STEP, ids=[m[0] for m in MISUSE_IN_A_STEP])
def test_misuse_in_a_step(started: ComgraRecorder, what: str, call: Callable, error: type, message: str) -> None:
    with pytest.raises(error, match=message) as caught:
        call(started)
    assert isinstance(caught.value, ComgraError)


def test_registering_before_start_iteration_and_finishing_out_of_order(tmp_path: Path) -> None:
    rec = recorder(tmp_path)
    rec.track_module("net", nn.Linear(3, 3))
    with pytest.raises(RecorderStateError, match="without start_batch"):
        rec.finish_batch()
    rec.start_batch(0, BATCH, "train")
    with pytest.raises(RecorderStateError, match="before start_iteration.*is_initial_value=True"):
        rec.register_tensor("a", x())
    with pytest.raises(RecorderStateError, match="finish_iteration"):
        rec.finish_iteration()
    rec.start_iteration()
    rec.finish_iteration()
    rec.finish_batch()
    with pytest.raises(RecorderStateError, match="training_step to increase"):
        rec.start_batch(0, BATCH, "train")
    with pytest.raises(RecorderStateError, match="outside a batch"):
        rec.decide_recording_of_batch("train", ["a"] * BATCH)
    rec.finalize()


@pytest.mark.parametrize("type_of_execution", ["any_value", "__x", "two words", 5])
def test_types_of_execution_follow_comgras_rule(tmp_path: Path, type_of_execution: object) -> None:
    rec = recorder(tmp_path)
    rec.track_module("net", nn.Linear(3, 3))
    with pytest.raises(InvalidArgumentError, match="type_of_execution"):
        rec.start_batch(0, BATCH, type_of_execution)


def test_a_recording_without_modules_and_an_undecided_type(tmp_path: Path) -> None:
    rec = recorder(tmp_path)
    with pytest.raises(RecorderStateError, match="no module is tracked"):
        rec.start_batch(0, BATCH, "train")
    rec.track_module("net", nn.Linear(3, 3))
    rec.start_batch(0, BATCH, None)
    rec.start_iteration()
    with pytest.raises(RecorderStateError, match="decide_recording_of_batch"):
        rec.record_current_gradients("g")
    with pytest.raises(InvalidArgumentError, match="one str per sample"):
        rec.decide_recording_of_batch("train", ["a"] * (BATCH - 1))
    rec.finish_iteration()
    with pytest.raises(RecorderStateError, match="not recorded"):
        rec.finish_batch()
    rec.start_batch(1, BATCH, "train")  # the undecided step was dropped; recording goes on
    rec.start_iteration()
    rec.finish_iteration()
    rec.finish_batch()
    rec.finalize()


def test_modules(tmp_path: Path) -> None:
    rec = recorder(tmp_path)
    net = nn.Sequential(nn.Linear(2, 2))
    with pytest.raises(InvalidArgumentError, match="without '.'"):
        rec.track_module("a.b", net)
    with pytest.raises(InvalidTensorError, match="torch.nn.Module"):
        rec.track_module("net", "not a module")
    rec.track_module("net", net)
    with pytest.raises(InvalidArgumentError, match="already tracked as 'net.0'"):
        rec.track_module("again", net[0])
    with pytest.raises(InvalidArgumentError, match="another module is already tracked under that name"):
        rec.track_module("net", nn.Linear(1, 1))
    with pytest.raises(UnknownModuleError, match="not given to track_module") as caught:
        rec.get_name_of_module(nn.Linear(1, 1))
    assert isinstance(caught.value, KeyError)  # Comgra's KeyError, typed
    assert rec.get_name_of_module(net[0]) == "net.0"


def test_constructor_arguments(tmp_path: Path) -> None:
    maker = DecisionMakerForRecordingsFrequencyPerType(10)
    with pytest.raises(InvalidArgumentError, match="not an existing folder"):
        ComgraRecorder(tmp_path / "missing", "g", "t", maker)
    with pytest.raises(InvalidArgumentError, match="decision maker"):
        ComgraRecorder(tmp_path, "g", "t", object())
    for trial_id in ("", None, 3):  # '' would write the trial into the group folder itself
        with pytest.raises(InvalidArgumentError, match="trial_id must name one folder"):
            ComgraRecorder(tmp_path, "g", trial_id, maker)  # type: ignore[arg-type]
    for trial_id in (".", "..", "a/b"):  # the Recorder's own check of a trial name, through the layer
        with pytest.raises(InvalidArgumentError, match="must name one folder inside the group folder"):
            ComgraRecorder(tmp_path, "g", trial_id, maker)
    assert not (tmp_path / "g").exists() or not any((tmp_path / "g").iterdir())
    with pytest.raises(InvalidArgumentError, match="more specific prefixes first"):
        ComgraRecorder(tmp_path, "g", "t", maker, prefixes_for_grouping_module_parameters_visually=["a", "a.b"])
    with pytest.raises(InvalidArgumentError, match="extends none of the visual prefixes"):
        ComgraRecorder(tmp_path, "g", "t", maker, prefixes_for_grouping_module_parameters_visually=["a"],
                       prefixes_for_grouping_module_parameters_in_nodes=["b"])
    with pytest.raises(InvalidArgumentError, match="max_num_batch_size_to_record"):
        ComgraRecorder(tmp_path, "g", "t", maker, max_num_batch_size_to_record=0)
    with pytest.raises(InvalidArgumentError, match="recorder_options may not set"):
        ComgraRecorder(tmp_path, "g", "t", maker, recorder_options={"snapshots": 1})
    with pytest.raises(InvalidArgumentError, match="exponential_backoff_factor"):
        DecisionMakerForRecordingsFrequencyPerType(10, exponential_backoff_factor=0.5)
    with warnings.catch_warnings():  # visual prefixes have an equivalent (boxes in the explorer): no warning
        warnings.simplefilter("error", CompatibilityWarning)
        rec = ComgraRecorder(tmp_path, "g", "t", maker, prefixes_for_grouping_module_parameters_visually=["a."],
                             calculate_svd_and_other_expensive_operations_of_parameters=False)
    with pytest.raises(InvalidArgumentError, match="covered by none of the prefixes"):
        rec.track_module("b", nn.Linear(1, 1))

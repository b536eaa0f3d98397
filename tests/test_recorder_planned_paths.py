"""The recorder's shortcuts on steps that repeat the last: registration plans (``recorder/plan.py``) record
exactly what the general path records, and any change of the call or of the tensor's kind takes the general
path again; on planned steps, the parameters' gradients recorded are still the ones the optimizer uses."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from comgra_ndbg import NeuralDbg, Recorder, open_recording
from comgra_ndbg.errors import DuplicateTensorError, InvalidArgumentError
from comgra_ndbg.recorder.plan import make_plan, work_tensor
from comgra_ndbg.recorder.registration import TensorRegistration
from comgra_ndbg.recorder.snapshot import take_snapshot
from comgra_ndbg.stats.exact import work_view
from comgra_ndbg.stats.reducer import summarize
from comgra_ndbg.store.schema import FIELD
from comgra_ndbg.stats.statistics import derive

STATISTICS = ("mean", "std", "abs_max", "zero_fraction", "dead_fraction", "saturated_fraction")


def count_general_path(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names that went through the general path (``_record_tensor``), in order."""
    general = []
    original = TensorRegistration._record_tensor

    def counted(self, name, *args, **kwargs):
        general.append(name)
        return original(self, name, *args, **kwargs)

    monkeypatch.setattr(TensorRegistration, "_record_tensor", counted)
    return general


def expected(tensor: torch.Tensor, bounds: tuple[float, float] | None) -> dict[str, float]:
    row = summarize(tensor.detach(), batched=True, bounds=bounds)
    return {name: float(values[0]) for name, values in derive(row[None]).items() if name in STATISTICS}


def test_planned_registrations_record_what_the_general_path_records_and_changes_fall_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    general = count_general_path(monkeypatch)
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(6, 5, generator=g, requires_grad=True)
    # per step: batch size, the activation, whether the input requires grad
    plan = [(8, torch.tanh, True), (8, torch.tanh, True), (5, torch.tanh, True), (5, torch.sigmoid, True),
            (5, torch.sigmoid, False), (5, torch.sigmoid, False)]
    values, grads = [], []
    with Recorder(tmp_path, trial="t", snapshots=None) as rec:
        for step, (batch, activation, grad) in enumerate(plan):
            with rec.step(step):
                x = torch.randn(batch, 6, generator=g) * 3
                rec.register_tensor("x", x, role="input")
                h = activation(x @ (weight if grad else weight.detach()))
                rec.register_tensor("h", h)
                bounds = ((-1.0, 1.0) if activation is torch.tanh else (0.0, 1.0)) if grad else None  # from grad_fn
                values.append((h.detach().clone(), bounds))
                if grad:
                    h.retain_grad()
                    (h * torch.arange(5.0)).sum().backward()
                    grads.append(h.grad.clone())
                    rec.record_gradients()
    # general path: step 0 (no plan), 2 (batch size), 3 (autograd node type), 4 (no gradient); planned: 1, 5
    assert general == ["x", "h", "x", "h", "h", "h"]
    with open_recording(tmp_path, "t") as recording:
        for statistic in STATISTICS:
            steps, recorded = recording.summary("h", "value", statistic)
            assert steps.tolist() == list(range(6))
            np.testing.assert_allclose(recorded, [expected(v, b)[statistic] for v, b in values], rtol=1e-6,
                                       err_msg=statistic)  # saturation: NaN (unbounded) on the steps without grad
        steps, recorded = recording.summary("h", "grad", "abs_max")
        assert steps.tolist() == [0, 1, 2, 3]
        np.testing.assert_allclose(recorded, [float(grad.abs().max()) for grad in grads], rtol=1e-6)


def test_planned_names_still_refuse_a_duplicate_and_a_changed_role(tmp_path: Path) -> None:
    with Recorder(tmp_path, trial="t", snapshots=None) as rec:
        with rec.step(0):
            rec.register_tensor("h", torch.ones(4, 3))
        with rec.step(1):
            rec.register_tensor("h", torch.ones(4, 3))
            with pytest.raises(DuplicateTensorError, match="already registered"):
                rec.register_tensor("h", torch.ones(4, 3))
        with rec.step(2):
            with pytest.raises(InvalidArgumentError, match="first registered with role 'intermediate'"):
                rec.register_tensor("h", torch.ones(4, 3), role="output")


def test_a_tensor_the_plan_cannot_read_under_a_planned_name_is_skipped_and_logged_not_raised(tmp_path: Path) -> None:
    nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    with Recorder(tmp_path, trial="t", snapshots=None) as rec:
        for step in range(2):
            with rec.step(step):
                rec.register_tensor("x", torch.ones(2, 3), role="input")
        with rec.step(2), pytest.warns(Warning, match="nested"):
            assert rec.register_tensor("x", nested, role="input") is nested
    with open_recording(tmp_path, "t") as recording:
        steps, _ = recording.summary("x", "value", "mean")
        assert steps.tolist() == [0, 1]


@pytest.mark.parametrize("snapshots", [None, 1])
def test_parameter_gradients_on_planned_steps_are_the_accumulated_and_clipped_ones_the_optimizer_uses(
        tmp_path: Path, snapshots: int | None) -> None:
    """Two backward passes per step, then clipping: the step records the gradient ``optimizer.step()`` reads,
    on steps whose module outputs take their plans, with snapshots and without."""
    torch.manual_seed(0)
    model, criterion = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3)), nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(2)
    used = []
    with NeuralDbg(model, tmp_path, trial="t", loss=criterion, optimizer=optimizer, snapshots=snapshots):
        for _ in range(3):
            optimizer.zero_grad()
            for _ in range(2):
                criterion(model(torch.randn(16, 4, generator=g)), torch.randint(0, 3, (16,), generator=g)).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
            used.append(model[2].weight.grad.clone())
            optimizer.step()
    with open_recording(tmp_path, "t") as recording:
        steps, abs_max = recording.summary("model.2.weight", "grad", "abs_max")
        assert steps.tolist() == [0, 1, 2]
        np.testing.assert_allclose(abs_max, [float(grad.abs().max()) for grad in used], rtol=1e-6)
        _, mean = recording.summary("model.2.weight", "grad", "mean")
        np.testing.assert_allclose(mean, [float(grad.mean()) for grad in used], rtol=1e-5, atol=1e-9)


def test_integer_half_precision_and_strided_tensors_take_converting_plans_with_the_general_path_s_rows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Class targets, token ids, a half-precision activation, a transposed view and a lazily negated one are
    summarised from their work view on planned steps: the rows equal the general path's, field for field."""
    general = count_general_path(monkeypatch)
    g = torch.Generator().manual_seed(3)

    def tensors(step: int) -> dict[str, torch.Tensor]:
        return {"target": torch.randint(0, 10, (8,), generator=g),
                "tokens": torch.randint(0, 1000, (8, 5), generator=g, dtype=torch.int32),
                "mask": torch.rand(8, 5, generator=g) > 0.5,
                "half": (torch.randn(8, 6, generator=g) * 3).half(),
                "heads": torch.randn(5, 8, 4, generator=g).transpose(0, 1),
                "negated": torch.randn(8, 3, generator=g).conj_physical()._neg_view()}

    registered = []
    with Recorder(tmp_path, trial="t", snapshots=None) as rec:
        for step in range(3):
            with rec.step(step):
                batch = tensors(step)
                registered.append(batch)
                for name, tensor in batch.items():
                    rec.register_tensor(name, tensor, role="target" if name == "target" else "input")
    assert general == list(registered[0])  # step 0 made the plans; steps 1 and 2 took them
    with open_recording(tmp_path, "t") as recording:
        for name in registered[0]:
            steps, rows = recording.summary_rows(name)
            assert steps.tolist() == [0, 1, 2]
            for step in (1, 2):
                reference = summarize(registered[step][name], batched=True, bounds=None)
                np.testing.assert_array_equal(rows[step], reference, err_msg=f"{name} at step {step}")



@pytest.mark.parametrize("tensor", [
    torch.arange(-3, 9).reshape(3, 4), torch.arange(12, dtype=torch.uint8), torch.arange(-6, 6, dtype=torch.int8),
    torch.arange(-6, 6, dtype=torch.int16).reshape(4, 3).t(), torch.tensor([[True, False], [False, False]]),
    torch.linspace(-70000, 70000, 9).half(), torch.randn(3, 4, dtype=torch.float16, requires_grad=True),
    torch.randn(4, 3).t(), torch.randn(3, dtype=torch.float64).expand(2, 3),
    torch.linspace(-3, 3, 7, dtype=torch.bfloat16), torch._neg_view(torch.arange(5.0))],
    ids=["int64", "uint8", "int8", "int16-strided", "bool", "half-overflowing", "half-requiring-grad",
         "float32-transposed", "float64-broadcast", "bfloat16", "negated"])
def test_a_converting_plan_reads_the_work_view_s_values_whichever_library_converts(tensor: torch.Tensor) -> None:
    """numpy converts the dtypes it shares with torch (class targets, masks, half precision, strided views);
    the array the kernels read is the work view's, element for element and in the same order."""
    plan = make_plan(("input", None, None, ""), tensor, batch_before=None, batched=False, bounds=None,
                     saturation_margin=0.005, tensor_id=1, series_id=1, deferred=True)
    assert plan is not None and plan.convert
    converted, reference = work_tensor(tensor, plan), work_view(tensor.detach()).contiguous()
    assert converted.dtype == reference.dtype and converted.is_contiguous() and not converted.requires_grad
    assert torch.equal(converted.reshape(-1), reference.reshape(-1))

def test_snapshot_steps_take_the_plans_and_record_the_general_path_s_snapshots(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A snapshot step whose type is known registers planned names along their plans: the snapshot (values,
    indices, samples, per-sample statistics with the saturation bounds resolved at planning) is the one the
    general path takes."""
    general = count_general_path(monkeypatch)
    g = torch.Generator().manual_seed(4)
    weight = torch.randn(6, 7, generator=g, requires_grad=True)
    registered = []
    with Recorder(tmp_path, trial="t", snapshots=1, num_samples=3, max_elements=12) as rec:
        for step in range(3):
            with rec.step(step):
                batch = {"x": torch.randn(8, 6, generator=g), "target": torch.randint(0, 10, (8,), generator=g),
                         "h": torch.tanh(3 * torch.randn(8, 6, generator=g) @ weight)}
                for name, tensor in batch.items():
                    rec.register_tensor(name, tensor, role="target" if name == "target" else "input")
                registered.append(batch)
    assert general == list(registered[0])  # step 0 made the plans; the snapshot steps 1 and 2 took them
    with open_recording(tmp_path, "t") as recording:
        for name in registered[0]:
            for step in range(3):
                got = recording.snapshot(step, name)
                want = take_snapshot(registered[step][name], batched=True, num_samples=3, max_elements=12,
                                     bounds=(-1.0, 1.0) if name == "h" else None)
                np.testing.assert_array_equal(got.values, want.values, err_msg=f"{name} at step {step}")
                np.testing.assert_array_equal(got.value_index, want.value_index)
                np.testing.assert_array_equal(got.sample_index, want.sample_index)
                np.testing.assert_array_equal(got.sample_rows, want.sample_stats)
            assert (got.sample_rows[:, FIELD["bounded"]] > 0).all() == (name == "h")  # bounded: saturation was counted


def test_planned_steps_reuse_the_graph_found_at_the_first_and_a_changed_producer_is_rediscovered(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The structure signature of a step is kept as its tensors are registered, from the plans' keys on planned
    steps: equal to the general path's for the same tensors (one discovery for five repeated steps), and a
    tensor produced by another function takes the general path and a new discovery (the edge moves)."""
    general = count_general_path(monkeypatch)
    weight = nn.Parameter(torch.randn(3, 3))
    with Recorder(tmp_path, trial="t", snapshots=None) as rec:
        for step in range(6):
            with rec.step(step):
                a = rec.register_tensor("a", torch.randn(4, 3, requires_grad=True), role="input")
                b = rec.register_tensor("b", torch.randn(4, 3, requires_grad=True), role="input")
                h = torch.tanh(a @ weight) if step < 5 else torch.sigmoid(b @ weight)
                rec.register_tensor("h", h)
                h.sum().backward()
            if step == 4:
                assert rec._structure.cache.misses == 1 and general == ["a", "b", "h"]
        assert rec._structure.cache.misses == 2 and general == ["a", "b", "h", "h"]
    with open_recording(tmp_path, "t") as recording:
        edges = {(edge.source, edge.target) for edge in recording.graph("default").graph.edges}
    assert ("b", "h") in edges and ("a", "h") not in edges


def test_a_steady_loop_reuses_its_value_row_layout_and_records_every_step_s_rows(tmp_path: Path) -> None:
    """The layout of a step's value rows is built once for a loop that registers the same names; the rows
    written are each step's own (a NaN step included)."""
    layer = nn.Linear(3, 2)
    layouts, inputs = [], []
    with Recorder(tmp_path, trial="t", snapshots=None) as rec:
        rec.track_module("layer", layer)
        for step in range(4):
            x = torch.full((2, 3), float("nan")) if step == 2 else torch.randn(2, 3)
            inputs.append(x)
            with rec.step(step):
                rec.register_tensor("x", x, role="input")
                rec.register_tensor("h", layer(x))
            layouts.append(rec._value_layouts[1])
    assert layouts[1] is layouts[0] and layouts[3] is layouts[0]
    with open_recording(tmp_path, "t") as recording:
        steps, rows = recording.summary_rows("x")
        assert steps.tolist() == [0, 1, 2, 3] and rows[2, FIELD["nan"]] == 6 and rows[3, FIELD["nan"]] == 0
        for step in (0, 1, 3):
            np.testing.assert_array_equal(rows[step], summarize(inputs[step], batched=True))

"""The Recorder end to end: real (tiny) training runs recorded to real HDF5 files and read back."""
from __future__ import annotations

import gc
import os
import threading
import warnings
import weakref
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import comgra_ndbg.recorder.gradients as gradients_module
import comgra_ndbg.stats.host as host_module
import comgra_ndbg.stats.reducer as reduce_module
from comgra_ndbg import Recorder, RecorderWarning, open_recording
from comgra_ndbg.errors import InvalidTensorError, RecorderStateError
from comgra_ndbg.stats.reducer import Reducer
from comgra_ndbg.store import schema
from comgra_ndbg.store import writer as writer_module
from comgra_ndbg.store.segment import write_segment


def make_model() -> nn.Sequential:
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def train(rec: Recorder | None, steps: int = 50, on_step=None) -> tuple[nn.Module, torch.optim.Optimizer]:
    """Seeded training run; data comes from the global RNG inside the loop, so any RNG use would show."""
    torch.manual_seed(0)
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    if rec is not None:
        rec.track_module("model", model)
    for step in range(steps):
        if on_step is not None:
            on_step(step)
        x = torch.randn(8, 6)
        target = torch.randint(0, 3, (8,))
        if rec is not None:
            rec.start_step(step, "train")
        optimizer.zero_grad()
        hidden = model[1](model[0](x))
        output = model[2](hidden)
        loss = F.cross_entropy(output, target)
        if rec is not None:
            rec.register_tensor("input", x, role="input")
            rec.register_tensor("target", target, role="target")
            rec.register_tensor("hidden", hidden)
            rec.register_tensor("output", output, role="output")
            rec.register_tensor("loss", loss, role="loss")
        loss.backward()
        if rec is not None:
            rec.record_gradients()
        optimizer.step()
        if rec is not None:
            rec.record_kpi("loss", loss)
            rec.finish_step()
    return model, optimizer


def recorder_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, RecorderWarning)]


# ---- no side effects on training ----------------------------------------------------------------------------
def test_recording_has_no_side_effect_on_training(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", RecorderWarning)
        with Recorder(tmp_path, trial="t", summaries=1, snapshots=5) as rec:
            recorded_model, recorded_optimizer = train(rec)
            recorded_rng = torch.get_rng_state()
    plain_model, plain_optimizer = train(None)
    plain_rng = torch.get_rng_state()

    for (name, a), (_, b) in zip(recorded_model.named_parameters(), plain_model.named_parameters()):
        assert torch.equal(a, b), name
        assert a.requires_grad
    recorded_state, plain_state = recorded_optimizer.state_dict(), plain_optimizer.state_dict()
    assert recorded_state["state"].keys() == plain_state["state"].keys()
    for key, state in recorded_state["state"].items():
        for field, value in state.items():
            assert torch.equal(value, plain_state["state"][key][field]), (key, field)
    assert torch.equal(recorded_rng, plain_rng)

    with open_recording(tmp_path, "t") as recording:  # the recording really happened
        assert recording.steps.tolist() == list(range(50))
        assert recording.snapshot_steps("hidden").tolist() == list(range(0, 50, 5))
        assert recording.kinds("model.0.weight") == ["value", "grad", "update"]
        steps, losses = recording.kpi("loss")
        assert steps.tolist() == list(range(50)) and losses[-10:].mean() < losses[:10].mean()


def test_registered_non_leaf_tensors_get_no_grad_and_are_freed(tmp_path: Path) -> None:
    rec = Recorder(tmp_path, trial="t", summaries=1, snapshots=1)
    layer = nn.Linear(5, 3)
    rec.track_module("layer", layer)
    rec.start_step(0)
    x = torch.randn(4, 5)
    hidden = torch.tanh(layer(x))
    loss = hidden.pow(2).sum()
    assert rec.register_tensor("x", x, role="input") is x
    assert rec.register_tensor("hidden", hidden) is hidden
    assert rec.register_tensor("loss", loss, role="loss") is loss
    loss.backward()
    rec.record_gradients()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch warns when .grad of a non-leaf is read
        assert hidden.grad is None and loss.grad is None
    assert not hidden.retains_grad and not loss.retains_grad
    assert hidden.requires_grad and not hidden.is_leaf
    assert not x.requires_grad and x.grad is None
    refs = [weakref.ref(t) for t in (x, hidden, loss)]
    del x, hidden, loss
    rec.finish_step()
    gc.collect()
    assert [r() for r in refs] == [None, None, None]
    rec.close()
    with open_recording(tmp_path, "t") as recording:
        assert recording.kinds("hidden") == ["value", "grad"]


def test_activations_without_backward_are_freed_at_finish_step(tmp_path: Path) -> None:
    with Recorder(tmp_path, trial="t", snapshots=1) as rec:
        layer = nn.Linear(5, 3)
        rec.start_step(0)
        hidden = torch.tanh(layer(torch.randn(4, 5)))
        rec.register_tensor("hidden", hidden)
        ref = weakref.ref(hidden)
        del hidden
        rec.finish_step()
        gc.collect()
        assert ref() is None


def test_hooks_on_registered_leaves_do_not_pile_up(tmp_path: Path) -> None:
    weight = nn.Parameter(torch.randn(3, 4))
    rec = Recorder(tmp_path, trial="t")
    for step in range(10):
        with rec.step(step):
            rec.register_tensor("weight", weight, role="parameter")
            (weight * 2).sum().backward()
            rec.record_gradients()
        assert not weight._backward_hooks, f"{len(weight._backward_hooks)} hooks left after step {step}"
    rec.start_step(10)
    rec.register_tensor("weight", weight, role="parameter")
    rec.close()  # closing finishes the open step and removes what it added
    assert not weight._backward_hooks
    with open_recording(tmp_path, "t") as recording:
        steps, sums = recording.summary("weight", "grad", "mean")
        assert steps.tolist() == list(range(10)) and np.allclose(sums, 2.0)


# ---- what is recorded of which tensor ---------------------------------------------------------------------------
def test_tensors_without_gradient_are_recorded_as_values_only(tmp_path: Path) -> None:
    torch.manual_seed(0)
    embedding, layer = nn.Embedding(10, 4), nn.Linear(4, 2)
    optimizer = torch.optim.SGD(list(embedding.parameters()) + list(layer.parameters()), lr=0.1)
    with Recorder(tmp_path, trial="t") as rec:
        rec.track_module("layer", layer)
        with rec.step(0):
            ids = torch.randint(0, 10, (5,))
            target = torch.randint(0, 2, (5,))
            hidden = torch.tanh(layer(embedding(ids)))
            with torch.no_grad():
                no_grad = layer(embedding(ids))
            detached = hidden.detach() * 2
            loss = F.cross_entropy(hidden, target)
            for name, tensor, role in (("ids", ids, "input"), ("target", target, "target"),
                                       ("no_grad", no_grad, "intermediate"), ("detached", detached, "intermediate"),
                                       ("hidden", hidden, "intermediate"), ("loss", loss, "loss")):
                rec.register_tensor(name, tensor, role=role)
            loss.backward()
            rec.record_gradients()
            optimizer.step()
        assert not ids.requires_grad and not no_grad.requires_grad and not detached.requires_grad
    with open_recording(tmp_path, "t") as recording:
        for name in ("ids", "target", "no_grad", "detached"):
            assert recording.kinds(name) == ["value"], name
        assert recording.kinds("hidden") == ["value", "grad"]
        assert recording.kinds("loss") == ["value", "grad"]
        assert recording.kinds("layer.weight") == ["value", "grad", "update"]
        assert recording.kinds("layer.bias") == ["value", "grad", "update"]
        assert recording.roles["ids"] == "input" and recording.roles["layer.weight"] == "parameter"
        assert recording.summary("ids", "value", "max")[1][0] == ids.max().item()
        assert recording.summary("loss", "grad", "mean")[1].tolist() == [1.0]  # d loss / d loss


def test_gradients_and_updates_are_the_ones_training_saw(tmp_path: Path) -> None:
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    lr = 0.1
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    captured, before, after, grads = [], [], [], []
    with Recorder(tmp_path, trial="t", snapshots=1, num_samples=16, max_elements=10_000) as rec:
        rec.track_module("model", model)
        for step in range(3):
            with rec.step(step):
                x = torch.randn(16, 4)
                hidden = model[1](model[0](x))
                hidden.register_hook(lambda g: captured.append(g.detach().clone()))
                rec.register_tensor("hidden", hidden)
                loss = model[2](hidden).pow(2).mean()
                optimizer.zero_grad()
                loss.backward()
                rec.record_gradients()
                before.append(model[0].weight.detach().clone())
                grads.append(model[0].weight.grad.detach().clone())
                optimizer.step()
                after.append(model[0].weight.detach().clone())
    with open_recording(tmp_path, "t") as recording:
        steps, l2 = recording.summary("hidden", "grad", "l2")
        assert steps.tolist() == [0, 1, 2]
        np.testing.assert_allclose(l2, [g.double().norm().item() for g in captured], rtol=1e-5)
        np.testing.assert_allclose(recording.summary("hidden", "grad", "max")[1], [g.max().item() for g in captured])
        for step in range(3):
            np.testing.assert_array_equal(recording.snapshot(step, "hidden", "grad").dense(), captured[step].numpy())
            np.testing.assert_array_equal(recording.snapshot(step, "model.0.weight", "grad").dense(),
                                          grads[step].numpy())
            update = recording.snapshot(step, "model.0.weight", "update").dense()
            delta = (after[step] - before[step]).numpy()
            np.testing.assert_array_equal(update, delta)
            np.testing.assert_allclose(update, -lr * grads[step].numpy(), rtol=1e-4, atol=1e-6)
            np.testing.assert_array_equal(recording.snapshot(step, "model.0.weight", "value").dense(),
                                          before[step].numpy())
        rows = recording.summary_rows("model.0.weight", "update")[1]
        deltas = [(a - b).double() for a, b in zip(after, before)]
        np.testing.assert_allclose(rows[:, schema.FIELD["sum"]], [d.sum().item() for d in deltas], rtol=1e-5,
                                   atol=1e-9)
        np.testing.assert_allclose(recording.summary("model.0.weight", "update", "l2")[1],
                                   [d.norm().item() for d in deltas], rtol=1e-5)
        assert recording.summary("model.0.weight", "update", "count")[1].tolist() == [32.0] * 3


def test_several_named_gradient_sets_per_step(tmp_path: Path) -> None:
    torch.manual_seed(4)
    layer = nn.Linear(3, 4)
    seen: list[torch.Tensor] = []
    weight_grads = []
    with Recorder(tmp_path, trial="t", snapshots=1) as rec:
        rec.track_module("layer", layer)
        with rec.step(0):
            hidden = torch.tanh(layer(torch.randn(5, 3)))
            hidden.register_hook(lambda g: seen.append(g.clone()))
            rec.register_tensor("hidden", hidden)
            loss_a, loss_b = hidden.sum(), (hidden ** 2).sum()
            loss_a.backward(retain_graph=True)
            rec.record_gradients("a")
            weight_grads.append(layer.weight.grad.clone())
            layer.zero_grad()
            loss_b.backward()
            rec.record_gradients("b")
            weight_grads.append(layer.weight.grad.clone())
    with open_recording(tmp_path, "t") as recording:
        assert recording.kinds("hidden") == ["value", "grad:a", "grad:b"]
        assert recording.kinds("layer.weight") == ["value", "grad:a", "grad:b", "update"]
        np.testing.assert_array_equal(recording.snapshot(0, "hidden", "grad:a").dense(), np.ones((5, 4)))
        np.testing.assert_allclose(recording.snapshot(0, "hidden", "grad:b").dense(), 2 * hidden.detach().numpy(),
                                   rtol=1e-6)
        np.testing.assert_array_equal(recording.snapshot(0, "hidden", "grad:b").dense(), seen[1].numpy())
        assert recording.summary("hidden", "grad:a", "mean")[1].tolist() == [1.0]
        for kind, grad in zip(("grad:a", "grad:b"), weight_grads):
            np.testing.assert_allclose(recording.summary("layer.weight", kind, "l2")[1], [grad.double().norm()],
                                       rtol=1e-5)
        with pytest.raises(KeyError, match="grad:a"):
            recording.summary("hidden", "grad")


def test_a_later_gradient_set_holds_what_its_own_backward_passes_added_to_the_parameters(tmp_path: Path) -> None:
    """Without zero_grad between the losses, ``.grad`` keeps accumulating: set "a" is the first loss's gradient,
    set "b" the sum of the two backward passes after it, not everything in ``.grad``."""
    torch.manual_seed(6)
    layer = nn.Linear(3, 4)
    x = torch.randn(5, 3)
    expected = {}
    with Recorder(tmp_path, trial="t", snapshots=1) as rec:
        rec.track_module("layer", layer)
        for step in range(2):
            with rec.step(step):
                layer.zero_grad()
                out = layer(x)
                rec.register_tensor("out", out)
                out.sum().backward(retain_graph=True)
                rec.record_gradients("a")
                first = layer.weight.grad.clone()
                out.pow(2).sum().backward(retain_graph=True)
                (3 * out).mean().backward()
                rec.record_gradients("b")
                expected[step] = (first, layer.weight.grad - first)
    with open_recording(tmp_path, "t") as recording:
        for kind, which in (("grad:a", 0), ("grad:b", 1)):
            np.testing.assert_allclose(recording.summary("layer.weight", kind, "l2")[1],
                                       [expected[s][which].double().norm() for s in (0, 1)], rtol=1e-5)
            np.testing.assert_allclose(recording.snapshot(1, "layer.weight", kind).dense(),
                                       expected[1][which].numpy(), rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(recording.summary("out", "grad:b", "mean")[1],
                                   [(2 * out + 3 / 20).mean().item()] * 2, rtol=1e-5)


def test_backward_passes_of_one_set_add_up_in_a_registered_tensor(tmp_path: Path, monkeypatch) -> None:
    """Two losses of one output, each with its own backward(): the output's gradient in the set is the sum,
    as its .grad would be; without the memory to keep the first pass, the last is recorded, with a warning."""
    torch.manual_seed(7)
    layer = nn.Linear(3, 4)
    x = torch.randn(5, 3)

    def record(trial: str) -> torch.Tensor:
        with Recorder(tmp_path, trial=trial, snapshots=1) as rec:
            with rec.step(0):
                out = layer(x)
                rec.register_tensor("out", out)
                out.pow(2).sum().backward(retain_graph=True)
                (3 * out).mean().backward()
                rec.record_gradients()
        return out.detach()

    out = record("sum")
    with open_recording(tmp_path, "sum") as recording:
        np.testing.assert_allclose(recording.snapshot(0, "out", "grad").dense(), (2 * out + 3 / 20).numpy(),
                                   rtol=1e-6)
        np.testing.assert_allclose(recording.summary("out", "grad", "mean")[1], [(2 * out + 3 / 20).mean().item()],
                                   rtol=1e-5)
        assert recording.summary("out", "grad", "count")[1].tolist() == [20]
    monkeypatch.setattr(gradients_module, "SET_MEMORY", 0)
    with pytest.warns(RecorderWarning, match=r"'out' received gradients from several backward passes.*only the last"):
        record("last")
    with open_recording(tmp_path, "last") as recording:
        np.testing.assert_allclose(recording.snapshot(0, "out", "grad").dense(), np.full((5, 4), 3 / 20), rtol=1e-6)



def test_a_registered_leaf_whose_grad_the_loop_changes_between_passes_keeps_only_the_last_pass(
        tmp_path: Path) -> None:
    """A registered leaf (an adversarial input) gets two backward passes with its ``.grad`` zeroed in between:
    the sum the set would hold is no longer the one autograd accumulated, so the last pass is recorded, with a
    warning."""
    torch.manual_seed(0)
    x = torch.randn(4, 3, requires_grad=True)
    w = torch.randn(3, 2)
    with pytest.warns(RecorderWarning, match=r"'x' received gradients from several backward passes.*only the last"):
        with Recorder(tmp_path, trial="t", snapshots=1) as rec:
            with rec.step(0):
                rec.register_tensor("x", x)
                (x @ w).sum().backward()
                x.grad.zero_()
                (2 * x @ w).sum().backward()
                rec.record_gradients()
    with open_recording(tmp_path, "t") as recording:
        np.testing.assert_allclose(recording.snapshot(0, "x", "grad").dense(), x.grad.numpy(), rtol=1e-6)
        np.testing.assert_allclose(recording.summary("x", "grad", "mean")[1], [x.grad.mean().item()], rtol=1e-6)


def test_a_kpi_tensor_is_read_as_it_was_recorded_even_when_its_data_is_replaced_later(tmp_path: Path) -> None:
    """KPI tensors are read at the end of the step; one whose ``.data`` the loop replaces after
    ``record_kpi`` still records the value it held then."""
    accuracy = torch.tensor(1.0)
    with Recorder(tmp_path, trial="t", snapshots=None) as rec:
        with rec.step(0):
            rec.record_kpi("accuracy", accuracy)
            accuracy.data = torch.tensor(5.0)
    with open_recording(tmp_path, "t") as recording:
        assert recording.kpi("accuracy")[1].tolist() == [1.0]

def test_a_host_kpi_tensor_is_read_when_recorded_at_every_step_and_checked_as_the_first_time(tmp_path: Path) -> None:
    """From the second step on, a KPI name seen before takes a short path for a host 0-d tensor; it records
    what the tensor held at the call, like the first, and what the first call refuses it refuses too."""
    accuracy, values = torch.tensor(0.0), []
    with Recorder(tmp_path, trial="t", snapshots=None) as rec:
        for step in range(4):
            with rec.step(step):
                accuracy.fill_(step * 0.25)
                values.append(accuracy.item())
                rec.record_kpi("accuracy", accuracy)
                rec.record_kpi("count", torch.tensor(step + 1))  # an integer tensor
                rec.record_kpi("ok", torch.tensor(step % 2 == 0))  # a bool tensor
                accuracy.fill_(9.0)  # in place, after the call: not what was recorded
        with rec.step(4):
            with pytest.raises(InvalidTensorError, match="must be a scalar"):
                rec.record_kpi("accuracy", torch.ones(2, 3))
            with pytest.raises(InvalidTensorError, match="must be a real number"):
                rec.record_kpi("accuracy", torch.tensor(1 + 2j))
    with pytest.raises(RecorderStateError, match="closed recorder"):
        rec.record_kpi("accuracy", accuracy)
    with open_recording(tmp_path, "t") as recording:
        assert recording.kpi("accuracy")[1].tolist() == values == [0.0, 0.25, 0.5, 0.75]
        assert recording.kpi("count")[1].tolist() == [1.0, 2.0, 3.0, 4.0]
        assert recording.kpi("ok")[1].tolist() == [1.0, 0.0, 1.0, 0.0]


def test_multi_iteration_step_records_each_iteration(tmp_path: Path) -> None:
    torch.manual_seed(5)
    cell = nn.RNNCell(3, 5)
    inputs = torch.randn(3, 4, 3)
    states, grads = [], {}
    with Recorder(tmp_path, trial="t", snapshots=1) as rec:
        rec.track_module("cell", cell)
        with rec.step(0):
            state = torch.zeros(4, 5)
            for k in range(3):
                assert rec.start_iteration() == k
                state = cell(inputs[k], state)
                state.register_hook(lambda g, k=k: grads.__setitem__(k, g.clone()))
                rec.register_tensor("state", state)
                rec.finish_iteration()
                states.append(state.detach().clone())
            loss = state.pow(2).mean()
            rec.register_tensor("loss", loss, role="loss")
            loss.backward()
            rec.record_gradients()
    with open_recording(tmp_path, "t") as recording:
        for k in range(3):
            steps, mean = recording.summary("state", "value", "mean", iteration=k)
            assert steps.tolist() == [0]
            assert mean[0] == pytest.approx(states[k].double().mean().item(), rel=1e-6)
            assert recording.summary("state", "value", "count", iteration=k)[1].tolist() == [20.0]
            np.testing.assert_array_equal(recording.snapshot(0, "state", iteration=k).dense(), states[k].numpy())
            l2 = recording.summary("state", "grad", "l2", iteration=k)[1][0]
            assert l2 == pytest.approx(grads[k].double().norm().item(), rel=1e-5)
        merged = recording.summary_rows("state")[1]
        assert merged[0, schema.FIELD["count"]] == 60
        all_states = torch.stack(states).double()
        assert recording.summary("state", "value", "mean")[1][0] == pytest.approx(all_states.mean().item(), rel=1e-6)
        assert recording.summary("state", "value", "max")[1][0] == all_states.max().item()
        assert recording.summary("loss", "value", "count", iteration=2)[1].tolist() == [1.0]
        assert recording.summary("loss", "value", "count", iteration=0)[0].tolist() == []


# ---- steps, KPIs, notes, policies ---------------------------------------------------------------------------
def test_step_types_kpis_and_notes(tmp_path: Path) -> None:
    with Recorder(tmp_path, trial="t") as rec:
        rec.add_note("before anything")
        for step in range(6):
            step_type = "train" if step % 2 == 0 else "eval"
            with rec.step(step, step_type):
                rec.register_tensor("x", torch.full((2, 3), float(step)))
                rec.record_kpi("loss", 10.0 - step)
                rec.record_kpi("accuracy", torch.tensor(step / 10))
                rec.record_kpi("count", np.int64(step))
                if step == 2:
                    rec.add_note("lr lowered")
            rec.record_kpi("late", float(step))  # between steps: belongs to the step just finished
        rec.add_note("after the last step")
    with open_recording(tmp_path, "t") as recording:
        assert recording.step_types == ["train", "eval"]
        assert recording.steps_of_type("eval").tolist() == [1, 3, 5]
        assert recording.step_type_of(4) == "train"
        steps, values = recording.kpi("loss")
        assert steps.tolist() == list(range(6)) and values.tolist() == [10.0, 9.0, 8.0, 7.0, 6.0, 5.0]
        steps, values = recording.kpi("accuracy", "eval")
        assert steps.tolist() == [1, 3, 5]
        np.testing.assert_allclose(values, [0.1, 0.3, 0.5], rtol=1e-6)
        assert recording.kpi("count")[1].tolist() == [0, 1, 2, 3, 4, 5]
        steps, values = recording.kpi("late")
        assert steps.tolist() == list(range(6)) and values.tolist() == [0, 1, 2, 3, 4, 5]
        assert recording.kpi("late", "eval")[0].tolist() == [1, 3, 5]
        assert recording.kpi("late", "train")[0].tolist() == [0, 2, 4]
        notes = recording.notes
        assert [(n.step, n.text) for n in notes] == [(-1, "before anything"), (2, "lr lowered"),
                                                    (5, "after the last step")]


def test_snapshots_every_k_steps_and_summaries_every_step(tmp_path: Path) -> None:
    with Recorder(tmp_path, trial="t", summaries=1, snapshots=4) as rec:
        for step in range(14):
            with rec.step(step):
                rec.register_tensor("x", torch.full((3, 2), float(step)))
    with open_recording(tmp_path, "t") as recording:
        assert recording.snapshot_steps("x").tolist() == [0, 4, 8, 12]
        steps, means = recording.summary("x")
        assert steps.tolist() == list(range(14)) and means.tolist() == [float(s) for s in range(14)]
        assert recording.snapshot(8, "x").dense().tolist() == [[8.0, 8.0]] * 3


def test_policy_shorthands_record_exactly_those_steps(tmp_path: Path) -> None:
    recording_flags = []
    with Recorder(tmp_path, trial="t", summaries=[0, 3], snapshots=None) as rec:
        for step in range(6):
            with rec.step(step):
                recording_flags.append(rec.is_recording)
                rec.register_tensor("x", torch.full((2,), float(step)))
                rec.record_kpi("loss", float(step))
    assert recording_flags == [True, False, False, True, False, False]
    with open_recording(tmp_path, "t") as recording:
        assert recording.steps.tolist() == [0, 3]
        assert recording.summary("x")[0].tolist() == [0, 3]
        assert recording.summary("x")[1].tolist() == [0.0, 3.0]
        assert recording.snapshot_steps("x").tolist() == []
        assert recording.kpi("loss")[0].tolist() == list(range(6))  # KPIs are kept on skipped steps


def test_sub_sampled_snapshots_store_each_element_index_once_per_recording(tmp_path: Path) -> None:
    with Recorder(tmp_path, trial="t", summaries=None, snapshots=1, num_samples=2, max_elements=4,
                  flush_every_steps=3) as rec:
        train(rec, steps=9)
    with open_recording(tmp_path, "t") as recording:
        weight = [recording.snapshot(s, "model.0", "update", tensor="model.0.weight") for s in (1, 8)]
        hidden = [recording.snapshot(s, "hidden", "grad") for s in (1, 8)]
        for first, last in (weight, hidden):
            assert first.value_index is not None and len(first.value_index) == 4
            np.testing.assert_array_equal(first.value_index, last.value_index)
            assert not np.array_equal(first.values, last.values)
        np.testing.assert_array_equal(weight[0].value_index, [0, 32, 63, 95])  # evenly spaced over 16 x 6
        np.testing.assert_array_equal(hidden[0].value_index, [0, 15, 16, 31])  # 2 units of 2 samples of 16
    with h5py.File(tmp_path / "t" / schema.FINAL_NAME, "r") as f:
        pool = f[schema.VALUE_INDEX_POOL][()]
        subsampled = int(f[schema.SNAP_SUBSAMPLED][()].sum())
    assert subsampled > 9 * 5  # every step snapshots parameters and activations alike
    distinct = {tuple(pool[o:o + n]) for o, n in zip(*_index_slices(tmp_path / "t" / schema.FINAL_NAME))}
    assert len(pool) == sum(len(d) for d in distinct)  # one copy of each distinct index in the whole file


def _index_slices(path: Path) -> tuple[list[int], list[int]]:
    with h5py.File(path, "r") as f:
        offsets, counts = f[schema.SNAP_INDEX_OFFSET][()], f[schema.SNAP_VALUES_COUNT][()]
    keep = offsets >= 0
    return offsets[keep].tolist(), counts[keep].tolist()


def test_snapshots_only_steps(tmp_path: Path) -> None:
    with Recorder(tmp_path, trial="t", summaries=None, snapshots=[1]) as rec:
        for step in range(3):
            with rec.step(step):
                rec.register_tensor("x", torch.full((2,), float(step)))
    with open_recording(tmp_path, "t") as recording:
        assert recording.steps.tolist() == [1]
        assert recording.snapshot_steps("x").tolist() == [1]
        assert recording.summary("x")[0].tolist() == []


def test_disabled_recorder_does_nothing_and_never_raises(tmp_path: Path) -> None:
    folder = tmp_path / "group"
    rec = Recorder(folder, trial="t", enabled=False)
    tensor = torch.randn(3, requires_grad=True)
    assert rec.register_tensor("x", tensor) is tensor  # outside a step
    rec.finish_step()  # without start
    rec.record_kpi("loss", "not a number")
    rec.record_gradients()
    rec.finish_iteration()
    assert rec.start_iteration() == 0
    rec.start_step(0)
    rec.start_step(0)  # twice
    rec.register_tensor("x", tensor)
    rec.register_tensor("x", tensor)  # duplicate
    rec.register_tensor("y", [1, 2, 3])  # not a tensor
    rec.track_module("m", "not a module")
    rec.add_note("note")
    rec.flush()
    assert rec.current_step is None and not rec.is_recording
    with rec.step(1):
        assert rec.register_tensor("z", tensor) is tensor
    rec.close()
    rec.close()
    rec.register_tensor("after", tensor)  # after close
    with Recorder(folder, trial="t", enabled=False) as again:
        with again.step(0):
            pass
    assert not folder.exists()
    assert tensor.grad is None and not tensor._backward_hooks


def test_recorder_context_manager_consolidates(tmp_path: Path) -> None:
    with Recorder(tmp_path, trial="t", flush_every_steps=1) as rec:
        for step in range(3):
            with rec.step(step):
                rec.register_tensor("x", torch.ones(2))
    assert (tmp_path / "t" / schema.FINAL_NAME).exists()
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == [schema.FINAL_NAME]
    with open_recording(tmp_path, "t") as recording:
        assert recording.is_complete and recording.steps.tolist() == [0, 1, 2]
    rec.close()  # idempotent
    with open_recording(tmp_path, "t") as recording:
        assert recording.is_complete and recording.steps.tolist() == [0, 1, 2]


def test_step_context_manager_finishes_the_step_when_the_body_raises(tmp_path: Path) -> None:
    rec = Recorder(tmp_path, trial="t", snapshots=1)
    with pytest.raises(FloatingPointError, match="loss is NaN"):
        with rec.step(0):
            bad = torch.tensor([[1.0, float("nan")], [float("inf"), 2.0]])
            rec.register_tensor("bad", bad)
            rec.record_kpi("loss", float("nan"))
            raise FloatingPointError("loss is NaN")
    assert rec.current_step is None
    with rec.step(1):  # the recorder is usable afterwards
        rec.register_tensor("bad", torch.ones(2, 2))
    rec.close()
    rec.close()
    with open_recording(tmp_path, "t") as recording:
        assert recording.is_complete
        assert recording.steps.tolist() == [0, 1]
        assert recording.summary("bad", "value", "nan")[1].tolist() == [1.0, 0.0]
        assert recording.summary("bad", "value", "inf")[1].tolist() == [1.0, 0.0]
        assert recording.summary("bad", "value", "mean")[1][0] == 1.5
        dense = recording.snapshot(0, "bad").dense()
        assert np.isnan(dense[0, 1]) and np.isposinf(dense[1, 0])
        assert np.isnan(recording.kpi("loss")[1][0])


def test_non_finite_values_in_training_are_recorded_faithfully(tmp_path: Path) -> None:
    torch.manual_seed(6)
    model = nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    weights, outputs, grads = [], [], []
    with warnings.catch_warnings():
        warnings.simplefilter("error", RecorderWarning)
        with Recorder(tmp_path, trial="t", snapshots=1) as rec:
            rec.track_module("model", model)
            for step in range(6):
                if step == 3:
                    with torch.no_grad():
                        model.weight[0, 0] = float("inf")
                weights.append(model.weight.detach().clone())
                with rec.step(step):
                    output = model(torch.randn(5, 4))
                    loss = output.pow(2).mean()
                    rec.register_tensor("output", output, role="output")
                    rec.register_tensor("loss", loss, role="loss")
                    optimizer.zero_grad()
                    loss.backward()
                    rec.record_gradients()
                    grads.append(model.weight.grad.clone())
                    optimizer.step()
                    rec.record_kpi("loss", loss)
                outputs.append(output.detach().clone())

    def counts(tensors: list[torch.Tensor]) -> tuple[list[float], list[float]]:
        return ([float(t.isnan().sum()) for t in tensors], [float(t.isinf().sum()) for t in tensors])

    with open_recording(tmp_path, "t") as recording:
        for name, kind, tensors in (("model.weight", "value", weights), ("output", "value", outputs),
                                    ("model.weight", "grad", grads)):
            nan, inf = counts(tensors)
            assert recording.summary(name, kind, "nan")[1].tolist() == nan, (name, kind)
            assert recording.summary(name, kind, "inf")[1].tolist() == inf, (name, kind)
        assert recording.summary("model.weight", "value", "inf")[1][3] == 1
        assert sum(counts(outputs)[1][3:4]) > 0 and sum(counts(weights)[0][4:]) > 0
        assert np.isfinite(recording.summary("model.weight", "value", "mean")[1][:4]).all()
        np.testing.assert_array_equal(recording.snapshot(3, "model.weight").dense(), weights[3].numpy())
        np.testing.assert_array_equal(np.isnan(recording.snapshot(5, "output").dense()), outputs[5].isnan().numpy())
        assert not np.isfinite(recording.kpi("loss")[1][3])


def test_zero_samples_per_snapshot_still_records(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", RecorderWarning)
        with Recorder(tmp_path, trial="t", snapshots=1, num_samples=0) as rec:
            with rec.step(0):
                rec.register_tensor("x", torch.randn(4, 3))
    with open_recording(tmp_path, "t") as recording:
        snap = recording.snapshot(0, "x")
        assert snap.shape == (4, 3) and len(snap.sample_index) == 0
        assert recording.summary("x", "value", "count")[1].tolist() == [12.0]


# ---- internal failures never break training ------------------------------------------------------------------
def test_a_failing_writer_does_not_break_training(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk from step 20 on: reported at the step it happens (not a flush later), with the steps kept
    for a retry; the rows that could not be written at close() are reported as lost, by step number."""
    rec = Recorder(tmp_path, trial="t", flush_every_steps=1, flush_every_seconds=3600)

    def disk_full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    def on_step(step: int) -> None:
        if step == 20:
            rec.flush()  # the periodic flush of step 19 may still be writing on its worker thread,
            rec._writer.wait_for_merges()  # and a merge of earlier segments on its own
            monkeypatch.setattr(writer_module, "write_segment", disk_full)  # every segment write fails

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        recorded_model, _ = train(rec, steps=30, on_step=on_step)
    messages = recorder_warnings(caught)
    assert len(messages) == 1, messages
    assert "writing 1 segment file(s) into" in messages[0] and "No space left on device (ENOSPC)" in messages[0]
    assert "kept in memory and written at the next flush; free space on that disk" in messages[0]
    # one report per failed write (steps 20..28; step 29's background write is still running): none hidden
    assert rec._problems.count == 9
    plain_model, _ = train(None, steps=30)
    for a, b in zip(recorded_model.parameters(), plain_model.parameters()):
        assert torch.equal(a, b)
    with open_recording(tmp_path / "t") as recording:  # what was flushed before the failure stays readable
        assert recording.steps.tolist() == list(range(20))
        assert recording.summary("hidden")[0].tolist() == list(range(20))
        assert not recording.is_complete and recording.state == "live"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rec.close()
        rec.close()
    messages = recorder_warnings(caught)
    lost = [m for m in messages if "recorded steps were lost" in m]
    assert len(lost) == 1 and "10 recorded steps were lost (steps 20–29)" in lost[0], messages
    with open_recording(tmp_path / "t") as recording:
        assert recording.steps.tolist() == list(range(20))
        assert recording.state == "incomplete"  # closed, but its last rows never reached the disk


def test_a_periodic_flush_is_written_on_a_worker_thread_while_training_goes_on(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch
                                                                               ) -> None:
    gate, writers = threading.Event(), []

    def gated(path: Path, content: object, attrs: dict, **options: bool) -> None:
        writers.append(threading.current_thread())
        gate.wait(timeout=5)
        write_segment(path, content, attrs, **options)

    monkeypatch.setattr(writer_module, "write_segment", gated)
    rec = Recorder(tmp_path, trial="t", flush_every_steps=3, flush_every_seconds=3600)
    train(rec, steps=5)  # flushes after step 2, then trains on while that write waits at the gate
    assert len(writers) == 1 and writers[0] is not threading.current_thread()
    assert not any(name.endswith(".h5") for name in os.listdir(tmp_path / "t"))
    gate.set()
    rec.flush()  # waits for the write in flight, then writes steps 3 and 4
    with open_recording(tmp_path / "t") as recording:
        assert recording.steps.tolist() == [0, 1, 2, 3, 4]
    rec.close()


def test_a_failing_reducer_does_not_break_training(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> int:
        raise RuntimeError("reduction kernel failed")

    monkeypatch.setattr(Reducer, "add", broken)
    torch.manual_seed(0)
    weight = torch.zeros(3, requires_grad=True)
    optimizer = torch.optim.SGD([weight], lr=0.5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Recorder(tmp_path, trial="t", snapshots=1) as rec:
            for step in range(10):
                with rec.step(step):
                    x = rec.register_tensor("x", torch.randn(4, 3))
                    loss = (x @ weight - 1).pow(2).mean()
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    rec.record_kpi("loss", loss)
    messages = recorder_warnings(caught)
    assert len(messages) == 2 and "reduction kernel failed" in messages[0] and "'x'" in messages[0]
    assert "'x' (skipped_tensor) 10 times, steps 0–9" in messages[1]  # counted, not hidden
    torch.manual_seed(0)
    plain = torch.zeros(3, requires_grad=True)
    plain_optimizer = torch.optim.SGD([plain], lr=0.5)
    for _ in range(10):
        loss = (torch.randn(4, 3) @ plain - 1).pow(2).mean()
        plain_optimizer.zero_grad()
        loss.backward()
        plain_optimizer.step()
    assert torch.equal(weight, plain)
    with open_recording(tmp_path, "t") as recording:
        assert recording.is_complete
        assert recording.steps.tolist() == list(range(10))
        assert recording.kpi("loss")[0].tolist() == list(range(10))
        assert [(p.step, p.category, p.subject) for p in recording.problems()] == [
            (step, schema.PROBLEM_SKIPPED_TENSOR, "x") for step in range(10)]


def test_a_failure_inside_one_tensor_never_mixes_up_the_others(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    exact = reduce_module._exact_moments

    def fail_at_step_1(tensor: torch.Tensor, row: np.ndarray, **options: int) -> None:
        if rec.current_step == 1:
            raise MemoryError("out of memory in the float64 recompute")
        exact(tensor, row, **options)

    for module in (reduce_module, host_module):  # the device path and the host path
        monkeypatch.setattr(module, "_exact_moments", fail_at_step_1)
    values = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Recorder(tmp_path, trial="t") as rec:
            for step in range(4):
                with rec.step(step):
                    for name, offset in (("a", 0.0), ("b", 100.0), ("c", 200.0)):
                        tensor = torch.full((2, 3), offset + step)
                        if name == "a":
                            tensor[0, 0] = float("nan")  # needs the exact recompute
                        values[name, step] = tensor
                        rec.register_tensor(name, tensor)
    assert len(recorder_warnings(caught)) == 1
    with open_recording(tmp_path, "t") as recording:
        for name in ("b", "c"):
            steps, means = recording.summary(name)
            assert steps.tolist() == [0, 1, 2, 3]
            assert means.tolist() == [values[name, s].mean().item() for s in range(4)], name
        steps, nan = recording.summary("a", "value", "nan")
        assert steps.tolist() == [0, 2, 3] and nan.tolist() == [1.0, 1.0, 1.0]
        assert recording.summary("a", "value", "mean")[1].tolist() == [0.0, 2.0, 3.0]


def test_a_failed_step_does_not_shift_the_rows_of_later_steps(tmp_path: Path) -> None:
    layer = nn.Linear(3, 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Recorder(tmp_path, trial="t") as rec:
            rec.track_module("layer", layer)
            for step in range(5):
                with rec.step(step):
                    rec.register_tensor("x", torch.full((4, 3), float(step)))
                    if step == 2:  # the layer grows in the middle of a step: its update cannot be computed
                        layer.weight.data = torch.zeros(5, 3)
    assert len(recorder_warnings(caught)) == 1
    with open_recording(tmp_path, "t") as recording:
        steps, means = recording.summary("x")
        assert set(steps.tolist()) >= {0, 1, 3, 4}
        assert means.tolist() == [float(s) for s in steps]
        assert recording.summary("x", "value", "count")[1].tolist() == [12.0] * len(steps)
        steps, counts = recording.summary("layer.weight", "value", "count")
        assert dict(zip(steps.tolist(), counts.tolist()))[4] == 15.0
        assert dict(zip(steps.tolist(), counts.tolist()))[0] == 6.0


def test_values_and_updates_follow_parameters_whose_storage_is_replaced(tmp_path: Path) -> None:
    layer = nn.Linear(3, 2)
    nn.init.constant_(layer.weight, 0.5)
    with Recorder(tmp_path, trial="t") as rec:
        rec.track_module("layer", layer)
        for step in range(4):
            if step == 2:  # between steps: the next step starts from the new storage
                layer.weight.data = torch.full((2, 3), 4.0)
            with rec.step(step):
                rec.register_tensor("x", torch.ones(2, 3))
                if step == 1:  # inside a step, same shape: the update is measured against the old storage
                    layer.weight.data = layer.weight.data + 1.0
                if step == 3:
                    with torch.no_grad():
                        layer.weight.mul_(2.0)
    with open_recording(tmp_path, "t") as recording:
        assert recording.summary("layer.weight", "value", "mean")[1].tolist() == [0.5, 0.5, 4.0, 4.0]
        assert recording.summary("layer.weight", "update", "mean")[1].tolist() == [0.0, 1.0, 0.0, 4.0]


def test_values_and_updates_follow_parameters_re_strided_or_negated_over_the_same_memory(tmp_path: Path) -> None:
    """A ``.data`` swapped for a view of the same memory (a transpose, a lazily negated view) keeps the
    parameter's address: the layout cached for reading parameters by address must still notice, or the
    kernels would read the memory as it was laid out before."""
    layer = nn.Linear(3, 3, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.arange(9.0).view(3, 3))  # W[i, j] = 3 i + j
    with Recorder(tmp_path, trial="t") as rec:
        rec.track_module("layer", layer)
        for step in range(4):
            if step == 2:  # between steps: the same memory read with the other sign
                layer.weight.data = torch._neg_view(layer.weight.data)
            with rec.step(step):
                rec.register_tensor("x", torch.ones(2, 3))
                if step == 1:  # inside a step: the same memory transposed, W - W_start = 2 (j - i)
                    layer.weight.data = layer.weight.data.t()
    with open_recording(tmp_path, "t") as recording:
        assert recording.summary("layer.weight", "value", "mean")[1].tolist() == [4.0, 4.0, -4.0, -4.0]
        assert recording.summary("layer.weight", "value", "min")[1].tolist() == [0.0, 0.0, -8.0, -8.0]
        assert recording.summary("layer.weight", "update", "abs_max")[1].tolist() == [0.0, 4.0, 0.0, 0.0]


def test_parameter_values_gradients_and_updates_on_both_host_paths(tmp_path: Path, host_path: str) -> None:
    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    expected: dict[tuple[str, str], list[float]] = {}
    with Recorder(tmp_path, trial=host_path) as rec:
        rec.track_module("m", model)
        for step in range(3):
            with rec.step(step):
                start = {name: p.detach().clone() for name, p in model.named_parameters()}
                loss = model(torch.randn(4, 6)).pow(2).mean()
                rec.register_tensor("loss", loss, role="loss")
                opt.zero_grad()
                loss.backward()
                rec.record_gradients()
                opt.step()
                for name, p in model.named_parameters():
                    for kind, tensor in (("value", start[name]), ("grad", p.grad), ("update", p.detach() - start[name])):
                        expected.setdefault((f"m.{name}", kind), []).append(tensor.double().abs().max().item())
    with open_recording(tmp_path, host_path) as recording:
        for (name, kind), values in expected.items():
            steps, got = recording.summary(name, kind, "abs_max")
            assert steps.tolist() == [0, 1, 2], (name, kind)
            np.testing.assert_allclose(got, values, rtol=1e-6, err_msg=f"{name} {kind}")


@pytest.mark.parametrize("dtype, far", [(torch.bfloat16, 256.0), (torch.float16, 2048.0)], ids=["bfloat16", "float16"])
def test_half_precision_parameters_record_values_gradients_and_exact_updates(tmp_path: Path, dtype: torch.dtype,
                                                                             far: float) -> None:
    torch.manual_seed(6)
    model = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 2)).to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    starts, grads, ends = [], [], []
    with Recorder(tmp_path, trial="half", snapshots=1, max_elements=10_000) as rec:
        rec.track_module("m", model)
        for step in range(3):
            with torch.no_grad():
                model[0].weight[0, 0] = -1.0
            with rec.step(step):
                starts.append(model[0].weight.detach().clone())
                hidden = rec.register_tensor("hidden", model[1](model[0](torch.randn(4, 6, dtype=dtype))))
                loss = rec.register_tensor("loss", model[2](hidden).float().pow(2).mean(), role="loss")
                opt.zero_grad()
                loss.backward()
                rec.record_gradients()
                grads.append(model[0].weight.grad.detach().clone())
                opt.step()
                with torch.no_grad():  # far - (-1) lies between two values of the dtype
                    model[0].weight[0, 0] = far
                ends.append(model[0].weight.detach().clone())
    with open_recording(tmp_path, "half") as recording:
        assert recording.steps.tolist() == [0, 1, 2]
        updates = [(end.double() - start.double()) for start, end in zip(starts, ends)]
        assert all(u[0, 0].item() == far + 1 for u in updates)
        for kind, tensors in (("value", starts), ("grad", grads), ("update", updates)):
            steps, abs_max = recording.summary("m.0.weight", kind, "abs_max")
            assert steps.tolist() == [0, 1, 2], kind
            np.testing.assert_array_equal(abs_max, [t.double().abs().max().item() for t in tensors], err_msg=kind)
            np.testing.assert_allclose(recording.summary("m.0.weight", kind, "mean")[1],
                                       [t.double().mean().item() for t in tensors], rtol=1e-6, err_msg=kind)
        for step in range(3):
            np.testing.assert_array_equal(recording.snapshot(step, "m.0.weight", "update").dense(),
                                          updates[step].float().numpy())
        assert recording.summary("hidden", "grad", "count")[1].tolist() == [20.0] * 3


@pytest.mark.parametrize("in_hook", [False, True], ids=["record_gradients", "gradients_in_hook"])
def test_sparse_parameter_gradients_are_recorded_as_the_dense_gradient(tmp_path: Path, in_hook: bool) -> None:
    torch.manual_seed(7)
    embedding, head = nn.Embedding(30, 4, sparse=True), nn.Linear(4, 2)
    opt = torch.optim.SGD([*embedding.parameters(), *head.parameters()], lr=0.1)
    grads = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", RecorderWarning)
        with Recorder(tmp_path, trial="sparse", snapshots=1, max_elements=10_000) as rec:
            rec.track_module("emb", embedding, gradients_in_hook=in_hook)
            rec.track_module("head", head)
            for step in range(3):
                with rec.step(step):
                    ids = torch.tensor([[1, 2, 2], [5, 1, 9]])  # token 2 twice: an uncoalesced gradient
                    loss = rec.register_tensor("loss", head(embedding(ids)).pow(2).mean(), role="loss")
                    opt.zero_grad()
                    loss.backward()
                    assert embedding.weight.grad.is_sparse
                    grads.append(embedding.weight.grad.to_dense())
                    rec.record_gradients()
                    opt.step()
    with open_recording(tmp_path, "sparse") as recording:
        for name, stat, expected in (("count", "count", [120.0] * 3),
                                     ("zeros", "zero_fraction", [(g == 0).double().mean().item() for g in grads]),
                                     ("abs_max", "abs_max", [g.abs().max().item() for g in grads]),
                                     ("l2", "l2", [g.double().norm().item() for g in grads])):
            steps, got = recording.summary("emb.weight", "grad", stat)
            assert steps.tolist() == [0, 1, 2], name
            np.testing.assert_allclose(got, expected, rtol=1e-6, err_msg=name)
        assert recording.summary("head.weight", "grad", "count")[1].tolist() == [8.0] * 3
        for step in range(3):
            np.testing.assert_array_equal(recording.snapshot(step, "emb.weight", "grad").dense(), grads[step].numpy())


def test_a_graph_node_kept_across_steps_does_not_collect_hooks(tmp_path: Path, monkeypatch) -> None:
    from comgra_ndbg.recorder import native

    monkeypatch.setattr(native, "taps_module", lambda: None)  # the Python hooks (the C++ taps: test_native_taps)
    weight = nn.Parameter(torch.randn(3, 3))
    shared = torch.tanh(weight * 2)  # computed once, registered and backpropagated through every step
    with Recorder(tmp_path, trial="t") as rec:
        calls = []
        on_grad = rec._on_grad
        rec._on_grad = lambda *args: (calls.append(args[0]), on_grad(*args))[1]
        for step in range(5):
            with rec.step(step):
                rec.register_tensor("shared", shared)
                (shared * (step + 1)).sum().backward(retain_graph=True)
    assert len(calls) == 5  # one hook per step, not one more for every earlier step
    with open_recording(tmp_path, "t") as recording:
        assert recording.summary("shared", "grad", "mean")[1].tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]


def test_gradients_are_collected_at_finish_step_without_record_gradients(tmp_path: Path) -> None:
    torch.manual_seed(7)
    layer = nn.Linear(3, 2)
    seen = []
    with Recorder(tmp_path, trial="t") as rec:
        rec.track_module("layer", layer)
        with rec.step(0):
            hidden = torch.tanh(layer(torch.randn(6, 3)))
            hidden.register_hook(lambda g: seen.append(g.clone()))
            rec.register_tensor("hidden", hidden)
            hidden.pow(2).sum().backward()
            weight_grad = layer.weight.grad.clone()
    with open_recording(tmp_path, "t") as recording:
        assert recording.kinds("hidden") == ["value", "grad"]
        assert recording.summary("hidden", "grad", "l2")[1][0] == pytest.approx(seen[0].double().norm().item(),
                                                                                rel=1e-6)
        assert recording.summary("layer.weight", "grad", "l2")[1][0] == pytest.approx(
            weight_grad.double().norm().item(), rel=1e-6)


def test_a_discarded_step_writes_nothing_and_its_number_is_used_again(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    with Recorder(tmp_path, "t") as rec:
        rec.track_module("model", model)
        for step, discard in [(0, False), (1, True), (1, False)]:
            rec.start_step(step)
            x = torch.randn(5, 3)
            rec.register_tensor("x", x, role="input")
            out = rec.register_tensor("out", model(x), role="output")
            if discard:
                rec.register_tensor("extra", out * 2)  # another structure, discarded with the step
            out.pow(2).mean().backward()
            rec.record_kpi("loss", 100.0 if discard else 1.0)
            if discard:
                rec.discard_step()
                continue
            rec.record_gradients()
            rec.finish_step()
    with open_recording(tmp_path, "t") as recording:
        assert recording.steps.tolist() == [0, 1] and recording.kpi("loss")[1].tolist() == [1.0, 1.0]
        assert recording.summary("out", "value", "count")[1].tolist() == [10, 10]
        assert "extra" not in recording.graph("default").graph.node_names  # the step type's graph is put back


def test_refreshed_parameter_gradients_are_the_clipped_ones(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    with Recorder(tmp_path, "t") as rec:
        rec.track_module("model", model, gradients_in_hook=True)
        rec.start_step(0)
        model(torch.randn(5, 3)).pow(2).sum().backward()
        before = float(model.weight.grad.norm())
        nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.01)
        rec.refresh_parameter_gradients()
        clipped = float(model.weight.grad.norm())
        rec.finish_step()
    assert clipped < 0.0101 < before
    with open_recording(tmp_path, "t") as recording:
        np.testing.assert_allclose(recording.summary("model.weight", "grad", "l2")[1], [clipped], rtol=1e-6)


def test_a_frozen_parameter_that_did_not_move_has_no_update_and_one_moved_by_hand_has(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2), nn.Linear(2, 2))
    model[0].requires_grad_(False)
    model[2].requires_grad_(False)  # an EMA-like copy, updated by hand
    optimizer = torch.optim.SGD(model[1].parameters(), lr=0.1)
    with Recorder(tmp_path, "t") as rec:
        rec.track_module("model", model)
        for step in range(2):
            rec.start_step(step)
            optimizer.zero_grad()
            model(torch.randn(5, 3)).sum().backward()
            rec.record_gradients()
            optimizer.step()
            with torch.no_grad():
                model[2].weight.mul_(0.9)
            rec.finish_step()
    with open_recording(tmp_path, "t") as recording:
        assert recording.kinds("model.0.weight") == ["value"]
        assert recording.kinds("model.1.weight") == ["value", "grad", "update"]
        assert recording.kinds("model.2.weight") == ["value", "update"] and recording.kinds("model.2.bias") == ["value"]
        assert (recording.summary("model.2.weight", "update", "abs_max")[1] > 0).all()

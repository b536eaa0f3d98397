"""NeuralDbg on eager models: real training loops, unchanged, recorded through hooks and read back."""
from __future__ import annotations

import copy
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from comgra_ndbg import NeuralDbg, RecorderWarning, analyze, open_recording
from comgra_ndbg.errors import InvalidArgumentError
from comgra_ndbg.graph import GraphEdge
from comgra_ndbg.recorder.flight import FlightRecorder
from comgra_ndbg.stats.statistics import derive


def make_mlp(dropout: float = 0.0) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Dropout(dropout), nn.Linear(16, 3))


def batches(steps: int, batch: int = 8, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, 6, generator=g), torch.randint(0, 3, (batch,), generator=g)) for _ in range(steps)]


def train(model: nn.Module, data: list, optimizer: torch.optim.Optimizer, criterion: nn.Module) -> list[float]:
    """The unchanged training loop NeuralDbg is made for, exactly; returns the losses."""
    losses = []
    for inputs, targets in data:
        optimizer.zero_grad()
        loss = criterion(model(inputs), targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def no_recorder_warnings(caught: list[warnings.WarningMessage]) -> None:
    assert [str(w.message) for w in caught if issubclass(w.category, RecorderWarning)] == []


def hooks_left(*objects: object) -> list[str]:
    """Names of every hook dict that is not empty on the given modules (and their submodules), parameters
    and optimizers."""
    left = []
    for obj in objects:
        if isinstance(obj, nn.Module):
            for path, module in obj.named_modules():
                for attr in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks"):
                    if getattr(module, attr):
                        left.append(f"{path or '<root>'}.{attr}")
            for name, parameter in obj.named_parameters():
                if getattr(parameter, "_post_accumulate_grad_hooks", None) or parameter._backward_hooks:
                    left.append(f"{name} hooks")
        elif isinstance(obj, torch.optim.Optimizer):
            if obj._optimizer_step_post_hooks or obj._optimizer_step_pre_hooks:
                left.append("optimizer hooks")
    return left


def test_unchanged_loop_records_outputs_gradients_parameters_updates_and_the_graph(tmp_path: Path) -> None:
    model, criterion = make_mlp(), nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    data = batches(6)
    tanh_out, tanh_grad, weight_grad, weight_update = [], [], [], []

    def spy(module, args, output):  # the test's own hook, registered before NeuralDbg's
        tanh_out.append(output.detach().clone())
        output.register_hook(lambda g: tanh_grad.append(g.clone()))

    model[1].register_forward_hook(spy)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with NeuralDbg(model, tmp_path, trial="t", loss=criterion, detail="full") as dbg:  # every update complete
            losses = []
            for inputs, targets in data:
                before = model[0].weight.detach().clone()
                optimizer.zero_grad()
                loss = criterion(model(inputs), targets)
                loss.backward()
                weight_grad.append(model[0].weight.grad.clone())
                optimizer.step()
                weight_update.append(model[0].weight.detach() - before)
                losses.append(loss.item())
    no_recorder_warnings(caught)
    assert dbg.steps == 6
    with open_recording(tmp_path, "t") as rec:
        assert rec.steps.tolist() == list(range(6))
        assert set(rec.nodes) == {"input", "model.0", "model.1", "model.2", "model.3", "model", "target", "loss",
                                  "model.0.parameters", "model.3.parameters"}
        assert rec.kinds("model.1") == ["value", "grad"]
        assert rec.kinds("model.0.weight") == ["value", "grad", "update"]
        assert rec.roles["model"] == "output" and rec.roles["loss"] == "loss" and rec.roles["model.1"] == "intermediate"
        np.testing.assert_allclose(rec.kpi("loss")[1], losses, rtol=1e-6)
        for kind, expected in [("value", tanh_out), ("grad", tanh_grad)]:
            for stat, fn in [("mean", torch.mean), ("abs_max", lambda t: t.abs().max()), ("min", torch.min)]:
                np.testing.assert_allclose(rec.summary("model.1", kind, stat)[1], [float(fn(t)) for t in expected],
                                           rtol=1e-5, atol=1e-9)
        np.testing.assert_allclose(rec.summary("model.0.weight", "grad", "abs_max")[1],
                                   [float(g.abs().max()) for g in weight_grad], rtol=1e-6)
        np.testing.assert_allclose(rec.summary("model.0.weight", "update", "mean")[1],
                                   [float(u.mean()) for u in weight_update], rtol=1e-5, atol=1e-12)
        assert np.isfinite(rec.summary("model.1", "value", "saturated_fraction")[1]).all()  # tanh bounds known
        graph = rec.graph("train").graph
        assert graph.edges == tuple(sorted([
            GraphEdge("input", "model.0", "forward"), GraphEdge("model.0", "model.1", "forward"),
            GraphEdge("model.1", "model.2", "forward"), GraphEdge("model.2", "model.3", "forward"),
            GraphEdge("model.3", "model", "forward"), GraphEdge("model", "loss", "forward"),
            GraphEdge("target", "loss", "forward"), GraphEdge("model.0.parameters", "model.0", "forward"),
            GraphEdge("model.3.parameters", "model.3", "forward")]))


def test_recorded_run_ends_with_bit_identical_parameters(tmp_path: Path) -> None:
    """Dropout draws from the global RNG inside the model: any RNG use or side effect of the hooks shows."""
    results = []
    for recorded in (False, True):
        model, criterion = make_mlp(dropout=0.3), nn.CrossEntropyLoss()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        torch.manual_seed(5)
        if recorded:
            with NeuralDbg(model, tmp_path, trial="t", loss=criterion, optimizer=optimizer, snapshots=3):
                losses = train(model, batches(40), optimizer, criterion)
        else:
            losses = train(model, batches(40), optimizer, criterion)
        results.append((losses, [p.detach().clone() for p in model.parameters()], optimizer.state_dict()))
    (losses_a, params_a, state_a), (losses_b, params_b, state_b) = results
    assert losses_a == losses_b
    assert all(torch.equal(a, b) for a, b in zip(params_a, params_b))
    for key in state_a["state"]:
        assert all(torch.equal(state_a["state"][key][k], state_b["state"][key][k]) for k in ("exp_avg", "exp_avg_sq"))
    with open_recording(tmp_path, "t") as rec:
        assert len(rec.steps) == 40 and rec.snapshot_steps("model.1").tolist() == list(range(0, 40, 3))


def test_leaving_the_context_removes_every_hook_and_the_model_computes_as_before(tmp_path: Path) -> None:
    model, criterion = make_mlp(), nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert hooks_left(model, criterion, optimizer) == []
    with NeuralDbg(model, tmp_path, trial="t", loss=criterion, optimizer=optimizer) as dbg:
        assert hooks_left(model, criterion, optimizer) != []
        train(model, batches(3), optimizer, criterion)
    assert hooks_left(model, criterion, optimizer) == []
    dbg.close()  # idempotent
    twin = make_mlp()
    twin.load_state_dict(model.state_dict())
    model.zero_grad()
    x, y = batches(1, seed=9)[0]
    x_a, x_b = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    out_a, out_b = model(x_a), twin(x_b)
    criterion(out_a, y).backward()
    criterion(out_b, y).backward()
    assert torch.equal(out_a, out_b) and torch.equal(x_a.grad, x_b.grad)
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), twin.parameters()))
    with open_recording(tmp_path, "t") as rec:
        assert len(rec.steps) == 3  # the passes after leaving were not recorded


def test_gradient_accumulation_records_one_step_per_optimizer_step_with_an_iteration_per_pass(
        tmp_path: Path) -> None:
    model, criterion = make_mlp(), nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = batches(12)
    grads, micro_losses = [], []
    with NeuralDbg(model, tmp_path, trial="t", loss=criterion):
        for step in range(4):
            for inputs, targets in data[3 * step:3 * step + 3]:
                raw = criterion(model(inputs), targets)
                (raw / 3).backward()
                micro_losses.append(raw.item())  # the KPI is the criterion's value
            grads.append(model[3].weight.grad.clone())
            optimizer.step()
            optimizer.zero_grad()  # at the end of the step this time
    with open_recording(tmp_path, "t") as rec:
        assert rec.steps.tolist() == [0, 1, 2, 3]
        for iteration in range(3):
            steps, rows = rec.summary_rows("model.1", "value", iteration=iteration)
            assert steps.tolist() == [0, 1, 2, 3] and (rows[:, 0] == 8 * 16).all()
        assert rec.summary_rows("model.1", "value", iteration=3)[0].tolist() == []
        # the parameter gradient is the accumulated one the optimizer used
        np.testing.assert_allclose(rec.summary("model.3.weight", "grad", "abs_max")[1],
                                   [float(g.abs().max()) for g in grads], rtol=1e-6)
        # output gradients of all three passes are merged into the step's summary
        assert (rec.summary_rows("model.1", "grad")[1][:, 0] == 3 * 8 * 16).all()
        np.testing.assert_allclose(rec.kpi("loss")[1], np.mean(np.reshape(micro_losses, (4, 3)), axis=1), rtol=1e-6)


def test_evaluation_passes_are_not_recorded_and_do_not_split_steps(tmp_path: Path) -> None:
    model, criterion = make_mlp(), nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = batches(5)
    validation = torch.full((4, 6), 100.0)  # its values would show in the input's abs_max if recorded
    with NeuralDbg(model, tmp_path, trial="t", loss=criterion):
        for inputs, targets in data:
            optimizer.zero_grad()
            loss = criterion(model(inputs), targets)
            with torch.no_grad():
                criterion(model(validation), targets[:4])
            loss.backward()
            optimizer.step()
            model.eval()
            criterion(model(validation), targets[:4])  # eval mode with gradients enabled
            model.train()
            with torch.inference_mode():
                model(validation)
    with open_recording(tmp_path, "t") as rec:
        assert rec.steps.tolist() == [0, 1, 2, 3, 4]
        np.testing.assert_allclose(rec.summary("input", "value", "abs_max")[1],
                                   [float(x.abs().max()) for x, _ in data], rtol=1e-6)
        assert rec.summary_rows("model.1", "value", iteration=1)[0].tolist() == []


def test_skipped_optimizer_steps_still_end_the_step_when_gradients_are_cleared(tmp_path: Path) -> None:
    """Without optimizer=, a step whose optimizer.step() is skipped (e.g. a NaN guard) ends when the next
    pass finds the gradients cleared; with optimizer=, each step ends at optimizer.step()."""
    for exact in (False, True):
        model, criterion = make_mlp(), nn.CrossEntropyLoss()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with NeuralDbg(model, tmp_path, trial=f"t{exact}", loss=criterion,
                       optimizer=optimizer if exact else None) as dbg:
            for step, (inputs, targets) in enumerate(batches(6)):
                optimizer.zero_grad()
                loss = criterion(model(inputs), targets)
                loss.backward()
                if step % 2 == 0:
                    optimizer.step()
                    if exact:
                        assert dbg.recorder.current_step is None  # ended at the optimizer's post-hook
        with open_recording(tmp_path, f"t{exact}") as rec:
            assert rec.steps.tolist() == [0, 1, 2, 3, 4, 5]
            assert rec.summary_rows("model.1", "value", iteration=1)[0].tolist() == []
            updates = rec.summary("model.0.weight", "update", "abs_max")[1]
            assert (updates[0::2] > 0).all() and (updates[1::2] == 0).all()


def test_gradients_zeroed_in_place_at_the_top_of_the_loop_are_recorded_as_backward_left_them(
        tmp_path: Path) -> None:
    """``zero_grad(set_to_none=False)`` zeroes ``.grad`` before the next pass ends the step (no optimizer=):
    the step keeps the gradient of its backward pass, not the zeros found at its end."""
    model, criterion = make_mlp(), nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    norms = []
    with NeuralDbg(model, tmp_path, trial="t", loss=criterion):
        for inputs, targets in batches(5):
            optimizer.zero_grad(set_to_none=False)
            criterion(model(inputs), targets).backward()
            norms.append(float(model[0].weight.grad.norm()))
            optimizer.step()
    with open_recording(tmp_path, "t") as rec:
        steps, recorded = rec.summary("model.0.weight", "grad", "l2")
        assert steps.tolist() == [0, 1, 2, 3, 4]
        np.testing.assert_allclose(recorded, norms, rtol=1e-5)
        assert rec.summary("model.0.weight", "grad", "count")[1].tolist() == [96] * 5


def test_policies_skip_steps_but_the_loss_kpi_is_kept_for_every_step(tmp_path: Path) -> None:
    model, criterion = make_mlp(), nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with NeuralDbg(model, tmp_path, trial="t", loss=criterion, summaries=4, snapshots=None):
        losses = train(model, batches(10), optimizer, criterion)
    with open_recording(tmp_path, "t") as rec:
        assert rec.steps.tolist() == [0, 4, 8]
        assert rec.summary("model.1", "value", "mean")[0].tolist() == [0, 4, 8]
        assert rec.kpi("loss")[0].tolist() == list(range(10))
        np.testing.assert_allclose(rec.kpi("loss")[1], losses, rtol=1e-6)


def test_module_patterns_choose_the_recorded_modules(tmp_path: Path) -> None:
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.tanh(self.linear(x))

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), Block(), Block(), nn.Linear(8, 3))
    criterion, optimizer = nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.1)
    with NeuralDbg(model, tmp_path, trial="blocks", modules=["1", "2", nn.Linear]):
        train(model, batches(2), optimizer, criterion)
    with open_recording(tmp_path, "blocks") as rec:
        outputs = [t.name for t in rec.tensors if t.role in ("intermediate", "output")]
        assert outputs == ["model.0", "model.1.linear", "model.1", "model.2.linear", "model.2", "model.3", "model"]
        saturation = rec.summary("model.1", "value", "saturated_fraction")[1]  # a Block's output is a tanh
        assert np.isfinite(saturation).all()
        edges = rec.graph().graph.edges
        assert GraphEdge("model.1.linear", "model.1", "forward") in edges
        assert GraphEdge("model.1", "model.2.linear", "forward") in edges
    with pytest.raises(InvalidArgumentError, match="no module matches"):
        NeuralDbg(model, tmp_path, trial="none", modules=["decoder.*"])
    with pytest.raises(InvalidArgumentError, match="path patterns"):
        NeuralDbg(model, tmp_path, trial="bad", modules=[3])


def test_tuple_outputs_repeated_calls_and_integer_inputs(tmp_path: Path) -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(10, 8)
            self.lstm = nn.LSTM(8, 8, batch_first=True)
            self.shared = nn.Linear(8, 8)
            self.head = nn.Linear(8, 3)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            out, _ = self.lstm(self.embed(tokens))
            h = self.shared(self.shared(out[:, -1]).relu())
            return self.head(h)

    torch.manual_seed(0)
    model, criterion = Net(), nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(0)
    data = [(torch.randint(0, 10, (4, 5), generator=g), torch.randint(0, 3, (4,), generator=g)) for _ in range(3)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with NeuralDbg(model, tmp_path, trial="t", loss=criterion):
            train(model, data, optimizer, criterion)
    no_recorder_warnings(caught)
    with open_recording(tmp_path, "t") as rec:
        names = [t.name for t in rec.tensors if t.role != "parameter"]
        assert names == ["input", "model.embed", "model.lstm[0]", "model.lstm[1][0]", "model.lstm[1][1]",
                         "model.shared", "model.shared#1", "model.head", "model", "target", "loss"]
        # one node per call, both of module model.shared: calls around other modules would form a cycle
        assert [t.name for t in rec.tensors_of("model.shared")] == ["model.shared"]
        assert [(t.name, t.module) for t in rec.tensors_of("model.shared#1")] == [("model.shared#1", "model.shared")]
        assert rec.kinds("input") == ["value"]
        assert set(rec.kinds("model.shared#1")) == {"value", "grad"}
        edges = rec.graph().graph.edges
        assert {GraphEdge("model.lstm", "model.shared", "forward"),
                GraphEdge("model.shared", "model.shared#1", "forward"),
                GraphEdge("model.shared#1", "model.head", "forward"),
                GraphEdge("model.shared.parameters", "model.shared", "forward"),
                GraphEdge("model.shared.parameters", "model.shared#1", "forward")} <= set(edges)


def test_without_a_path_a_new_folder_under_runs_is_created_and_printed(tmp_path: Path, monkeypatch,
                                                                       capsys) -> None:
    monkeypatch.chdir(tmp_path)
    model, criterion = make_mlp(), nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with NeuralDbg(model) as dbg:
        train(model, batches(2), optimizer, criterion)
    printed = capsys.readouterr().out
    assert dbg.path.is_absolute() and dbg.path.parent == (tmp_path / "runs").resolve()
    assert dbg.path.name.startswith("ndbg-")
    assert printed.startswith(f"comgra_ndbg: recording to {dbg.path} (byte budget: ") and dbg.path.is_dir()
    assert printed.count("\n") == 1
    with open_recording(dbg.path) as rec:
        assert rec.steps.tolist() == [0, 1]


def test_flight_recorder_keeps_the_steps_before_a_non_finite_loss(tmp_path: Path) -> None:
    model, criterion = make_mlp(), nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = batches(12)
    data[9] = (torch.full((8, 6), float("nan")), data[9][1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with NeuralDbg(model, tmp_path, trial="t", loss=criterion, summaries=None, snapshots=None,
                       flight_recorder=FlightRecorder(steps=3, after=1)):
            train(model, data, optimizer, criterion)
    with open_recording(tmp_path, "t") as rec:
        assert rec.triggers[0].step == 9
        assert rec.steps.tolist() == [6, 7, 8, 9, 10]
        assert derive(rec.summary_rows("model.0", "value")[1])["nonfinite_fraction"].tolist() == [0, 0, 0, 1, 1]


def test_disabled_instance_adds_no_hook_and_writes_nothing(tmp_path: Path) -> None:
    model, criterion = make_mlp(), nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with NeuralDbg(model, tmp_path, loss=criterion, optimizer=optimizer, enabled=False) as dbg:
        assert hooks_left(model, criterion, optimizer) == []
        train(model, batches(2), optimizer, criterion)
    assert dbg.path is None and dbg.steps == 0 and list(tmp_path.iterdir()) == []


def test_a_run_that_recorded_no_step_says_why_when_it_closes(tmp_path: Path) -> None:
    model, criterion = make_mlp(), nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.warns(RecorderWarning, match=r"no training step.*never ran its forward\(\).*wrap the module the loop"):
        with NeuralDbg(model[0], tmp_path, trial="part") as dbg:  # the loop calls the whole model
            train(model[1:], [(torch.tanh(torch.randn(8, 16)), torch.randint(0, 3, (8,)))], optimizer, criterion)
    assert dbg.steps == 0
    with pytest.warns(RecorderWarning, match=r"no training step: the model's 2 forward pass\(es\) ran without grad"):
        with NeuralDbg(model, tmp_path, trial="eval") as dbg:
            model.eval()
            model(torch.randn(8, 6))
            model.train()
            with torch.no_grad():
                model(torch.randn(8, 6))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with NeuralDbg(model, tmp_path, trial="trained", loss=criterion) as dbg:
            train(model, batches(2), optimizer, criterion)
    assert dbg.steps == 2
    no_recorder_warnings(caught)


def test_bad_arguments_say_what_to_pass(tmp_path: Path) -> None:
    model = make_mlp()
    with pytest.raises(InvalidArgumentError, match="torch.nn.Module"):
        NeuralDbg(lambda x: x, tmp_path)
    with pytest.raises(InvalidArgumentError, match="criterion module"):
        NeuralDbg(model, tmp_path, loss=torch.nn.functional.cross_entropy)
    with pytest.raises(InvalidArgumentError, match="Optimizer"):
        NeuralDbg(model, tmp_path, optimizer=object())


def test_a_failing_recording_never_breaks_training(tmp_path: Path) -> None:
    """A module whose output cannot be recorded warns once per part, with the counts at close (every
    occurrence is in the problems log); training and the other modules go on."""
    model, criterion = make_mlp(), nn.CrossEntropyLoss()
    twin = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    twin_optimizer = torch.optim.SGD(twin.parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with NeuralDbg(model, tmp_path, trial="t", loss=criterion) as dbg:
            dbg.recorder.register_tensor = None  # every registration now raises TypeError inside the hooks
            train(model, batches(3), optimizer, criterion)
    messages = [str(w.message) for w in caught if issubclass(w.category, RecorderWarning)]
    first, recurring = [m for m in messages if "recurred" not in m], [m for m in messages if "recurred" in m]
    assert first and all("training continues" in m for m in first)
    assert len(recurring) == 1 and "'starting a forward pass' (recorder_error) 3 times, steps 0–2" in recurring[0]
    with open_recording(tmp_path, "t") as recording:
        assert {p.subject for p in recording.problems()} == {"starting a forward pass", "recording the loss"}
    train(twin, batches(3), twin_optimizer, criterion)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), twin.parameters()))


def test_query_methods_run_the_analysis_on_the_recording(tmp_path: Path) -> None:
    model, criterion = make_mlp(), nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = batches(40)
    data[30] = (torch.full((8, 6), float("nan")), data[30][1])  # corrupt data: non-finite from step 30 on
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with NeuralDbg(model, tmp_path, trial="t", loss=criterion) as dbg:
            train(model, data[:20], optimizer, criterion)
            live = dbg.diagnose()  # inside the block: what was recorded so far
            train(model, data[20:], optimizer, criterion)
    assert live.num_steps == 19  # step 19 ends when the next pass shows the optimizer stepped
    diagnosis = analyze(dbg.path, store=False)
    hypotheses = dbg.get_causal_hypotheses()
    assert hypotheses and repr(hypotheses) == repr(diagnosis.hypotheses)  # repr: evidence holds NaN, NaN != NaN
    top = hypotheses[0]
    assert (top.type, top.origin, top.node, top.onset) == ("nonfinite_data", "data", "input", 30)
    assert str(dbg.explain_failure()) == diagnosis.explain() and dbg.explain_failure()[0] == top.sentence
    assert repr(dbg.trace_causal_chain("nonfinite_data")) == repr(top.chain)
    assert repr(dbg.trace_causal_chain("nonfinite_data_at_step_30")) == repr(top.chain)  # longer names match
    assert dbg.trace_causal_chain("vanishing_gradients") is None
    assert repr(dbg.events) == repr(diagnosis.events)
    assert any(e.family == "nonfinite" and e.node == "model.0" and e.onset == 30 for e in dbg.events)
    assert repr(dbg.detect_coupled_failures()) == repr(diagnosis.coupled)
    with pytest.raises(InvalidArgumentError, match="failure types are"):
        dbg.trace_causal_chain("bad_vibes")
    with open_recording(tmp_path, "t") as rec:
        assert rec.analysis() is not None  # stored for the GUI

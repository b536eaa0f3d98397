"""Breakpoints and hooks inside a real training loop recorded by NeuralDbg: what fires when, what the action
sees, what the hooks receive, and that the user's exceptions reach the loop with the recording intact."""
from __future__ import annotations

import os
import pty
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from comgra_ndbg import NeuralDbg, open_recording
from comgra_ndbg.errors import BreakpointHit, InvalidArgumentError, UnknownModuleError, UnknownSeriesError
from comgra_ndbg.instrument.breakpoints import LayerCall, StepSummaries
from comgra_ndbg.instrument.conditions import parse_condition, statistic_of

STEPS = 6


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs that grow with the step, so a threshold on a layer's output is crossed part-way."""
    g = torch.Generator().manual_seed(step)
    return torch.randn(16, 4, generator=g) * (step + 1), torch.randint(0, 2, (16,), generator=g)


def train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int = STEPS, *, nan_at: int | None = None,
          loss_scale: dict[int, float] | None = None) -> list[float]:
    losses = []
    for step in range(steps):
        x, y = batch(step)
        if step == nan_at:
            x[0, 0] = float("nan")
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y) * (loss_scale or {}).get(step, 1.0)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def capture_outputs(module: nn.Module) -> list[torch.Tensor]:
    """Every output of ``module``, from a forward hook of the test's own (independent of NeuralDbg)."""
    seen: list[torch.Tensor] = []
    module.register_forward_hook(lambda m, a, out: seen.append(out))
    return seen


def test_a_forward_breakpoint_calls_back_exactly_where_its_condition_holds(tmp_path: Path) -> None:
    model = mlp()
    outputs = capture_outputs(model[0])
    calls: list[LayerCall] = []
    with NeuralDbg(model, tmp_path, trial="t") as dbg:
        point = dbg.break_at("0", when="abs_max > 5", action=calls.append)
        train(model, torch.optim.SGD(model.parameters(), lr=0.01))
    expected = [step for step, out in enumerate(outputs) if out.abs().max().item() > 5]
    assert 0 < len(expected) < STEPS  # the threshold is crossed part-way
    assert [c.step for c in calls] == expected and point.hits == len(expected)
    for call in calls:
        assert call.output is outputs[call.step] and call.module is model[0] and call.at == "forward"
        assert (call.path, call.node, call.grad) == ("0", "model.0", None)
        assert torch.equal(call.inputs[0], batch(call.step)[0]) and call.reason.startswith("model.0: abs_max ")
        assert float(call.reason.split()[2]) == pytest.approx(outputs[call.step].abs().max().item(), rel=5e-3)


def test_a_nonfinite_forward_breakpoint_raises_with_what_the_module_saw_and_the_recording_stays_intact(
        tmp_path: Path) -> None:
    model = mlp()
    with pytest.raises(BreakpointHit) as caught:
        with NeuralDbg(model, tmp_path, trial="t") as dbg:
            dbg.break_at("model.0", when="nonfinite", action="raise")
            train(model, torch.optim.SGD(model.parameters(), lr=0.01), nan_at=3)
    hit = caught.value
    assert (hit.module, hit.path, hit.step, hit.at) == (model[0], "0", 3, "forward")
    assert torch.isnan(hit.inputs[0][0, 0]) and torch.isnan(hit.output[0]).all() and hit.grad is None
    assert "breakpoint at 'model.0' (forward, when 'nonfinite') hit in step 3" in str(hit)
    with open_recording(tmp_path, "t") as recording:
        assert recording.is_complete and recording.steps.tolist() == [0, 1, 2, 3]
        steps, nans = recording.summary("model.0", "value", "nan")
        assert steps.tolist() == [0, 1, 2, 3] and nans.tolist() == [0, 0, 0, 8]  # recorded before the raise
        steps, updates = recording.summary("model.0.weight", "update", "l2")
        assert steps.tolist() == [0, 1, 2, 3] and (updates[:3] > 0).all() and updates[3] == 0  # no update in step 3


def test_a_backward_breakpoint_sees_the_gradient_and_raises_out_of_backward(tmp_path: Path) -> None:
    model = mlp()
    outputs = capture_outputs(model[1])
    grads: dict[int, torch.Tensor] = {}

    def keep_grad(module: nn.Module, args: tuple, out: torch.Tensor) -> None:
        out.register_hook(lambda g, step=len(outputs) - 1: grads.setdefault(step, g))

    model[1].register_forward_hook(keep_grad)
    calls: list[LayerCall] = []
    with NeuralDbg(model, tmp_path, trial="cb") as dbg:
        dbg.break_at("1", when="abs_max > 1", at="backward", action=calls.append)
        train(model, torch.optim.SGD(model.parameters(), lr=0.0), loss_scale={2: 1e4, 4: 1e4})
    assert [c.step for c in calls] == [2, 4]
    for call in calls:
        assert call.at == "backward" and torch.equal(call.grad, grads[call.step])
        assert call.output is outputs[call.step] and call.reason.startswith("gradient of model.1: abs_max ")

    model = mlp()
    with pytest.raises(BreakpointHit) as caught:
        with NeuralDbg(model, tmp_path, trial="raise") as dbg:
            dbg.break_at("1", when=lambda g: bool(g.abs().max() > 1), at="backward", action="raise")
            train(model, torch.optim.SGD(model.parameters(), lr=0.0), loss_scale={3: 1e4})
    hit = caught.value
    assert (hit.step, hit.at, hit.module, hit.path) == (3, "backward", model[1], "1") and hit.grad.abs().max() > 1
    with open_recording(tmp_path, "raise") as recording:
        assert recording.steps.tolist() == [0, 1, 2, 3]


def test_conditions_follow_the_grammar_and_compute_what_numpy_computes() -> None:
    t = torch.tensor([[1.0, -2.0, 0.0], [3.0, 0.5, -0.25]])
    a = t.numpy()
    assert statistic_of(t, "abs_max") == 3.0 and statistic_of(t, "zero_fraction") == pytest.approx(1 / 6)
    assert statistic_of(t, "mean") == pytest.approx(a.mean()) and statistic_of(t, "std") == pytest.approx(a.std())
    assert statistic_of(t, "l2") == pytest.approx(np.sqrt((a ** 2).sum()))
    assert parse_condition("std < 2").check(t) == f"std {a.std():.3g} < 2"
    assert parse_condition(" min<=-2 ").check(t) == "min -2 <= -2" and parse_condition("max != 3").check(t) is None
    assert parse_condition("always").check(t) == "always" and parse_condition("nonfinite").check(t) is None
    assert parse_condition("mean > -inf").check(torch.tensor([float("nan")])) is None  # NaN compares false
    assert parse_condition(lambda x: x.sum() > 0).check(t) == "<lambda> is true"
    with pytest.raises(InvalidArgumentError, match=r"did you mean 'abs_max'.*statistics are \['abs_max'"):
        parse_condition("abs_maxx > 1e3")
    with pytest.raises(InvalidArgumentError, match="cannot read condition 'abs_max >> 1'.*'abs_max > 1e3'"):
        parse_condition("abs_max >> 1")
    with pytest.raises(InvalidArgumentError, match="compares with 'lots', which is not a number"):
        parse_condition("abs_max > lots")
    with pytest.raises(InvalidArgumentError, match="when= takes a str or a function"):
        parse_condition(3)


def test_bad_breakpoints_and_hooks_are_refused_with_close_matches(tmp_path: Path) -> None:
    model = nn.Sequential()
    model.add_module("blocks", nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2)))
    with NeuralDbg(model, tmp_path, trial="t") as dbg:
        with pytest.raises(UnknownModuleError, match=r"no module 'blocks\.7'; did you mean .*'blocks\.1'"):
            dbg.break_at("blocks.7")
        with pytest.raises(UnknownModuleError, match="not part of the model"):
            dbg.break_at(nn.Linear(2, 2))
        with pytest.raises(InvalidArgumentError, match="at= is 'forward'.*or 'backward'"):
            dbg.break_at("blocks.0", at="sideways")
        with pytest.raises(InvalidArgumentError, match="action= is 'pdb', 'raise' or a function"):
            dbg.break_at("blocks.0", action="print")
        with pytest.raises(InvalidArgumentError, match="did you mean 'after_step'"):
            dbg.on("after_stpe", print)
        assert [p.paths for p in (dbg.break_at("blocks.*"), dbg.break_at(model.blocks[2]))] == [
            ("blocks.0", "blocks.1", "blocks.2"), ("blocks.2",)]
        for point in dbg.breakpoints:
            point.remove()
        assert dbg.breakpoints == ()
        model(torch.randn(3, 2)).sum().backward()  # no breakpoint left to fire


def test_step_through_pauses_after_each_layer_of_training_passes_only(tmp_path: Path) -> None:
    model = mlp()
    seen: list[tuple[int, str]] = []
    with NeuralDbg(model, tmp_path, trial="t") as dbg:
        point = dbg.step_through(lambda call: seen.append((call.step, call.node)))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        train(model, optimizer, 2)
        with torch.no_grad():
            model(batch(0)[0])  # an evaluation pass fires nothing
        point.remove()
        train(model, optimizer, 1)
    assert seen == [(s, f"model.{i}") for s in (0, 1) for i in range(3)] and point.hits == 6


def test_hooks_receive_the_recorded_summaries_in_order(tmp_path: Path) -> None:
    model = mlp()
    outputs = capture_outputs(model[0])
    events: list[str] = []
    layer_stats: list[dict[str, float]] = []
    step_infos: list[StepSummaries] = []

    def after_layer(call: LayerCall) -> None:
        events.append(f"layer {call.step} {call.node}")
        if call.path == "0":
            layer_stats.append(call.summaries["model.0"])

    with NeuralDbg(model, tmp_path, trial="t") as dbg:
        dbg.on("before_step", lambda step: events.append(f"before {step}"))
        dbg.on("after_layer", after_layer)
        dbg.on("after_step", lambda info: (events.append(f"after {info.step}"), step_infos.append(info)))
        losses = train(model, torch.optim.SGD(model.parameters(), lr=0.1), 3)
    assert events == [e for s in range(3) for e in
                      [f"before {s}", f"layer {s} model.0", f"layer {s} model.1", f"layer {s} model.2", f"after {s}"]]
    for step, stats in enumerate(layer_stats):
        assert stats["abs_max"] == pytest.approx(outputs[step].abs().max().item(), rel=1e-6)
        assert stats["mean"] == pytest.approx(outputs[step].mean().item(), rel=1e-5, abs=1e-7)
    with open_recording(tmp_path, "t") as recording:
        for info in step_infos:
            for name, kind in [("model.0", "value"), ("model.2", "grad"), ("model.0.weight", "update")]:
                steps, values = recording.summary(name, kind, "rms")
                assert info.stat(name, "rms", kind) == pytest.approx(values[steps.tolist().index(info.step)])
            assert info.kpis["loss"] == pytest.approx(losses[info.step])
            assert info.summaries[("model.1", "value")]["std"] == info.stat("model.1", "std")
    with pytest.raises(UnknownSeriesError, match="no summary 'rms' of 'model.9'"):
        step_infos[0].stat("model.9", "rms")


def test_an_after_step_hook_gets_the_kpis_of_every_step_and_says_which_steps_were_summarised(
        tmp_path: Path) -> None:
    model = mlp()
    infos: list[StepSummaries] = []
    with NeuralDbg(model, tmp_path, trial="t", summaries=3) as dbg:
        dbg.on("after_step", infos.append)
        losses = train(model, torch.optim.SGD(model.parameters(), lr=0.1), 5)
    assert [(i.step, i.recorded) for i in infos] == [(0, True), (1, False), (2, False), (3, True), (4, False)]
    assert [i.kpis["loss"] for i in infos] == pytest.approx(losses, rel=1e-6)  # KPIs are recorded every step
    assert infos[3].stat("model.0", "count") == 16 * 8
    with pytest.raises(UnknownSeriesError, match="step 1 has no summaries: the summary policy skipped it; check "
                                                 "info.recorded first"):
        infos[1].stat("model.0", "abs_max")


def test_a_failing_user_hook_propagates_as_is_and_the_recording_stays_intact(tmp_path: Path) -> None:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    error = ValueError("the user's own bug")

    def after_step(info: StepSummaries) -> None:
        if info.step == 1:
            raise error

    raised_at = []
    with NeuralDbg(model, tmp_path, trial="t") as dbg:
        dbg.on("after_step", after_step)
        for step in range(4):
            x, y = batch(step)
            optimizer.zero_grad()
            try:
                out = model(x)
            except ValueError as caught:  # the loop decides to go on
                assert caught is error
                raised_at.append(step)
                out = model(x)
            nn.functional.cross_entropy(out, y).backward()
            optimizer.step()
    assert raised_at == [2]  # step 1's hook runs before step 2's forward pass
    with open_recording(tmp_path, "t") as recording:
        assert recording.steps.tolist() == [0, 1, 2, 3] and recording.step_iterations.tolist() == [1, 1, 1, 1]
        assert recording.summary("model.0.weight", "update", "l2")[0].tolist() == [0, 1, 2, 3]

    model = mlp()
    with pytest.raises(RuntimeError, match="layer hook failed"):
        with NeuralDbg(model, tmp_path, trial="u") as dbg:
            dbg.on("after_layer", lambda call: (_ for _ in ()).throw(RuntimeError("layer hook failed"))
                   if call.step == 2 and call.path == "2" else None)
            train(model, torch.optim.SGD(model.parameters(), lr=0.01))
    with open_recording(tmp_path, "u") as recording:
        assert recording.is_complete and recording.steps.tolist() == [0, 1, 2]
        assert recording.summary("model.2", "value", "count")[1].tolist() == [32.0, 32.0, 32.0]


def test_a_disabled_neuraldbg_checks_breakpoints_but_never_fires(tmp_path: Path) -> None:
    model = mlp()
    calls: list[LayerCall] = []
    with NeuralDbg(model, tmp_path, trial="off", enabled=False) as dbg:
        point = dbg.break_at("0", action=calls.append)
        with pytest.raises(UnknownModuleError):
            dbg.break_at("9")
        train(model, torch.optim.SGD(model.parameters(), lr=0.01), 2)
    assert calls == [] and point.hits == 0 and not (tmp_path / "off").exists()


def test_the_pdb_action_opens_the_debugger_with_the_module_output_and_step_in_scope(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import torch
        from torch import nn
        from comgra_ndbg import NeuralDbg
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with NeuralDbg(model, {str(tmp_path)!r}, trial="pdb") as dbg:
            dbg.break_at("1", when="abs_max > 0", action="pdb")
            for step in range(2):
                optimizer.zero_grad()
                model(torch.randn(3, 4)).sum().backward()
                optimizer.step()
        print("training finished")
    """)
    done = subprocess.run([sys.executable, "-c", script], input="p ('STEP', step)\np tuple(output.shape)\n"
                          "p type(module).__name__\nc\np ('STEP', step)\nc\n", capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "breakpoint at 'model.1' (forward) in step 0: model.1: abs_max" in out
    assert "('STEP', 0)" in out and "(3, 8)" in out and "'Tanh'" in out and "('STEP', 1)" in out
    assert out.rstrip().endswith("training finished")


def breaking_script(folder: Path, trial: str, shown: str) -> str:
    """A script that trains one step of a small model under NeuralDbg with a breakpoint that fires and no
    action given, printing ``BreakpointHit`` and the expressions ``shown`` of the hit when one is raised."""
    return textwrap.dedent(f"""
        import torch
        from torch import nn
        from comgra_ndbg import NeuralDbg
        from comgra_ndbg.errors import BreakpointHit
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
        try:
            with NeuralDbg(model, {str(folder)!r}, trial={trial!r}, overwrite=True) as dbg:
                dbg.break_at("0", when="abs_max > 0")
                model(torch.randn(3, 4)).sum().backward()
        except BreakpointHit as hit:
            print("BreakpointHit", {shown})
        print("done")
    """)


def test_without_an_action_a_terminal_gets_the_debugger_and_a_batch_job_gets_breakpoint_hit(tmp_path: Path) -> None:
    script = breaking_script(tmp_path, "default", 'hit.path, hit.step, type(hit.module).__name__')
    piped = subprocess.run([sys.executable, "-c", script], stdin=subprocess.PIPE, capture_output=True, text=True,
                           timeout=120)
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout.splitlines() == ["BreakpointHit 0 0 Linear", "done"]
    leader, follower = pty.openpty()  # stdin a terminal, as when a person runs the script
    try:
        os.write(leader, b"p ('IN SCOPE', step, type(module).__name__, tuple(output.shape), len(inputs))\nc\n")
        typed = subprocess.run([sys.executable, "-c", script], stdin=follower, capture_output=True, text=True,
                               timeout=120)
    finally:
        os.close(leader)
        os.close(follower)
    assert typed.returncode == 0, typed.stderr
    assert "breakpoint at 'model.0' (forward) in step 0" in typed.stdout
    assert "('IN SCOPE', 0, 'Linear', (3, 8), 1)" in typed.stdout and "BreakpointHit" not in typed.stdout
    assert typed.stdout.rstrip().endswith("done")


def test_in_a_jupyter_kernel_the_default_is_the_debugger_when_the_frontend_takes_input(tmp_path: Path) -> None:
    pytest.importorskip("ipykernel")
    manager = pytest.importorskip("jupyter_client.manager")
    code = breaking_script(tmp_path, "kernel", "hit.path")
    root = str(Path(__file__).resolve().parents[1])
    kernel, client = manager.start_new_kernel(kernel_name="python3", cwd=root,
                                              env={**os.environ, "PYTHONPATH": root})
    try:
        shown: dict[bool, str] = {}
        for allow_stdin in (True, False):  # a notebook open in Jupyter; one run by nbclient or papermill
            typed = iter(["p ('IN SCOPE', step, type(module).__name__, tuple(output.shape))", "c"])
            text: list[str] = []
            reply = client.execute_interactive(
                code, allow_stdin=allow_stdin, timeout=120, stdin_hook=lambda msg: client.input(next(typed)),
                output_hook=lambda msg: text.append(msg["content"].get("text", "")))
            assert reply["content"]["status"] == "ok", reply["content"]
            shown[allow_stdin] = "".join(text)
    finally:
        client.stop_channels()
        kernel.shutdown_kernel(now=True)
    assert "breakpoint at 'model.0' (forward) in step 0" in shown[True]
    assert "('IN SCOPE', 0, 'Linear', (3, 8))" in shown[True] and "BreakpointHit" not in shown[True]
    assert shown[True].rstrip().endswith("done")
    assert shown[False] == "BreakpointHit 0\ndone\n"


def test_breakpoints_fire_inside_a_compiled_model_as_in_eager(tmp_path: Path) -> None:
    torch.compiler.reset()
    seen: dict[str, list[tuple[int, str]]] = {}
    for how in ("eager", "compiled"):
        model = mlp()
        run = model if how == "eager" else torch.compile(model, backend="eager")
        calls = seen.setdefault(how, [])
        with NeuralDbg(run, tmp_path, trial=how) as dbg:
            dbg.break_at("0", when="abs_max > 5", action=lambda call, calls=calls: calls.append((call.step, call.at)))
            dbg.break_at("2", at="backward", action=lambda call, calls=calls: calls.append((call.step, call.at)))
            train(run, torch.optim.SGD(model.parameters(), lr=0.01))
        with open_recording(tmp_path, how) as recording:
            assert recording.steps.tolist() == list(range(STEPS)) and "model.2" in recording.nodes
    assert seen["compiled"] == seen["eager"]
    assert [s for s, at in seen["eager"] if at == "forward"] == [3, 4, 5]
    assert [s for s, at in seen["eager"] if at == "backward"] == list(range(STEPS))

"""NeuralDbg's per-step parts in the recorder's C++ part (``recorder/native``) against their Python forms: the
watch on the output's backward passes (and its fallback under compiled autograd), the flags of a module
output, the gradients each optimizer step consumed (the stale-gradient check); a tensor registered under
two names, summarised once; and the recorder's gradients under compiled autograd, which calls none of them."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from comgra_ndbg import NeuralDbg, Recorder, open_recording
from comgra_ndbg.instrument import loop_rules
from comgra_ndbg.instrument.consumed import ConsumedGradients
from comgra_ndbg.recorder import native, registration
from tests.test_native_taps import _assert_same, _datasets



def test_output_flags_tell_python_nodes_and_saved_tensor_hooks_as_torch_does(taps_module) -> None:
    x = torch.ones(3, requires_grad=True)
    y = x * 2

    class Double(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            return a * 2

        @staticmethod
        def backward(ctx, grad):
            return grad * 2

    assert [taps_module.output_flags(t) for t in (y, x, torch.ones(2))] == [0, 0, 0]
    assert taps_module.output_flags(Double.apply(x)) == 1
    seen = []

    def inner(a: torch.Tensor) -> torch.Tensor:
        seen.append((taps_module.output_flags(a) & 2 == 2,
                     torch._C._autograd._top_saved_tensors_default_hooks(False) is not None))
        return a.sin()

    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        inner(y)
    torch.utils.checkpoint.checkpoint(inner, y, use_reentrant=False)
    torch.utils.checkpoint.checkpoint(inner, y, use_reentrant=True)
    inner(y)
    assert seen == [(True, True), (True, True), (False, False), (False, False)]


def test_the_consumed_gradients_tables_agree_on_every_kind_of_change(taps_module) -> None:
    params = [nn.Parameter(torch.ones(2)), nn.Parameter(torch.ones(3)), nn.Parameter(torch.ones(1))]
    tables = [taps_module.Consumed(3), ConsumedGradients(3)]
    answers: list[list] = [[], []]

    def step(held: list[int]) -> None:
        for table, out in zip(tables, answers):
            with_grad, grown = table.consume(params, held)
            out.append((with_grad, sorted(grown), [table.version_if(i, p.grad) for i, p in enumerate(params)]))

    for p in params:
        p.grad = torch.ones_like(p)
    step([0, 1, 2])
    params[0].grad.add_(1.0)  # accumulated onto: grown
    params[1].grad = torch.zeros(3)  # a new tensor: not grown
    params[2].grad = None  # none: not counted
    step([0, 1, 2])
    params[1].grad.zero_()  # changed in place: grown
    step([1])  # only the held ones are looked at
    step([0, 1, 2])
    for table in tables:
        table.forget()
    step([0, 1])
    assert answers[0] == answers[1]
    assert [a[:2] for a in answers[0]] == [(3, []), (2, [0]), (1, [1]), (2, []), (2, [])]
    with pytest.raises(IndexError):
        tables[0].consume(params, [3])


def test_the_backward_watch_calls_once_per_pass_until_reset(taps_module) -> None:
    calls = []
    watch = taps_module.BackwardWatch(lambda: calls.append(torch._C._current_graph_task_id()))
    x = torch.ones(2, requires_grad=True)
    assert not watch.arm(x)  # a leaf: nothing produced it
    y = (x * 3).tanh()
    assert watch.arm(y) and watch.arm(y)  # two hooks on one node: still one call per pass
    y.sum().backward(retain_graph=True)
    assert len(calls) == 1 and calls[0] != -1  # inside the pass, at its end
    y.sum().backward(retain_graph=True)
    assert len(calls) == 2
    x.grad = None
    (x * 2).sum().backward()  # a pass that does not reach the output
    assert len(calls) == 2
    watch.reset()
    y.sum().backward()
    assert len(calls) == 2 and not watch.take_compiled()


def _stale_run(folder: Path) -> list[str]:
    """Steps that clear the gradients, then steps that forget to, then steps that zero them in place."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    with NeuralDbg(net, folder, trial="t", optimizer=opt, snapshots=None, detail="full"):
        for step in range(12):
            if step < 3:
                opt.zero_grad()
            elif step >= 7:
                for p in net.parameters():
                    if p.grad is not None:
                        p.grad.zero_()
            x, y = torch.randn(5, 4, generator=g), torch.randint(0, 3, (5,), generator=g)
            nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
    with open_recording(folder, "t") as recording:
        return [row.message for row in recording.log(loop_rules.CATEGORY)]


def test_stale_gradients_are_found_alike_with_and_without_the_module(tmp_path: Path, taps_module, monkeypatch) -> None:
    with_module = _stale_run(tmp_path / "native")
    monkeypatch.setattr(native, "taps_module", lambda: None)
    without = _stale_run(tmp_path / "python")
    assert with_module == without
    assert sum("zero_grad() is not called" in m for m in with_module) == 1, with_module
    _assert_same(*(_datasets(tmp_path / kind / "t" / "recording.h5") for kind in ("native", "python")))


def _loss_steps(folder: Path, compiled: bool) -> tuple[list[int], np.ndarray]:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x, y = torch.randn(6, 3), torch.randint(0, 2, (6,))
    with NeuralDbg(net, folder, trial="t", optimizer=opt, snapshots=None, detail="full"):
        for step in range(4):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(net(x), y)
            if compiled and step != 2:  # (an eager pass between: the watch's own callback again)
                from torch._dynamo import compiled_autograd
                with compiled_autograd._enable(torch.compile(backend="eager")):
                    loss.backward()
            else:
                loss.backward()
            opt.step()
    with open_recording(folder, "t") as recording:
        steps, values = recording.kpi("loss")
    return steps.tolist(), values


@pytest.mark.slow
@pytest.mark.parametrize("with_module", [True, False])
def test_neuraldbg_finds_the_steps_under_compiled_autograd_which_calls_no_watch(tmp_path: Path, taps_module,
                                                                                monkeypatch, with_module) -> None:
    """Compiled autograd calls no C++ hook and refuses the Python hook's engine callback (unless the whole
    backward is one graph): the end of its passes is read where the backward call returns."""
    pytest.importorskip("torch._dynamo.compiled_autograd")
    if not with_module:
        monkeypatch.setattr(native, "taps_module", lambda: None)
    eager_steps, eager_losses = _loss_steps(tmp_path / "eager", compiled=False)
    assert eager_steps == [0, 1, 2, 3]
    steps, losses = _loss_steps(tmp_path / "compiled", compiled=True)
    assert steps == eager_steps
    np.testing.assert_allclose(losses, eager_losses, rtol=1e-5)



def _recorder_gradients(folder: Path, compiled_from: int | None, in_hook: bool) -> tuple[list[str], dict[str, tuple]]:
    """An explicit Recorder's gradient means of the registered tensors and a parameter over 4 steps, the backward
    passes from step ``compiled_from`` on under compiled autograd (None: all eager), the parameters' gradients
    handed over by hooks when ``in_hook``; and the recording's problems."""
    import warnings
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(3)
    rec = Recorder(folder, "t", summaries=1, snapshots=None)
    rec.track_module("net", net, gradients_in_hook=in_hook)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(4):
            rec.start_step(step)
            x, y = torch.randn(6, 3, generator=g), torch.randint(0, 2, (6,), generator=g)
            h = rec.register_tensor("h", net[1](net[0](x)))
            out = rec.register_tensor("out", net[2](h), role="output")
            loss = rec.register_tensor("loss", nn.functional.cross_entropy(out, y), role="loss")
            opt.zero_grad()
            if compiled_from is not None and step >= compiled_from:
                from torch._dynamo import compiled_autograd
                with compiled_autograd._enable(torch.compile(backend="eager")):
                    loss.backward()
            else:
                loss.backward()
            rec.record_gradients()
            opt.step()
            rec.finish_step()
        rec.close()
    assert not [w for w in caught if "Dynamo" in str(w.message)], [str(w.message)[:200] for w in caught]
    with open_recording(folder, "t") as recording:
        means = {name: tuple(np.asarray(a).tolist() for a in recording.summary(name, "grad", "mean"))
                 for name in ("h", "out", "loss", "net.0.weight")}
        problems = [str(p) for p in recording.problems()]
    return problems, means


@pytest.mark.slow
@pytest.mark.parametrize("with_module, in_hook", [(True, False), (False, False), (True, True)])
def test_recorder_gradients_under_compiled_autograd_are_recorded_as_in_eager_passes(tmp_path: Path, taps_module,
                                                                                      monkeypatch, with_module,
                                                                                      in_hook) -> None:
    """Compiled autograd takes no engine callback for the pass's end and would trace the recorder's Python
    hooks with dynamo: they run untraced and summarise their gradient at once. With the C++ part, whose taps
    and parameter marks compiled autograd does not call, the first compiled pass's gradients are missing
    (warned), the next ones are recorded through Python hooks; parameters' gradients handed over by hooks
    (``gradients_in_hook``) are recorded from the first."""
    pytest.importorskip("torch._dynamo.compiled_autograd")
    if not with_module:
        monkeypatch.setattr(native, "taps_module", lambda: None)
    _, eager = _recorder_gradients(tmp_path / "eager", None, in_hook)
    problems, compiled = _recorder_gradients(tmp_path / "compiled", 1, in_hook)
    assert not [p for p in problems if "skipped" in p or "queue_callback" in p], problems
    for name in ("h", "out", "loss", "net.0.weight"):
        handed = name == "net.0.weight" and in_hook  # a Python hook from the start
        recorded = [0, 2, 3] if with_module and not handed else [0, 1, 2, 3]  # step 1's taps and marks: not called
        steps, means = compiled[name]
        assert steps == recorded, (name, steps)
        expected = dict(zip(*eager[name]))
        np.testing.assert_allclose(means, [expected[s] for s in steps], rtol=1e-5, atol=1e-9)


class _Twice(nn.Module):
    """A model whose output is its head's output (NeuralDbg registers it as ``model`` and ``model.head``),
    or, with ``scale``, that output changed in place after the head returned it."""

    def __init__(self, scale: float | None = None) -> None:
        super().__init__()
        self.body, self.head, self.scale = nn.Linear(4, 6), nn.Linear(6, 3), scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.head(torch.tanh(self.body(x)))
        return out.mul_(self.scale) if self.scale is not None else out


def _twice_run(folder: Path, scale: float | None) -> None:
    torch.manual_seed(0)
    net = _Twice(scale)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    with NeuralDbg(net, folder, trial="t", optimizer=opt, snapshots=4, detail="full"):
        for _ in range(9):
            opt.zero_grad()
            x, y = torch.randn(5, 4, generator=g), torch.randint(0, 3, (5,), generator=g)
            nn.functional.cross_entropy(net(x), y).backward()
            opt.step()


@pytest.mark.parametrize("scale", [None, 2.0])
def test_a_model_output_that_is_its_heads_is_summarised_once_and_recorded_twice(tmp_path: Path, taps_module,
                                                                                monkeypatch, scale) -> None:
    again = []
    original = registration.TensorRegistration._register_again
    monkeypatch.setattr(registration.TensorRegistration, "_register_again",
                        lambda self, name, *rest: (again.append(name), original(self, name, *rest)))
    _twice_run(tmp_path / "once", scale)
    monkeypatch.setattr(registration, "same_summary", lambda plan, other: False)
    _twice_run(tmp_path / "twice", scale)
    _assert_same(*(_datasets(tmp_path / kind / "t" / "recording.h5") for kind in ("once", "twice")))
    if scale is None:
        assert set(again) == {"model"} and 4 <= len(again) < 9  # summary steps after the first; not snapshot steps
    else:
        assert again == []  # changed in place after the head returned it: summarised again
    with open_recording(tmp_path / "once", "t") as recording:
        for kind in ("value", "grad"):
            _, model = recording.summary("model", kind, "mean")
            _, head = recording.summary("model.head", kind, "mean")
            if scale is None:
                np.testing.assert_array_equal(model, head)
            elif kind == "value":
                np.testing.assert_allclose(model, 2.0 * head, rtol=1e-5)


def test_a_tensor_registered_under_two_names_gets_its_own_rows_after_an_in_place_change(tmp_path: Path) -> None:
    lin = nn.Linear(3, 4)
    x = torch.randn(5, 3)
    with Recorder(tmp_path, trial="t", snapshots=None) as rec:
        for step in range(4):
            with rec.step(step):
                h = torch.tanh(lin(x))
                rec.register_tensor("h", h)
                rec.register_tensor("same", h)
                h2 = lin(x) * 1.0
                rec.register_tensor("before", h2)
                h2.add_(1.0)
                rec.register_tensor("after", h2)
                (h.sum() + h2.sum()).backward()
    with open_recording(tmp_path, "t") as recording:
        for kind in ("value", "grad"):
            np.testing.assert_array_equal(recording.summary("h", kind, "mean")[1],
                                          recording.summary("same", kind, "mean")[1])
        before, after = (recording.summary(name, "value", "mean")[1] for name in ("before", "after"))
        np.testing.assert_allclose(after, before + 1.0, rtol=1e-5)


def _sets_run(folder: Path) -> int:
    """An explicit loop registering one tensor under two names, with two gradient sets per step, a second
    iteration at odd steps and snapshots every third step; returns how many registrations shared rows."""
    torch.manual_seed(0)
    lin, aux = nn.Linear(3, 4), nn.Linear(4, 2)
    g = torch.Generator().manual_seed(1)
    shared = 0
    with Recorder(folder, trial="t", snapshots=3) as rec:
        rec.track_module("lin", lin)
        for step in range(6):
            with rec.step(step):
                x = torch.randn(5, 3, generator=g)
                for iteration in range(1 + step % 2):
                    if step % 2:
                        rec.start_iteration()
                    h = torch.tanh(lin(x))
                    rec.register_tensor("h", h)
                    before = len(rec._value_keys)
                    rec.register_tensor("same", h)
                    shared += rec._value_keys[-1][2] == rec._value_keys[before - 1][2]
                    if iteration == 0:
                        loss = h.pow(2).mean()
                        rec.register_tensor("loss", loss, role="loss")
                        loss.backward(retain_graph=True)
                        rec.record_gradients("main")
                        aux(h).sum().backward()
                        rec.record_gradients("aux")
                    else:
                        h.sum().backward()
                        rec.record_gradients("second")
                    if step % 2:
                        rec.finish_iteration()
    return shared


def test_shared_rows_follow_gradient_sets_iterations_and_snapshot_steps(tmp_path: Path, taps_module,
                                                                         monkeypatch) -> None:
    assert _sets_run(tmp_path / "shared") >= 2  # where both names take their plans (not at snapshot steps)
    monkeypatch.setattr(registration, "same_summary", lambda plan, other: False)
    assert _sets_run(tmp_path / "computed") == 0
    _assert_same(*(_datasets(tmp_path / kind / "t" / "recording.h5") for kind in ("shared", "computed")))
    with open_recording(tmp_path / "shared", "t") as recording:
        assert {"grad:main", "grad:aux"} <= set(recording.kinds("same"))

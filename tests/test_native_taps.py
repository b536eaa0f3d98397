"""The recorder's C++ gradient taps and parameter marks (``comgra_ndbg.recorder.native``) against its Python
hooks: the same recording, byte for byte but the wall-clock times, on loops that use what the taps hand over
to the Python side (snapshots, two gradient sets, a second backward pass into one set, a leaf, an unused
parameter, a gradient scale); taps of a graph kept across steps removed at each step's end; a failed build
recorded and the Python hooks kept."""
from __future__ import annotations

import shutil
import threading
import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from torch import nn

from comgra_ndbg import NeuralDbg, Recorder, open_recording
from comgra_ndbg.instrument import loop_rules
from comgra_ndbg.recorder import native
from comgra_ndbg.stats import backend

class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(6, 8)
        self.b = nn.Linear(8, 8)
        self.head = nn.Linear(8, 3)
        self.aux = nn.Linear(8, 2)
        self.unused = nn.Linear(8, 8)  # never in the forward pass: its parameters get no gradient


def _record(folder: Path, steps: int = 8) -> dict[str, int]:
    """A loop that needs every hand-over of the taps; returns how many taps and marks the run armed."""
    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    used = {"taps": 0, "marks": 0}
    with Recorder(folder, trial="t", summaries=1, snapshots=3) as rec:
        rec.track_module("net", net)
        for step in range(steps):
            x = torch.randn(5, 6, generator=g, requires_grad=step % 2 == 0)  # a leaf: a Python hook
            y = torch.randint(0, 3, (5,), generator=g)
            with rec.step(step):
                rec.register_tensor("x", x, role="input")
                rec.register_tensor("y", y, role="target")  # integers: the plan's view reads a float64 copy
                rec.register_tensor("picked", y == 1)
                h = torch.tanh(net.a(x))
                rec.register_tensor("h", h)
                k = torch.relu(net.b(h))
                rec.register_tensor("k", k)
                logits = net.head(k)
                rec.register_tensor("logits", logits, role="output")
                loss = nn.functional.cross_entropy(logits, y)
                aux = net.aux(k).pow(2).mean()
                rec.register_tensor("loss", loss, role="loss")
                rec.register_tensor("aux", aux)
                if rec._taps is not None:
                    used["taps"] = max(used["taps"], rec._taps.armed())
                if rec._parameters._marks is not None:
                    used["marks"] = max(used["marks"], rec._parameters._marks.watched())
                opt.zero_grad()
                if step % 4 == 3:  # two gradient sets, the second one of two passes into the same tensor
                    loss.backward(retain_graph=True)
                    rec.record_gradients("main")
                    (0.5 * aux).backward(retain_graph=True)
                    (0.25 * aux).backward()
                    rec.record_gradients("aux")
                else:
                    (loss + 0.1 * aux).backward()
                    rec.record_gradients()
                opt.step()
                rec.record_kpi("loss", loss)
    return used


def _datasets(path: Path) -> dict[str, object]:
    out: dict[str, object] = {}
    with h5py.File(path) as f:
        def visit(name: str, item: object) -> None:
            if isinstance(item, h5py.Dataset) and name not in ("steps/time", "log/time"):
                out[name] = item[()]
        f.visititems(visit)
    return out


def _assert_same(a: dict[str, object], b: dict[str, object]) -> None:
    assert sorted(a) == sorted(b)
    for name, value in a.items():
        other = b[name]
        if isinstance(value, np.ndarray) and value.dtype.names:
            for field in value.dtype.names:
                np.testing.assert_array_equal(value[field], other[field], err_msg=f"{name}/{field}")
        elif isinstance(value, np.ndarray):
            np.testing.assert_array_equal(value, other, err_msg=name)
        else:
            assert value == other, name


def test_the_taps_record_what_the_python_hooks_record(tmp_path: Path, taps_module, monkeypatch) -> None:
    used = _record(tmp_path / "taps")
    assert used["taps"] >= 5 and used["marks"] == 10  # h, k, logits, loss, aux; 5 modules' weights and biases
    monkeypatch.setattr(native, "taps_module", lambda: None)
    assert _record(tmp_path / "hooks") == {"taps": 0, "marks": 0}
    taps, hooks = (_datasets(tmp_path / kind / "t" / "recording.h5") for kind in ("taps", "hooks"))
    _assert_same(taps, hooks)
    with open_recording(tmp_path / "taps", "t") as recording:
        assert "grad" not in recording.kinds("net.unused.weight")  # no gradient: no gradient row
        assert {"grad:main", "grad:aux"} <= set(recording.kinds("k"))


def _neuraldbg_run(folder: Path) -> int:
    """A NeuralDbg loop whose parameter gradients are polled: two backward passes accumulated per step, clipping
    (``.grad`` changed in place before the optimizer reads it), a frozen layer, snapshots every third step;
    returns how many parameters the C++ poller watched."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))
    net[2].requires_grad_(False)
    opt = torch.optim.SGD([p for p in net.parameters() if p.requires_grad], lr=0.05)
    g = torch.Generator().manual_seed(1)
    with NeuralDbg(net, folder, trial="t", optimizer=opt, snapshots=3, detail="full") as dbg:
        for step in range(7):
            opt.zero_grad()
            for _ in range(2):
                x, y = torch.randn(5, 6, generator=g), torch.randint(0, 3, (5,), generator=g)
                nn.functional.cross_entropy(net(x), y).backward()
            if step % 2:
                torch.nn.utils.clip_grad_norm_(net.parameters(), 0.1)
            opt.step()
        poller = dbg.recorder._parameters._poller
        return 0 if poller is None else poller.watched()


def test_neuraldbg_polls_with_the_module_what_it_polls_without(tmp_path: Path, taps_module, monkeypatch) -> None:
    assert _neuraldbg_run(tmp_path / "native") == 6  # three layers' weights and biases, the frozen one included
    monkeypatch.setattr(native, "taps_module", lambda: None)
    assert _neuraldbg_run(tmp_path / "python") == 0
    _assert_same(*(_datasets(tmp_path / kind / "t" / "recording.h5") for kind in ("native", "python")))
    with open_recording(tmp_path / "native", "t") as recording:
        assert "grad" not in recording.kinds("model.2.weight")  # frozen: no gradient row
        steps, norms = recording.summary("model.4.weight", "grad", "l2")
        assert len(steps) == 7 and np.isfinite(norms).all()


class _Branching(Net):
    """``Net`` as one model: ``aux`` is reached when ``use_aux`` is set, ``unused`` never."""

    use_aux = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = torch.relu(self.b(torch.tanh(self.a(x))))
        out = self.head(k)
        return out + self.aux(k).mean() if self.use_aux else out


def _invariants_run(folder: Path) -> list[str]:
    """A NeuralDbg loop whose optimizer leaves out a layer the forward pass never reaches (no gradient: no
    omission) and one it reaches at odd steps (an omission); returns the loop-invariant messages."""
    torch.manual_seed(0)
    net = _Branching()
    opt = torch.optim.SGD([*net.a.parameters(), *net.b.parameters(), *net.head.parameters()], lr=0.05)
    g = torch.Generator().manual_seed(1)
    with NeuralDbg(net, folder, trial="t", optimizer=opt, snapshots=None, detail="full"):
        for step in range(6):
            x, y = torch.randn(5, 6, generator=g), torch.randint(0, 3, (5,), generator=g)
            net.use_aux = step % 2 == 1
            opt.zero_grad()
            nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
    with open_recording(folder, "t") as recording:
        return [row.message for row in recording.log(loop_rules.CATEGORY)]


def test_neuraldbg_checks_the_same_invariants_with_the_module_as_without(tmp_path: Path, taps_module,
                                                                          monkeypatch) -> None:
    """The step detection's gradient fingerprints come from C++ with the module: the invariants that compare them
    (which parameters received a gradient in a step) must read the same."""
    native_messages = _invariants_run(tmp_path / "native")
    monkeypatch.setattr(native, "taps_module", lambda: None)
    python_messages = _invariants_run(tmp_path / "python")
    assert native_messages == python_messages
    assert any("aux" in m for m in native_messages)  # reached, not in the optimizer: reported
    assert not any("unused" in m for m in native_messages)  # never reached: no gradient, nothing to report
    _assert_same(*(_datasets(tmp_path / kind / "t" / "recording.h5") for kind in ("native", "python")))


def test_a_gradient_scale_is_divided_out_of_tapped_gradients(tmp_path: Path, taps_module, monkeypatch) -> None:
    def run(folder: Path) -> None:
        torch.manual_seed(0)
        w = torch.randn(4, 3, requires_grad=True)
        with Recorder(folder, trial="t", snapshots=None) as rec:
            for step in range(3):
                rec.gradient_scale = 1024.0
                with rec.step(step):
                    h = torch.tanh(w * 2)
                    rec.register_tensor("h", h)
                    (h.sum() * 1024.0).backward()
                    rec.record_gradients()
    run(tmp_path / "taps")
    monkeypatch.setattr(native, "taps_module", lambda: None)
    run(tmp_path / "hooks")
    _assert_same(*(_datasets(tmp_path / kind / "t" / "recording.h5") for kind in ("taps", "hooks")))


def test_taps_leave_a_graph_kept_across_steps_when_their_step_ends(tmp_path: Path, taps_module) -> None:
    w = torch.randn(3, 4, requires_grad=True)
    shared = torch.sin(w)  # computed once: its node outlives every step
    with Recorder(tmp_path, trial="t", snapshots=None) as rec:
        for step in range(4):
            with rec.step(step):
                rec.register_tensor("shared", shared)
                assert rec._taps.armed() == 1
                (shared * (step + 1)).sum().backward(retain_graph=True)
                rec.record_gradients()
            assert rec._taps.armed() == 0
    with open_recording(tmp_path, "t") as recording:
        steps, means = recording.summary("shared", "grad", "mean")
    # each step's gradient once (step + 1 everywhere), not the earlier steps' taps firing again
    assert steps.tolist() == [0, 1, 2, 3]
    np.testing.assert_allclose(means, [1.0, 2.0, 3.0, 4.0])


def test_a_build_that_fails_is_recorded_and_the_python_hooks_stay(tmp_path: Path, monkeypatch) -> None:
    broken = tmp_path / "taps.cpp"
    broken.write_text("this is not C++\n")
    monkeypatch.setattr(native, "_SOURCE", broken)
    monkeypatch.setattr(native, "_MODULE", [None])
    monkeypatch.setattr(native, "_STARTED", [False])
    monkeypatch.setattr(native, "_ERROR", [None])
    monkeypatch.setenv("COMGRA_NDBG_NATIVE", "wait")
    monkeypatch.setattr(backend, "folder", lambda: tmp_path / "cache" / "kernels-x")
    with pytest.warns(RuntimeWarning, match="keeps its Python gradient hooks"):
        assert native.taps_module() is None
    failed = list((tmp_path / "cache").glob("native-*.failed"))
    assert len(failed) == 1 and "the build exited with" in failed[0].read_text()
    assert "the build exited with" in native.build_error()
    assert native.taps_module() is None  # not tried again in this process
    monkeypatch.setattr(native, "_STARTED", [False])
    with pytest.warns(RuntimeWarning, match="an earlier build failed"):  # nor by another: the record stands
        assert native.taps_module() is None
    w = torch.randn(3, requires_grad=True)
    with Recorder(tmp_path / "rec", trial="t", snapshots=None) as rec:
        with rec.step(0):
            h = w * 2
            rec.register_tensor("h", h)
            h.sum().backward()
            rec.record_gradients()
        assert rec._taps is None
    with open_recording(tmp_path / "rec", "t") as recording:
        assert recording.summary("h", "grad", "mean")[1].tolist() == [1.0]


def test_the_mode_must_be_one_of_three(monkeypatch) -> None:
    monkeypatch.setenv("COMGRA_NDBG_NATIVE", "sometimes")
    with pytest.raises(ValueError, match="auto, wait or off"):
        native.mode()


def test_taps_hand_the_gradients_of_one_pass_over_at_its_end(taps_module) -> None:
    ended, started = [], []
    taps = taps_module.Taps(lambda: started.append(len(ended)), lambda: ended.append(taps.pending()))
    x = torch.ones(3, requires_grad=True)
    y = x * 2
    z = y.sin()
    assert taps.tap(y, 0) and taps.tap(z, 1)
    assert not taps.tap(x, 2)  # a leaf has no node to tap
    z.sum().backward()
    assert started == [0] and ended == [2]
    indices, grads, versions = taps.take()
    assert indices == [1, 0]  # in the order the pass reached them
    torch.testing.assert_close(grads[0], torch.ones(3))
    torch.testing.assert_close(grads[1], torch.cos(torch.full((3,), 2.0)))
    assert versions == [g._version for g in grads]
    taps.reset()
    assert taps.armed() == 0 and taps.pending() == 0


def test_pack_gives_the_kernels_addresses_of_lean_host_arrays_of_one_dtype(taps_module) -> None:
    addresses, sizes = np.zeros(3, np.int64), np.zeros(3, np.int64)
    a, b = torch.ones(2, 3), torch.zeros(4)
    assert taps_module.pack([a, b], addresses, sizes) == 0
    assert addresses[:2].tolist() == [a.data_ptr(), b.data_ptr()] and sizes[:2].tolist() == [6, 4]
    assert taps_module.pack([a.double()], addresses, sizes) == 1
    view = torch.arange(10.0)[2:5]  # an offset view: its own first element's address
    assert taps_module.pack([view], addresses, sizes) == 0 and addresses[0] == view.data_ptr() and sizes[0] == 3
    refused = {"several dtypes": [a, b.double()], "not contiguous": [a.t()], "empty": [torch.zeros(0)],
               "a negative view": [torch.ones(3)._neg_view()], "integers": [torch.arange(3)], "none": [],
               "half precision": [a.half()], "sparse": [torch.eye(3).to_sparse()]}
    for why, tensors in refused.items():
        assert taps_module.pack(tensors, addresses, sizes) == -1, why
    assert taps_module.pack([a] * 4, addresses, sizes) == -2  # more tensors than the arrays hold
    for wrong in (np.zeros(3, np.int32), np.zeros((3, 1), np.int64), np.zeros(6, np.int64)[::2]):
        with pytest.raises(TypeError, match="int64 array"):
            taps_module.pack([a], wrong, sizes)


class _Twice(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # noqa: ANN001, ANN205 - torch's signature
        return x * 2

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001, ANN205
        return grad * 2


def test_a_plans_host_view_reads_only_tensors_of_its_signature(taps_module) -> None:
    lin = nn.Linear(4, 3)
    x = torch.randn(5, 4)
    view = taps_module.HostView(torch.tanh(lin(x)), 5)
    h = torch.tanh(lin(x))
    host = view.view(h)
    assert host.shape == (5, 3) and host.dtype == np.float32
    np.testing.assert_array_equal(host, h.detach().numpy())
    with torch.no_grad():
        h.zero_()  # the array is the tensor's memory, not a copy
    assert not host.any()
    refused = {"another node": torch.sigmoid(lin(x)), "no node": torch.tanh(lin(x)).detach(),
               "no gradient": torch.tanh(lin(x).detach()), "another shape": torch.tanh(lin(torch.randn(6, 4))),
               "another dtype": torch.tanh(lin.double()(x.double())), "not a tensor": 5,
               "strided": torch.tanh(torch.randn(3, 5, requires_grad=True)).t()}
    lin.float()
    for why, tensor in refused.items():
        assert view.view(tensor) is None, why
    batchless = taps_module.HostView(torch.ones(2, 3), 0)
    assert batchless.view(torch.ones(2, 3)).shape == (1, 6)
    targets = taps_module.HostView(torch.tensor([3, 1, 2]), 3)
    converted = targets.view(torch.tensor([7, 0, 2 ** 40]))
    assert converted.dtype == np.float64 and converted.tolist() == [[7.0], [0.0], [float(2 ** 40)]]
    assert taps_module.HostView(torch.tensor([True, False]), 0).view(torch.tensor([False, True])).tolist() == [[0, 1]]
    for why, example in {"a Python autograd node": _Twice.apply(torch.ones(3, requires_grad=True)),
                         "half precision": torch.ones(3).half(), "strided": torch.ones(3, 2).t(),
                         "empty": torch.zeros(0)}.items():
        assert not taps_module.HostView(example, 0).usable(), why


def test_layout_says_whether_tensors_stayed_where_they_were(taps_module) -> None:
    params = [nn.Parameter(torch.randn(3, 4)), nn.Parameter(torch.randn(4))]
    layout = taps_module.Layout(params)
    assert layout.same(params) and layout.same(list(params))
    assert not layout.same(params[:1])
    moved = {"new storage": lambda p: setattr(p, "data", p.data.clone()),
             "reshaped in place": lambda p: setattr(p, "data", p.data.view(4, 3)),
             "re-strided": lambda p: setattr(p, "data", p.data.t()),
             "cast": lambda p: setattr(p, "data", p.data.double())}
    for why, move in moved.items():
        param = nn.Parameter(torch.randn(3, 4))
        before = taps_module.Layout([param])
        move(param)
        assert not before.same([param]), why
    with torch.no_grad():
        params[0].mul_(2)  # an in-place change keeps the layout (the version counter tells updates apart)
    assert layout.same(params)


def test_taps_take_packed_checks_each_gradient_and_fills_the_arrays(taps_module) -> None:
    taps = taps_module.Taps(lambda: None, lambda: None)
    arrays = tuple(np.zeros(4, np.int64) for _ in range(3))
    x = torch.ones(5, 3, requires_grad=True)
    c = torch.randn(5, 3)  # (a plain sum's gradient would be an expanded view, which no kernel reads in place)
    y, z = x * 2, x.sin()
    assert taps.tap(y, 0, True) and taps.tap(z, 1, False)
    ((y + z) * c).sum().backward()
    indices, grads, versions, code = taps.take_packed(*arrays)
    assert code == 0 and len(indices) == 2
    batched = {0: 5, 1: 0}  # the batched tensor's batch size, nothing for the other
    assert arrays[0][:2].tolist() == [g.data_ptr() for g in grads]
    assert arrays[1][:2].tolist() == [15, 15] and arrays[2][:2].tolist() == [batched[i] for i in indices]
    taps.reset()
    y, z = x * 2, x.sin()
    taps.tap(y, 0, True)
    taps.tap(z, 1, True)
    ((y + z) * c).sum().backward()
    assert taps.take_packed(*(array[:1] for array in arrays))[3] == -2  # no room for both
    y = x * 3
    taps.tap(y, 0, True)
    y.sum().backward()
    assert taps.take_packed(*arrays)[3] == -1  # an expanded gradient
    y2 = x * 4
    taps.tap(y2, 1, True)
    kept: list[torch.Tensor] = []
    y2.register_hook(lambda grad: kept.append(grad))
    (y2 * c).sum().backward()
    kept[0].add_(1)  # changed in place after its tap kept it
    indices, grads, versions, code = taps.take_packed(*arrays)
    assert code == -1 and grads[0]._version != versions[0]
    taps.reset()


def test_marks_take_packed_reads_grad_first_and_then_what_each_pass_added(taps_module) -> None:
    w, b, unused = (nn.Parameter(torch.randn(3)) for _ in range(3))
    marks = taps_module.Marks()
    assert all(marks.watch(p, i) for i, p in enumerate((w, b, unused)))
    arrays = (np.zeros(3, np.int64), np.zeros(3, np.int64))
    (w * 2 + b).sum().backward()  # (.grad of a leaf is a contiguous copy of an expanded gradient)
    fresh, grads, code = marks.take_packed(*arrays)
    assert fresh == [0, 1] and code == 0
    assert grads[0] is not None and grads[0].data_ptr() == w.grad.data_ptr() and arrays[0][1] == b.grad.data_ptr()
    (w * 3).sum().backward()  # a later pass of the step: its own gradient, not the accumulated .grad
    fresh, grads, code = marks.take_packed(*arrays)
    assert fresh == [0] and code == 0
    torch.testing.assert_close(grads[0], torch.full((3,), 3.0))
    torch.testing.assert_close(w.grad, torch.full((3,), 5.0))
    assert marks.take_packed(*arrays)[:2] == ([], [])
    marks.forget()  # a new step: the first take reads .grad again
    (b * 4).sum().backward()
    fresh, grads, code = marks.take_packed(*arrays)
    assert fresh == [1] and grads[0].data_ptr() == b.grad.data_ptr()
    marks.unwatch()


@pytest.mark.slow
def test_compiled_autograd_runs_and_the_recorder_goes_back_to_python_hooks(tmp_path: Path, taps_module) -> None:
    compiled_autograd = pytest.importorskip("torch._dynamo.compiled_autograd")
    torch.manual_seed(0)
    lin = nn.Linear(3, 4)
    x = torch.randn(2, 3)
    with Recorder(tmp_path, trial="t", snapshots=None) as rec:
        rec.track_module("lin", lin)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for step in range(3):
                with rec.step(step):
                    h = torch.tanh(lin(x))
                    rec.register_tensor("h", h)
                    with compiled_autograd._enable(torch.compile(backend="eager")):
                        h.sum().backward()  # C++ hooks without compiled_args would fail this pass
                    rec.record_gradients()
                assert rec._taps_compiled  # from the end of the first step on
        assert rec._parameters._marks is None and rec._parameters._marks_compiled  # from the second step's start
    messages = [str(w.message) for w in caught]
    assert sum("ran under compiled autograd" in m for m in messages) == 1, messages
    torch.testing.assert_close(lin.weight.grad, 3 * (1 - torch.tanh(lin(x)).pow(2)).T @ x, rtol=1e-5, atol=1e-6)
    with open_recording(tmp_path, "t") as recording:
        steps, _ = recording.summary("lin.weight", "grad", "count")
    assert steps.tolist() == [1, 2]  # the marks' step is lost; the Python hooks record the next steps


def test_auto_builds_in_the_background_while_the_python_hooks_record(tmp_path: Path, monkeypatch, taps_module) -> None:
    built = native._module_file(native._folder())
    monkeypatch.setattr(backend, "folder", lambda: tmp_path / "cache" / "kernels-x")
    monkeypatch.setattr(native, "_MODULE", [None])
    monkeypatch.setattr(native, "_STARTED", [False])
    monkeypatch.setattr(native, "_ERROR", [None])
    monkeypatch.setattr(native, "_WAITING", [None])
    monkeypatch.setattr(native, "CHECK_SECONDS", 0.0)
    monkeypatch.setenv("COMGRA_NDBG_NATIVE", "auto")
    release = threading.Event()
    launched = []

    def compile_when_released(scratch: Path, name: str) -> None:  # the build, held until the test lets it finish
        assert release.wait(60)
        shutil.copy(built, scratch / built.name)

    def launch(where: Path) -> None:  # the builder process, as a thread here
        launched.append(threading.Thread(target=native._build, args=(where,)))
        launched[-1].start()

    monkeypatch.setattr(native, "_compile", compile_when_released)
    monkeypatch.setattr(native, "_launch", launch)
    assert native.taps_module() is None  # the build started on its own
    w = torch.randn(3, requires_grad=True)
    with Recorder(tmp_path / "rec", trial="t", snapshots=None) as rec:
        for step in range(3):
            if step == 2:
                release.set()
                launched[0].join(60)
            with rec.step(step):
                h = w * 2
                rec.register_tensor("h", h)
                assert (rec._taps is not None) == (step == 2)  # taken up at the first registration after the build
                (h * (step + 1)).sum().backward()
                rec.record_gradients()
    assert len(launched) == 1 and native.taps_module() is not None and native.build_error() is None
    assert len(list((tmp_path / "cache").glob("native-*/*.so"))) == 1
    with open_recording(tmp_path / "rec", "t") as recording:
        assert recording.summary("h", "grad", "mean")[1].tolist() == [1.0, 2.0, 3.0]


def test_the_background_build_is_a_process_that_outlives_its_starter(tmp_path: Path, taps_module) -> None:
    """``python -m comgra_ndbg.recorder.native.build`` finds the module built (the suite's) and exits 0 at once;
    a cache where the build failed before exits 1 without building."""
    import os
    import subprocess
    import sys

    root = str(Path(native.__file__).resolve().parents[3])
    env = dict(os.environ, PYTHONPATH=root)
    done = subprocess.run([sys.executable, "-m", "comgra_ndbg.recorder.native.build"], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    folder = tmp_path / "cache"
    folder.mkdir()
    failed = folder / (native._folder().name + ".failed")
    failed.write_text("the build exited with 1: no compiler\n")
    env["COMGRA_NDBG_CACHE_DIR"] = str(folder)
    done = subprocess.run([sys.executable, "-m", "comgra_ndbg.recorder.native.build"], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 1 and "an earlier build failed" in done.stderr

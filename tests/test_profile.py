"""Per-layer profiling recorded into real HDF5 recordings by real (tiny) training runs: figures that add up
against the step's wall time, exact FLOPs and saved bytes, the CUDA path on fake events, and profiling off
installing nothing."""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch
from torch import nn

from comgra_ndbg import NeuralDbg, Recorder, open_recording
from comgra_ndbg.errors import InvalidArgumentError, RecorderWarning, UnknownSeriesError
from comgra_ndbg.recorder.policy import StepList
from comgra_ndbg.recorder.profile_config import EventClock, ProfileConfig
from comgra_ndbg.recorder.profiler import ModuleProfiler
from comgra_ndbg.store import schema

F = schema.PROFILE_FIELD


def train(rec: Recorder, model: nn.Module, steps: int, *, batch: int = 3, width: int = 7) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(steps):
        with rec.step(step):
            optimizer.zero_grad()
            model(torch.randn(batch, width)).square().mean().backward()
            optimizer.step()


def test_a_linear_layer_counts_2_b_in_out_flops_and_keeps_its_input_for_backward(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(7, 5), nn.ReLU())
    with Recorder(tmp_path, "t", profile=ProfileConfig(steps=True)) as rec:
        rec.profile_module("model", model)
        train(rec, model, 3)
    with open_recording(tmp_path) as recording:
        profile = recording.profile()
    assert profile.modules == ("model", "model.0", "model.1") and profile.steps.tolist() == [0, 1, 2]
    flops = profile.field("flops")
    assert flops[1].tolist() == [0.0, 2 * 3 * 7 * 5, 0.0]  # FLOPs on the second step only; ReLU and the root: none
    assert np.isnan(flops[[0, 2]]).all()
    assert np.isnan(profile.field("forward_time")[1]).all()  # the counting step's times are left out
    # Linear keeps its input (3·7 float32), ReLU its output (3·5); the weight is no activation memory
    assert profile.field("saved_bytes").tolist() == [[0.0, 84.0, 60.0]] * 3
    assert (profile.field("calls") == 1).all()
    assert np.isnan(profile.field("allocated_delta")).all()  # no allocator statistics on the host
    backward = profile.field("backward_time")[[0, 2]]
    assert (backward[:, 1:] > 0).all() and (backward[:, 0] == 0).all()  # the root's own forward made no node


def test_per_module_times_add_up_to_the_forward_pass_and_most_of_the_step(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.Tanh(), nn.Linear(512, 512), nn.Tanh(), nn.Linear(512, 64))
    with Recorder(tmp_path, "t", profile=ProfileConfig(steps=True, flops=False)) as rec:
        rec.profile_module("model", model)
        train(rec, model, 6, batch=512, width=256)
    with open_recording(tmp_path) as recording:
        profile = recording.profile()
    assert profile.steps.tolist() == profile.process_steps.tolist() == list(range(6))
    forward, backward = profile.field("forward_time"), profile.field("backward_time")
    inclusive = profile.field("forward_inclusive")
    np.testing.assert_allclose(forward.sum(axis=1), inclusive[:, 0], rtol=1e-9)  # exclusive times partition the root
    step_time = profile.process_field("step_time")
    total = forward.sum(axis=1) + backward.sum(axis=1)
    assert (total <= step_time).all(), (total, step_time)
    shares = (total / step_time)[1:]  # step 0 pays one-off costs (allocations, first kernels)
    assert np.median(shares) > 0.7, shares  # about 0.9 here: the rest is zero_grad, the optimizer, the loss
    assert (profile.process_field("rss") > 2**20).all() and (profile.process_field("profiled") == 1).all()


def test_the_default_policy_profiles_the_first_steps_then_backs_off(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(7, 5))
    with Recorder(tmp_path, "t", profile=True) as rec:
        rec.profile_module("model", model)
        train(rec, model, 40)
    with open_recording(tmp_path) as recording:
        profile = recording.profile()
    assert profile.steps.tolist() == [0, 1, 2, 15, 38]  # FirstN(3) | PerTypeBackoff(10, factor=1.5)
    assert profile.process_steps.tolist() == list(range(40))  # memory: every step
    assert profile.process_field("profiled").sum() == 5


def test_neuraldbg_profiles_its_model_and_analyze_names_the_hot_layer(tmp_path: Path) -> None:
    from comgra_ndbg.analysis import analyze

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1024), nn.Tanh(), nn.Linear(1024, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with NeuralDbg(model, tmp_path, trial="t", profile=ProfileConfig(steps=True, flops=False)) as dbg:
        for _ in range(8):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(torch.randn(256, 8)), torch.randint(0, 2, (256,))).backward()
            optimizer.step()
        assert dbg.steps == 8
    with open_recording(tmp_path, "t") as recording:
        profile = recording.profile()
        assert set(profile.modules) == {"model"} | {f"model.{i}" for i in range(5)}
        assert len(profile.steps) == 8
        diagnosis = analyze(recording, store=False)
    memory_note = next(n for n in diagnosis.notes if n.startswith("Hot layers (activation memory)"))
    assert "model.3" in memory_note  # Tanh keeps its 256×1024 output, the largest activation
    assert not any(h.type == "memory_leak" for h in diagnosis.hypotheses)


def test_profiling_off_installs_nothing_and_writes_no_profile(tmp_path: Path) -> None:
    def hooks(model: nn.Module) -> int:
        return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())

    model = nn.Sequential(nn.Linear(7, 5), nn.ReLU())
    with pytest.warns(RecorderWarning, match="no training step"):
        with NeuralDbg(model, tmp_path, trial="off"):
            without = hooks(model)
        with NeuralDbg(model, tmp_path, trial="on", profile=True):
            with_profile = hooks(model)
    assert with_profile == without + 2 * 3  # a pre-hook and a hook per module, only when asked for
    assert hooks(model) == 0
    with Recorder(tmp_path, "plain") as rec:
        rec.profile_module("model", model)  # no profile=: nothing to do
        assert hooks(model) == 0
        train(rec, model, 2)
    with open_recording(tmp_path, "plain") as recording:
        assert recording.profile().is_empty
        with h5py.File(recording.files[0], "r") as f:
            assert int(f.attrs[schema.ATTR_FORMAT_VERSION]) == 4 and f[schema.PROFILE_STEP].shape == (0,)


def test_bad_profile_arguments_raise_typed_errors_that_say_what_to_pass(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="ProfileConfig"):
        Recorder(tmp_path, "a", profile="yes")
    with pytest.raises(InvalidArgumentError, match="memory_every"):
        ProfileConfig(memory_every=0)
    with Recorder(tmp_path, "b", profile=True) as rec:
        with pytest.raises(InvalidArgumentError, match="torch.nn.Module"):
            rec.profile_module("model", object())


def test_a_recorder_profiling_no_module_says_how_to_give_one_once_and_the_profile_command_too(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from comgra_ndbg.cli import main

    model = nn.Sequential(nn.Linear(7, 5))
    with pytest.warns(RecorderWarning) as caught:
        with Recorder(tmp_path, "t", profile=True) as rec:
            train(rec, model, 3)
    told = [str(w.message) for w in caught if "profile_module" in str(w.message)]
    assert told == ["comgra_ndbg: Recorder(profile=...) profiles the modules given to rec.profile_module(name, "
                    "module), and none was given: only step time and process memory are recorded; call "
                    "rec.profile_module('model', model) before the first step"]
    assert main(["profile", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("no module was profiled, only step time and process memory: a Recorder(profile=...) "
                             "profiles the modules given to rec.profile_module(name, module)")
    assert not any(line.startswith("module ") for line in out)  # no empty table
    with Recorder(tmp_path, "u", profile=True) as rec:  # with a module: nothing to say
        rec.profile_module("model", model)
        with warnings.catch_warnings():
            warnings.simplefilter("error", RecorderWarning)
            train(rec, model, 2)


def test_a_pass_cut_short_by_a_breakpoint_leaves_no_negative_time_and_no_hook_behind(tmp_path: Path) -> None:
    from comgra_ndbg.errors import BreakpointHit

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(7, 5), nn.Tanh(), nn.Linear(5, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    hits = 0
    with NeuralDbg(model, tmp_path, trial="t", profile=ProfileConfig(steps=True, flops=False)) as dbg:
        point = dbg.break_at("2", action="raise")
        for step in range(5):
            optimizer.zero_grad()
            while True:
                try:
                    out = model(torch.randn(3, 7))
                    break
                except BreakpointHit:  # the loop catches it and runs the pass again
                    hits += 1
                    if hits == 2:
                        point.remove()
            out.square().mean().backward()
            optimizer.step()
            assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None  # none left entered
    assert hits == 2
    with open_recording(tmp_path, "t") as recording:
        profile = recording.profile()
    assert profile.steps.tolist() == list(range(5))
    forward, inclusive = profile.field("forward_time"), profile.field("forward_inclusive")
    assert (forward >= 0).all(), forward
    root = profile.modules.index("model")
    np.testing.assert_allclose(forward.sum(axis=1), inclusive[:, root], rtol=1e-9)
    # step 0: NeuralDbg's structure pass, the two passes the breakpoint cut short and the one that finished
    assert profile.field("calls")[:, root].tolist() == [4.0, 1.0, 1.0, 1.0, 1.0]


def test_a_failing_clock_ends_the_profile_of_the_step_but_never_the_training(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(7, 5), nn.ReLU())
    with pytest.warns(RecorderWarning, match="profiling modules"):
        with Recorder(tmp_path, "t", profile=ProfileConfig(steps=True, flops=False)) as rec:
            rec.profile_module("model", model)
            rec._profiler._clock = _BrokenClock()
            train(rec, model, 3)
    with open_recording(tmp_path) as recording:
        assert any("profiling modules" in p.subject for p in recording.problems())
        assert recording.profile().process_steps.tolist() == [0, 1, 2]


class _BrokenClock:
    def mark(self) -> float:
        raise RuntimeError("clock unavailable")


# ---- the CUDA path on fake events and a fake allocator ------------------------------------------------------
class FakeDevice:
    """A device whose events complete only when told, a clock that moves 1 ms per event, and an allocator."""

    def __init__(self) -> None:
        self.now = 0.0
        self.done = False
        self.allocated_bytes = 1000.0
        self.peak_bytes = 1000.0
        self.syncs = 0

    def event(self) -> FakeEvent:
        return FakeEvent(self)


class FakeEvent:
    def __init__(self, device: FakeDevice) -> None:
        self.device, self.time = device, None

    def record(self) -> None:
        self.device.now += 1.0
        self.time = self.device.now

    def query(self) -> bool:
        return self.device.done

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.device.done, "read before the device reached the event"
        return end.time - self.time  # milliseconds

    def synchronize(self) -> None:
        self.device.syncs += 1
        self.device.done = True


class FakeMemory:
    available = True

    def __init__(self, device: FakeDevice) -> None:
        self.device = device

    def allocated(self) -> float:
        return self.device.allocated_bytes

    def peak(self) -> float:
        return self.device.peak_bytes

    def reset_peak(self) -> None:
        self.device.peak_bytes = self.device.allocated_bytes


class Allocates(nn.Module):
    """Allocates ``temporary`` bytes and frees them, then keeps ``kept`` bytes, in the fake allocator."""

    def __init__(self, device: FakeDevice, temporary: float, kept: float) -> None:
        super().__init__()
        self.device, self.temporary, self.kept = device, temporary, kept

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = self.device
        d.peak_bytes = max(d.peak_bytes, d.allocated_bytes + self.temporary)
        d.allocated_bytes += self.kept
        d.peak_bytes = max(d.peak_bytes, d.allocated_bytes)
        return x * 2


class Writer:
    def __init__(self) -> None:
        self.profile: list[tuple[int, list[str], np.ndarray]] = []
        self.process: list[tuple[int, np.ndarray]] = []

    def add_profile(self, step: int, names: list[str], rows: np.ndarray) -> None:
        self.profile.append((step, names, rows))

    def add_process(self, step: int, row: np.ndarray) -> None:
        self.process.append((step, row))


def test_the_cuda_path_reads_events_only_once_the_device_passed_them() -> None:
    device = FakeDevice()
    model = nn.Sequential(Allocates(device, temporary=500, kept=100), Allocates(device, temporary=0, kept=40))
    profiler = ModuleProfiler(ProfileConfig(steps=StepList([1]), flops=False, backward=False), pytest.fail,
                              clock=EventClock(device.event), memory=FakeMemory(device))
    profiler.attach("model", model)
    writer = Writer()
    for step in range(2):
        profiler.start_step(step, "train")
        model(torch.ones(2))
        profiler.finish_step(step, "train", writer)
    assert writer.profile == [] and device.syncs == 0  # step 1's events are not done: nothing read, no sync
    assert [s for s, _ in writer.process] == [0, 1]
    assert writer.process[1][1][schema.PROCESS_FIELD["device_allocated"]] == 1280.0
    device.done = True
    profiler.start_step(2, "train")
    profiler.finish_step(2, "train", writer)  # the device has passed them now: written at the next step
    [(step, names, rows)] = writer.profile
    assert step == 1 and names == ["model", "model.0", "model.1"]
    # 6 events, 1 ms apart: root [1, 6], model.0 [2, 3], model.1 [4, 5]
    np.testing.assert_allclose(rows[:, F["forward_inclusive"]], [0.005, 0.001, 0.001])
    np.testing.assert_allclose(rows[:, F["forward_time"]], [0.003, 0.001, 0.001])
    assert rows[:, F["allocated_delta"]].tolist() == [140.0, 100.0, 40.0]
    assert rows[:, F["peak_delta"]].tolist() == [500.0, 500.0, 40.0]  # the inner peak reaches the root
    assert device.syncs == 0


def test_close_waits_for_the_last_events_instead_of_dropping_them() -> None:
    device = FakeDevice()
    model = nn.Sequential(Allocates(device, temporary=0, kept=0))
    profiler = ModuleProfiler(ProfileConfig(steps=True, flops=False), pytest.fail, clock=EventClock(device.event),
                              memory=FakeMemory(device))
    profiler.attach("model", model)
    writer = Writer()
    profiler.start_step(0, "train")
    model(torch.ones(2))
    profiler.finish_step(0, "train", writer)
    assert writer.profile == []
    profiler.close(writer)
    assert device.syncs == 4 and [s for s, _, _ in writer.profile] == [0]  # 2 calls, a start and an end event each
    assert len(model[0]._forward_hooks) == 0


def test_profile_tables_survive_segments_and_their_merge_and_read_with_plain_h5py(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(7, 5), nn.ReLU())
    config = ProfileConfig(steps=StepList([0, 2, 3]), memory_every=2)
    with Recorder(tmp_path, "t", profile=config, flush_every_steps=1) as rec:
        rec.profile_module("model", model)
        train(rec, model, 5)
        rec.flush()
        assert len(list((tmp_path / "t").glob("seg-*.h5"))) >= 2
        with open_recording(tmp_path, "t") as live:  # read while the trial is still being written
            assert live.profile().steps.tolist() == [0, 2, 3]
    with h5py.File(tmp_path / "t" / schema.FINAL_NAME, "r") as f:
        assert f[schema.PROFILE_STEP][()].tolist() == [0, 0, 0, 2, 2, 2, 3, 3, 3]
        assert [v.decode() for v in f[schema.PROFILE_MODULE][()]] == ["model", "model.0", "model.1"] * 3
        assert f[schema.PROFILE_DATA].shape == (9, len(schema.PROFILE_FIELDS))
        assert f[schema.PROFILE_DATA][:, F["saved_bytes"]].tolist() == [0.0, 84.0, 60.0] * 3
        assert f[schema.PROCESS_STEP][()].tolist() == [0, 2, 4]  # memory_every=2
        assert f[schema.PROCESS_DATA][:, schema.PROCESS_FIELD["profiled"]].tolist() == [1.0, 1.0, 0.0]
    with open_recording(tmp_path, "t") as recording:
        profile = recording.profile()
        assert profile.at(2)[:, F["saved_bytes"]].tolist() == [0.0, 84.0, 60.0]
        with pytest.raises(UnknownSeriesError, match="not profiled"):
            profile.at(1)


class Checkpointed(nn.Module):
    """A block run under activation checkpointing, both kinds: it recomputes in the backward pass."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 2)
        self.block = nn.Sequential(nn.Linear(16, 16), nn.Tanh())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        h = checkpoint(self.block, torch.relu(self.a(x)), use_reentrant=False)
        return self.b(checkpoint(self.block, h, use_reentrant=True))


def checkpointed_run(folder: Path | None, *, whole: bool) -> tuple[list[torch.Tensor], Any]:
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    model = Checkpointed()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = [(torch.randn(4, 8), torch.randint(0, 2, (4,))) for _ in range(4)]
    rec = Recorder(folder, "t", profile=ProfileConfig(steps=True)) if folder else Recorder("", enabled=False)
    rec.profile_module("model", model)
    with rec:
        for step, (x, y) in enumerate(data):
            with rec.step(step):
                optimizer.zero_grad()
                out = checkpoint(model, x, use_reentrant=False) if whole else model(x)
                nn.functional.cross_entropy(out, y).backward()
                optimizer.step()
    profile = None
    if folder:
        with open_recording(folder, "t") as recording:
            profile = recording.profile()
    return [p.detach().clone() for p in model.parameters()], profile


@pytest.mark.parametrize("whole", [False, True], ids=["blocks", "whole model"])
def test_activation_checkpointing_trains_bit_identically_under_profiling(tmp_path: Path, whole: bool) -> None:
    bare, _ = checkpointed_run(None, whole=whole)
    profiled, profile = checkpointed_run(tmp_path, whole=whole)
    assert all(torch.equal(a, b) for a, b in zip(bare, profiled))
    calls = profile.field("calls")[:, profile.modules.index("model.block")]
    assert (calls == 2).all()  # the two forward calls; the recomputations in backward are not forward calls
    saved = profile.field("saved_bytes")[:, profile.modules.index("model.a")]
    if whole:  # checkpoint()'s own saved-tensor hooks are active: the profiler leaves them alone
        assert np.isnan(saved).all()
    else:
        assert (saved == 4 * 8 * 4).all()  # Linear a keeps its input


class LSTMNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm, self.head = nn.LSTM(6, 12, batch_first=True), nn.Linear(12, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)  # a tuple output with a nested tuple
        return self.head(out[:, -1])


class EncoderNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(6, 2, 12, dropout=0.0, batch_first=True)
        self.encoder, self.head = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x).mean(1))


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv1d(5, 8, 3), nn.BatchNorm1d(8), nn.ReLU(inplace=True), nn.Flatten(),
                                 nn.Linear(8 * 4, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def neuraldbg_run(make: type, folder: Path | None) -> tuple[list[torch.Tensor], Any]:
    torch.manual_seed(0)
    model = make()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(4, 5, 6, generator=g), torch.randint(0, 2, (4,), generator=g)) for _ in range(4)]
    dbg = NeuralDbg(model, folder, trial="t", profile=ProfileConfig(steps=True), snapshots=None) if folder else None
    for x, y in data:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    found = None
    if dbg is not None:
        dbg.close()
        with open_recording(folder, "t") as recording:
            found = (recording.profile(), recording.problems())
    return [p.detach().clone() for p in model.parameters()], found


@pytest.mark.parametrize("make", [LSTMNet, EncoderNet, ConvNet], ids=["lstm", "transformer", "conv-bn-inplace"])
def test_profiling_every_step_changes_no_result(tmp_path: Path, make: type) -> None:
    bare, _ = neuraldbg_run(make, None)
    profiled, (profile, problems) = neuraldbg_run(make, tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(bare, profiled)) and problems == []
    assert profile.steps.tolist() == [0, 1, 2, 3] and len(profile.modules) > 2
    times = profile.field("forward_time")[[0, 2, 3]]
    assert np.isfinite(times[:, 0]).all() and (np.nansum(profile.field("backward_time")[[0, 2, 3]], axis=1) > 0).all()

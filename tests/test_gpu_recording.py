"""Recording on a CUDA device: the rows and snapshots equal the host path's, half-precision and non-contiguous
tensors included, and the forward and backward passes never wait for the device. Skipped without CUDA."""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from test_reduce import reference_row
from torch import nn

from comgra_ndbg import NeuralDbg, Recorder, open_recording
from comgra_ndbg.store.schema import FIELD

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
EXACT = [FIELD[f] for f in ("count", "nan", "inf", "units")]
MOMENTS = [FIELD[f] for f in ("sum", "sum_sq", "sum_abs", "min", "max")]


def make(device: str) -> tuple[nn.Sequential, list[tuple[torch.Tensor, torch.Tensor]]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4)).to(device)
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(8, 16, generator=g).to(device), torch.randint(0, 4, (8,), generator=g).to(device))
            for _ in range(4)]
    return model, data


def train(folder: Path, trial: str, device: str, *, steps: int = 3, autocast: bool = False,
          captured: dict[str, torch.Tensor] | None = None) -> None:
    """The explicit Recorder loop; ``captured`` receives step 0's registered tensors (host copies)."""
    model, data = make(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = Recorder(folder, trial, summaries=1, snapshots=2)
    rec.track_module("model", model)
    for step, (x, y) in enumerate(data[:steps]):
        rec.start_step(step)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
            rec.register_tensor("input", x, role="input")
            h1 = model[1](model[0](x))
            rec.register_tensor("h1", h1)
            h2 = model[3](model[2](h1))
            rec.register_tensor("h2_t", h2.t())  # a non-contiguous view
            out = model[4](h2)
            rec.register_tensor("out", out, role="output")
        loss = nn.functional.cross_entropy(out.float(), y)
        rec.register_tensor("loss", loss, role="loss")
        if captured is not None and step == 0:
            captured.update(h1=h1.detach().float().cpu(), h2_t=h2.detach().t().float().cpu())
        optimizer.zero_grad()
        loss.backward()
        rec.record_gradients()
        optimizer.step()
        rec.record_kpi("loss", loss)
        rec.finish_step()
    rec.close()


def rows(folder: Path, trial: str) -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]:
    with open_recording(folder, trial) as recording:
        return {(t.name, kind): recording.summary_rows(t.node, kind, tensor=t.name)
                for t in recording.tensors for kind in recording.kinds(t.name)}


def test_cuda_rows_equal_the_host_rows_of_the_same_run(tmp_path: Path) -> None:
    train(tmp_path, "host", "cpu")
    train(tmp_path, "cuda", "cuda")
    host, device = rows(tmp_path, "host"), rows(tmp_path, "cuda")
    assert host.keys() == device.keys() and len(host) > 20  # values, gradients, parameters and updates
    for key, (steps, expected) in host.items():
        got_steps, got = device[key]
        assert got_steps.tolist() == steps.tolist() == [0, 1, 2], key
        np.testing.assert_array_equal(got[:, EXACT], expected[:, EXACT], err_msg=str(key))
        np.testing.assert_allclose(got[:, MOMENTS], expected[:, MOMENTS], rtol=2e-3, atol=1e-5, err_msg=str(key))
        np.testing.assert_allclose(got[:, FIELD["zeros"]], expected[:, FIELD["zeros"]], atol=1, err_msg=str(key))


def test_bf16_and_non_contiguous_tensors_are_summarised_from_their_own_values(tmp_path: Path) -> None:
    captured: dict[str, torch.Tensor] = {}
    train(tmp_path, "bf16", "cuda", steps=1, autocast=True, captured=captured)
    with open_recording(tmp_path, "bf16") as recording:
        for name, batched in (("h1", True), ("h2_t", False)):  # h2_t's first dimension is not the batch
            row = recording.summary_rows(name)[1][0]
            expected = reference_row(captured[name].numpy(), batched=batched)
            np.testing.assert_array_equal(row[EXACT + [FIELD["zeros"], FIELD["dead_units"]]],
                                          expected[EXACT + [FIELD["zeros"], FIELD["dead_units"]]])
            np.testing.assert_allclose(row[MOMENTS], expected[MOMENTS], rtol=1e-6, err_msg=name)
            snapshot = recording.snapshot(0, name)
            assert snapshot.values.dtype == np.float32
            np.testing.assert_array_equal(snapshot.values, captured[name].numpy().reshape(-1)[snapshot.value_index]
                                          if snapshot.value_index is not None else captured[name].numpy().reshape(-1))


def test_the_forward_and_backward_passes_never_wait_for_the_device(tmp_path: Path) -> None:
    model, data = make("cuda")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = Recorder(tmp_path, "sync", summaries=1, snapshots=2)
    rec.track_module("model", model)
    for step, (x, y) in enumerate(data):
        rec.start_step(step)
        torch.cuda.set_sync_debug_mode("error")
        try:
            h = model[1](model[0](x))
            rec.register_tensor("h", h)
            out = model[4](model[3](model[2](h)))
            rec.register_tensor("out", out)
            loss = nn.functional.cross_entropy(out, y)
            rec.register_tensor("loss", loss, role="loss")
            optimizer.zero_grad()
            loss.backward()
        finally:
            torch.cuda.set_sync_debug_mode(0)
        rec.record_gradients()
        optimizer.step()
        rec.finish_step()
    rec.close()
    with open_recording(tmp_path, "sync") as recording:
        assert recording.summary("h", "grad", "count")[0].tolist() == [0, 1, 2, 3]


def synchronisations(step) -> int:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return sum("synchroniz" in str(w.message) for w in caught)


def test_a_recorded_step_waits_for_the_device_a_few_times_whatever_its_size(tmp_path: Path) -> None:
    """One host copy per reducer and one for the step's snapshots, not one per tensor: a model of 12 layers
    synchronises as often as one of 3."""
    counts = {}
    for depth in (3, 12):
        torch.manual_seed(0)
        layers = [m for _ in range(depth) for m in (nn.Linear(32, 32), nn.Tanh())]
        model = nn.Sequential(*layers).cuda()
        optimizer = torch.optim.Adam(model.parameters())
        dbg = NeuralDbg(model, tmp_path, trial=f"depth{depth}", optimizer=optimizer, summaries=1, snapshots=2,
                        detail="full")
        x = torch.randn(16, 32, device="cuda")

        def step() -> None:
            loss = model(x).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        for _ in range(4):
            step()
        counts[depth] = (synchronisations(step), synchronisations(step))  # a snapshot step, then one without
        dbg.close()
    assert counts[12] == counts[3], counts
    assert max(counts[12]) <= 8, counts

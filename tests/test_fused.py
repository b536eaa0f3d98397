"""The Triton path (``stats.fused``), against numpy in float64, alone and inside the ``Reducer``.

On a CUDA machine the tests run on the GPU. Elsewhere one test runs this file again in a subprocess under
Triton's interpreter (``TRITON_INTERPRET=1``), which executes the same kernels with numpy on host tensors,
so every assertion holds on a machine without a GPU too. Without Triton the file is skipped.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from test_reduce import reference_row

pytest.importorskip("triton")

from comgra_ndbg.stats import fused, kernels, segmented  # noqa: E402
from comgra_ndbg.stats.bounds import DEFAULT_SATURATION_MARGIN  # noqa: E402
from comgra_ndbg.stats.reducer import Reducer  # noqa: E402
from comgra_ndbg.store.schema import FIELD  # noqa: E402

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRETED else ("cuda" if torch.cuda.is_available() else None)
on_a_device = pytest.mark.skipif(DEVICE is None, reason="run by the interpreter's subprocess, or on CUDA")
EXACT = [FIELD[f] for f in ("count", "nan", "inf", "zeros", "min", "max", "units", "dead_units", "bounded",
                            "saturated", "saturated_units", "spread_count")]
MOMENTS = [FIELD[f] for f in ("sum", "sum_sq", "sum_abs", "spread_sum_sq", "spread_dev_sq")]


def test_every_kernel_runs_under_tritons_interpreter_here() -> None:
    if INTERPRETED or torch.cuda.is_available():
        pytest.skip("this process runs the kernels itself")
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": f"{root}{os.pathsep}{root / 'tests'}"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", __file__],
                          cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and " failed" not in done.stdout


def reference(values: np.ndarray, batch: int, bounds: tuple[float, float] | None) -> np.ndarray:
    """``segment_moments``' ten columns in float64 (thresholds as given, no margin)."""
    a = np.asarray(values, np.float64)
    flat = a.reshape(-1)
    out = np.zeros(10)
    out[segmented.SUM], out[segmented.SUM_SQ], out[segmented.SUM_ABS] = flat.sum(), (flat * flat).sum(), \
        np.abs(flat).sum()
    out[segmented.MIN], out[segmented.MAX], out[segmented.NONZERO] = flat.min(), flat.max(), (flat != 0).sum()
    saturated = np.zeros(flat.shape, bool) if bounds is None else (flat <= bounds[0]) | (flat >= bounds[1])
    out[segmented.SATURATED] = saturated.sum()
    if batch:
        units = a.reshape(batch, -1)
        out[segmented.DEAD] = (units == 0).all(axis=0).sum()
        out[segmented.SATURATED_UNITS] = saturated.reshape(batch, -1).all(axis=0).sum()
        out[segmented.SPREAD] = ((units - units.mean(axis=0)) ** 2).sum()
    return out


def cases(dtype: torch.dtype) -> list[tuple[torch.Tensor, int, tuple[float, float] | None]]:
    g = torch.Generator().manual_seed(7)
    relu = torch.relu(torch.randn(6, 40, generator=g))
    relu[:, ::4] = 0  # ten dead units
    saturating = torch.tanh(3 * torch.randn(5, 300, generator=g))  # 300 units: two unit programs
    saturating[:, :7] = 1.0  # saturated in every sample
    out = [
        (torch.randn(64, 30, generator=g), 64, None),
        (torch.randn(5000, generator=g), 0, (-0.5, 0.5)),  # three flat programs
        (torch.tensor([1.0, 0.0, -2.0]), 0, None),
        (relu, 6, None),
        (saturating, 5, (-0.99, 0.99)),
        (torch.full((4, 3), 2.5), 4, None),  # no spread
        (torch.randn(1, 9, generator=g), 1, None),  # one sample: no spread
        (torch.randn(3, 5, 2, generator=g).transpose(0, 2), 2, None),  # not contiguous
        (torch.zeros(17), 0, None),
    ]
    return [(t.to(dtype).to(DEVICE), b, bounds) for t, b, bounds in out]


@on_a_device
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_one_call_reduces_every_tensor_of_a_group_like_numpy(dtype: torch.dtype) -> None:
    group = cases(dtype)
    rows = fused.fused_moments([t for t, _, _ in group], [b for _, b, _ in group], [s for _, _, s in group])
    assert rows.shape == (len(group), fused.COLUMNS) and rows.dtype == torch.float64 and rows.device.type == DEVICE
    for (tensor, batch, bounds), row in zip(group, rows.cpu().numpy()):
        expected = reference(tensor.float().cpu().numpy(), batch, bounds)
        np.testing.assert_array_equal(row[[segmented.MIN, segmented.MAX, segmented.NONZERO, segmented.SATURATED]],
                                      expected[[segmented.MIN, segmented.MAX, segmented.NONZERO, segmented.SATURATED]])
        if batch:
            np.testing.assert_array_equal(row[[segmented.DEAD, segmented.SATURATED_UNITS]],
                                          expected[[segmented.DEAD, segmented.SATURATED_UNITS]])
            np.testing.assert_allclose(row[segmented.SPREAD], expected[segmented.SPREAD], rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(row[:3], expected[:3], rtol=1e-12, atol=1e-12)
        assert row[fused.NAN] == row[fused.INF] == 0
        if batch:
            assert row[fused.FINITE_UNITS] == tensor[0].numel()


@on_a_device
def test_the_spread_of_a_mean_that_dwarfs_it_does_not_cancel() -> None:
    g = torch.Generator().manual_seed(1)
    values = (1e4 + 1e-3 * torch.randn(32, 50, generator=g, dtype=torch.float64)).float()
    row = fused.fused_moments([values.to(DEVICE)], [32])[0].cpu().numpy()
    expected = reference(values.numpy(), 32, None)[segmented.SPREAD]
    np.testing.assert_allclose(row[segmented.SPREAD], expected, rtol=1e-6)


@on_a_device
def test_nan_and_inf_are_counted_and_left_out_of_the_moments_and_the_spread() -> None:
    values = torch.tensor([[1.0, float("nan"), 4.0], [2.0, 3.0, float("-inf")], [0.0, 5.0, 6.0]], device=DEVICE)
    rows = fused.fused_moments([values, torch.full((2,), float("nan"), device=DEVICE)], [3, 0]).cpu().numpy()
    finite = np.array([1.0, 4.0, 2.0, 3.0, 0.0, 5.0, 6.0])
    np.testing.assert_allclose(rows[0, :3], [finite.sum(), (finite ** 2).sum(), np.abs(finite).sum()])
    assert (rows[0, segmented.MIN], rows[0, segmented.MAX], rows[0, segmented.NONZERO]) == (0.0, 6.0, 8.0)
    assert rows[0, fused.NAN] == 1 and rows[0, fused.INF] == 1
    assert rows[0, fused.FINITE_UNITS] == 1 and rows[0, fused.FINITE_SUM_SQ] == 1 + 4 + 0  # unit 0 alone
    np.testing.assert_allclose(rows[0, segmented.SPREAD], ((np.array([1.0, 2.0, 0.0]) - 1.0) ** 2).sum())
    assert rows[1, fused.NAN] == 2 and rows[1, segmented.SUM] == 0 and rows[1, segmented.MIN] == np.inf


@on_a_device
def test_the_launch_table_is_built_once_per_shape_and_never_written() -> None:
    a, b = torch.randn(3, 4, device=DEVICE), torch.randn(10, device=DEVICE)
    first = fused._table((12, 10), (3, 0), (None, None))
    fused.fused_moments([a, b], [3, 0])
    assert fused._table((12, 10), (3, 0), (None, None)) is first and not first[0].flags.writeable
    assert first[0][0] == 0  # the addresses go into a copy


@pytest.fixture()
def fused_reducer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Route host tensors as the Reducer routes device tensors (the host kernels and ``segmented`` off)."""
    monkeypatch.setattr(kernels, "AVAILABLE", False)
    monkeypatch.setattr(segmented, "segmentable", lambda t: False)


@on_a_device
def test_the_reducer_rows_of_small_and_large_tensors_equal_numpy(fused_reducer: None) -> None:
    g = torch.Generator().manual_seed(4)
    small = torch.randn(8, 16, generator=g).to(DEVICE)
    large = torch.tanh(torch.randn(4, 70_000, generator=g)).to(DEVICE)  # above segmented.SEGMENT_MAX
    reducer = Reducer()
    first = reducer.add(small, batched=True)
    second = reducer.add(large, batched=True, bounds=(-1.0, 1.0))
    small.mul_(2)  # changed after its registration: the row keeps the value it had
    rows = reducer.collect()
    assert not reducer.failed
    for row, values, bounds in ((rows[first], small.cpu().numpy() / 2, None),
                                (rows[second], large.cpu().numpy(), (-1.0, 1.0))):
        expected = reference_row(values, batched=True, bounds=bounds, margin=DEFAULT_SATURATION_MARGIN)
        np.testing.assert_array_equal(row[EXACT], expected[EXACT])
        np.testing.assert_allclose(row[MOMENTS], expected[MOMENTS], rtol=1e-9, atol=1e-9)


@on_a_device
def test_updates_and_copies_of_many_tensors_in_one_call(fused_reducer: None) -> None:
    g = torch.Generator().manual_seed(5)
    params = [torch.randn(shape, generator=g).to(DEVICE) for shape in ((5, 3), (3,), (2000,))]
    before = [p.clone() for p in params]
    for p in params:
        p.add_(0.01 * torch.randn(p.shape, generator=g).to(DEVICE))
    copies = [torch.empty_like(p) for p in params]
    reducer = Reducer()
    rows = reducer.add_many(params, starts=before, copies=copies)
    table = reducer.collect()
    for p, b, c, r in zip(params, before, copies, rows):
        assert torch.equal(c, p)
        expected = reference_row((p.double() - b.double()).cpu().numpy())
        np.testing.assert_allclose(table[r][MOMENTS], expected[MOMENTS], rtol=1e-5, atol=1e-12)
        assert table[r][FIELD["count"]] == p.numel()


@on_a_device
@pytest.mark.parametrize("size", [3, 70_000])
def test_a_row_with_nan_and_inf_equals_numpy_without_reading_the_tensor_again(fused_reducer: None, size: int,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(6)
    values = torch.randn(2, size, generator=g)
    values[0, 1], values[1, 2], values[1, 0] = float("nan"), float("inf"), 0.0
    values = values.to(DEVICE)
    monkeypatch.setattr("comgra_ndbg.stats.reducer._exact_moments", lambda *a, **k: pytest.fail("recomputed"))
    reducer = Reducer()
    reducer.add(values, batched=True, bounds=(-1.0, 1.0))
    row = reducer.collect()[0]
    expected = reference_row(values.cpu().numpy(), batched=True, bounds=(-1.0, 1.0))
    np.testing.assert_array_equal(row[EXACT], expected[EXACT])
    np.testing.assert_allclose(row[MOMENTS], expected[MOMENTS], rtol=1e-10)


def test_without_triton_or_when_turned_off_the_path_is_not_offered(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not fused.usable(torch.ones(3)) or INTERPRETED  # a host tensor only under the interpreter
    assert not fused.usable(torch.ones(3, dtype=torch.int64, device=DEVICE or "cpu"))
    fused._kernels.cache_clear()
    try:
        with monkeypatch.context() as patch:
            patch.setenv("COMGRA_NDBG_FUSED", "0")
            assert not fused.usable(torch.ones(3, device=DEVICE or "cpu"))
    finally:
        fused._kernels.cache_clear()
    assert fused.usable(torch.ones(3, device=DEVICE)) if DEVICE else True


@on_a_device
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_per_sample_statistics_of_a_snapshot_equal_the_exact_ones(dtype: torch.dtype) -> None:
    from comgra_ndbg.recorder.device_snapshots import fused_per_sample_stats
    from comgra_ndbg.recorder.snapshot import _exact_per_sample_stats, _float64_thresholds

    g = torch.Generator().manual_seed(8)
    x = torch.tanh(2 * torch.randn(5, 300, generator=g))
    x[1, 3], x[2, :4], x[4, 7] = float("nan"), 0.0, float("-inf")
    x = x.to(dtype)
    for bounds in (None, (-1.0, 1.0)):
        thresholds = None if bounds is None else tuple(_float64_thresholds(bounds, 0.005).tolist())
        got = fused_per_sample_stats(x.to(DEVICE), thresholds).cpu().numpy()
        expected = _exact_per_sample_stats(x.float(), bounds, 0.005)
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.skipif(not INTERPRETED, reason="host tensors take this path under the interpreter only")
def test_a_recorded_run_through_the_device_path_equals_the_host_path(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Large activations (one launch at registration), small ones (copied, reduced together at the end of
    the step), gradients, parameters and updates (one call per group) and snapshots."""
    from test_late_rows import contents, train

    from comgra_ndbg.stats import reducer as reducer_module

    train(tmp_path, "host", wide=True)
    calls: list[int] = []
    original = fused.fused_moments
    with monkeypatch.context() as patch:
        patch.setattr(kernels, "AVAILABLE", False)
        patch.setattr(reducer_module, "_HOST_DEVICE", "no host")
        patch.setattr(segmented, "segmentable", lambda t: t.numel() <= 100 and t.is_floating_point())
        patch.setattr(fused, "fused_moments", lambda tensors, *a: calls.append(len(tensors)) or original(tensors, *a))
        train(tmp_path, "device", wide=True)
    assert calls.count(1) >= 4 and max(calls) >= 4  # single large tensors and groups both took the path
    (host, _), (device, _) = contents(tmp_path, "host"), contents(tmp_path, "device")
    assert host.keys() == device.keys() and len(host) >= 14
    for key, (steps, expected) in host.items():
        got = device[key][1]
        np.testing.assert_array_equal(device[key][0], steps)
        np.testing.assert_array_equal(got[:, EXACT], expected[:, EXACT], err_msg=str(key))
        np.testing.assert_allclose(got[:, MOMENTS], expected[:, MOMENTS], rtol=1e-5, atol=1e-4,  # host: float32 sums
                                   err_msg=str(key))


@pytest.mark.parametrize("first", ["a large tensor", "a group"])
def test_kernels_that_fail_turn_the_path_off_and_every_row_is_still_computed(monkeypatch: pytest.MonkeyPatch,
                                                                              first: str) -> None:
    """A first launch that fails (Triton on a device it does not support): a warning, the path off for the
    rest of the process, and the tensors reduced by the other paths with the same rows (host tensors stand in
    for device tensors here, with the host kernels off)."""
    from comgra_ndbg.stats import reducer as reducer_module

    def broken(*args: object) -> torch.Tensor:
        raise RuntimeError("no kernel image is available for execution on the device")

    monkeypatch.setattr(fused, "_FAILED", None)
    monkeypatch.setattr(fused, "_launch", broken)
    monkeypatch.setattr(fused, "_kernels", lambda: object())
    monkeypatch.setattr(fused, "_interpreting", lambda: True)
    monkeypatch.setattr(kernels, "AVAILABLE", False)
    monkeypatch.setattr(reducer_module, "_HOST_DEVICE", "no host")
    monkeypatch.setattr(segmented, "segmentable", lambda t: t.is_floating_point() and 0 < t.numel() <= 64)
    g = torch.Generator().manual_seed(9)
    large, small = torch.randn(4, 300, generator=g), torch.randn(3, 5, generator=g)
    params = [torch.randn(500, generator=g), torch.randn(8, generator=g)]
    assert fused.usable(large)
    reducer = Reducer()
    with pytest.warns(RuntimeWarning, match="Triton statistics kernels failed"):
        if first == "a group":  # the large parameter one by one, the small one with segmented
            group = reducer.add_many(params)
        one = reducer.add(large, batched=True)
    assert fused._FAILED is not None and not fused.usable(large)
    two = reducer.add(small, batched=True)
    if first != "a group":
        group = reducer.add_many(params)
    rows = reducer.collect()
    assert not reducer.failed
    for row, values, batched in ((rows[one], large, True), (rows[two], small, True),
                                 (rows[group[0]], params[0], False), (rows[group[1]], params[1], False)):
        expected = reference_row(values.numpy(), batched=batched)
        np.testing.assert_array_equal(row[EXACT], expected[EXACT])
        np.testing.assert_allclose(row[MOMENTS], expected[MOMENTS], rtol=1e-6, atol=1e-9)

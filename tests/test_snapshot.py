"""Snapshots (``recorder.snapshot``): element values and per-sample statistics of tensors of any rank."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from comgra_ndbg import Recorder, open_recording
from comgra_ndbg.recorder.snapshot import (_exact_per_sample_stats, _float64_thresholds, _host_sample_stats,
                                           evenly_spaced, take_snapshot, take_update_snapshot)
from comgra_ndbg.stats import kernels
from comgra_ndbg.stats.statistics import derive
from comgra_ndbg.store.schema import FIELD, NUM_FIELDS, identity_row

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
SHAPES = [(), (7,), (5, 6), (4, 3, 5), (3, 4, 2, 5), (4, 3, 5, 6, 2)]
MARGIN = 0.005
pytestmark = pytest.mark.usefixtures("host_path")  # per-sample statistics by the kernels and by torch alike


def sample_reference(sample: np.ndarray, bounds: tuple[float, float] | None = None) -> np.ndarray:
    """Per-sample row as the snapshot stores it: element statistics, no unit statistics."""
    flat = np.asarray(sample, dtype=np.float64).reshape(-1)
    finite = flat[np.isfinite(flat)]
    row = identity_row()
    row[FIELD["count"]] = flat.size
    row[FIELD["nan"]] = np.isnan(flat).sum()
    row[FIELD["inf"]] = np.isinf(flat).sum()
    row[FIELD["zeros"]] = (flat == 0).sum()
    row[FIELD["sum"]] = finite.sum()
    row[FIELD["sum_sq"]] = (finite ** 2).sum()
    row[FIELD["sum_abs"]] = np.abs(finite).sum()
    if finite.size:
        row[FIELD["min"]], row[FIELD["max"]] = finite.min(), finite.max()
    if bounds is not None:
        low, high = bounds
        width = MARGIN * (high - low)
        row[FIELD["bounded"]] = flat.size
        row[FIELD["saturated"]] = ((flat <= low + width) | (flat >= high - width)).sum()
    return row


def seeded(shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


# ---- batch-less tensors ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"rank{len(s)}")
def test_batchless_tensor_of_any_rank_keeps_every_value(shape: tuple[int, ...], device: str) -> None:
    x = seeded(shape, len(shape)).to(device)
    snap = take_snapshot(x, batched=False, num_samples=8, max_elements=10_000)
    assert snap.shape == shape
    assert snap.value_index is None
    assert snap.sample_index.shape == (0,) and snap.sample_stats.shape == (0, NUM_FIELDS)
    assert snap.values.dtype == np.float32
    np.testing.assert_array_equal(snap.values, x.cpu().numpy().reshape(-1))


@pytest.mark.parametrize("device", DEVICES)
def test_batchless_subsampling_is_evenly_spaced_and_deterministic(device: str) -> None:
    x = torch.arange(1000, dtype=torch.float32, device=device).view(10, 10, 10)
    torch_state, numpy_state = torch.get_rng_state(), np.random.get_state()
    first = take_snapshot(x, batched=False, num_samples=4, max_elements=64)
    second = take_snapshot(x, batched=False, num_samples=4, max_elements=64)
    assert torch.equal(torch.get_rng_state(), torch_state)
    assert all(np.array_equal(a, b) for a, b in zip(np.random.get_state(), numpy_state))
    assert first.value_index is not None and len(first.value_index) == 64
    np.testing.assert_array_equal(first.value_index, evenly_spaced(1000, 64))
    np.testing.assert_array_equal(first.values, first.value_index.astype(np.float32))  # value == flat index
    np.testing.assert_array_equal(first.values, second.values)
    np.testing.assert_array_equal(first.value_index, second.value_index)
    assert first.value_index[0] == 0 and first.value_index[-1] == 999


def test_integer_and_bool_values_are_stored_as_float32() -> None:
    ints = take_snapshot(torch.tensor([[3, -4], [0, 7]]), batched=False, num_samples=2, max_elements=10)
    assert ints.values.dtype == np.float32 and ints.values.tolist() == [3.0, -4.0, 0.0, 7.0]
    flags = take_snapshot(torch.tensor([True, False, True]), batched=True, num_samples=3, max_elements=10)
    assert flags.values.tolist() == [1.0, 0.0, 1.0]
    assert flags.sample_stats[:, FIELD["zeros"]].tolist() == [0.0, 1.0, 0.0]


# ---- batched tensors ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES[1:], ids=lambda s: f"rank{len(s)}")
def test_batched_tensor_of_any_rank_has_per_sample_statistics(shape: tuple[int, ...], device: str) -> None:
    x = seeded(shape, 10 + len(shape))
    x[x.abs() < 0.3] = 0.0
    num_samples = 2
    snap = take_snapshot(x.to(device), batched=True, num_samples=num_samples, max_elements=100_000)
    n = min(num_samples, shape[0])
    assert snap.shape == shape
    assert snap.sample_index.tolist() == list(range(n))
    assert snap.sample_stats.shape == (n, NUM_FIELDS)
    assert snap.value_index is None
    np.testing.assert_array_equal(snap.values, x[:n].numpy().reshape(-1))
    for i in range(n):
        np.testing.assert_allclose(snap.sample_stats[i], sample_reference(x[i].numpy()), rtol=1e-12)


def test_a_five_dimensional_tensor_with_three_plus_non_batch_dims_works_end_to_end(tmp_path) -> None:
    """Comgra crashes on 3+ non-batch dims; here a [4, 3, 5, 6, 2] tensor is snapshotted and read back."""
    x = seeded((4, 3, 5, 6, 2), 1)
    with Recorder(tmp_path, trial="t", snapshots=1, num_samples=3, max_elements=10_000) as rec:
        with rec.step(0):
            rec.register_tensor("attention", x)
    with open_recording(tmp_path, "t") as recording:
        snap = recording.snapshot(0, "attention")
        assert snap.shape == (4, 3, 5, 6, 2)
        assert snap.value_index is None
        np.testing.assert_array_equal(snap.dense(), x[:3].numpy())
        assert snap.sample_index.tolist() == [0, 1, 2]
        np.testing.assert_allclose(snap.sample_stats["mean"], x[:3].reshape(3, -1).double().mean(1).numpy(),
                                   rtol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
def test_batched_subsampling_keeps_the_same_units_of_every_sample(device: str) -> None:
    x = torch.arange(8 * 180, dtype=torch.float32).view(8, 3, 5, 6, 2)
    snap = take_snapshot(x.to(device), batched=True, num_samples=4, max_elements=100)
    keep = evenly_spaced(180, 100 // 4)
    assert len(keep) == 25
    expected_index = (np.arange(4)[:, None] * 180 + keep[None, :]).reshape(-1)
    np.testing.assert_array_equal(snap.value_index, expected_index)
    np.testing.assert_array_equal(snap.values, expected_index.astype(np.float32))
    assert len(snap.values) <= 100
    np.testing.assert_allclose(snap.sample_stats[:, FIELD["sum"]], x[:4].reshape(4, -1).double().sum(1).numpy())


def test_dense_from_the_reader_puts_subsampled_values_at_their_positions(tmp_path) -> None:
    x = seeded((6, 3, 5, 6, 2), 2)
    p = seeded((7, 9, 11), 3)
    with Recorder(tmp_path, trial="t", snapshots=1, num_samples=4, max_elements=50) as rec:
        with rec.step(0):
            rec.register_tensor("x", x)
            rec.register_tensor("p", p, batched=False)
    with open_recording(tmp_path, "t") as recording:
        snap = recording.snapshot(0, "x")
        dense = snap.dense()
        assert dense.shape == (4, 3, 5, 6, 2)
        kept = ~np.isnan(dense)
        assert kept.sum() == len(snap.values) <= 50
        np.testing.assert_array_equal(dense[kept], x[:4].numpy()[kept])
        assert kept.reshape(4, -1).sum(axis=1).tolist() == [len(snap.values) // 4] * 4
        flat_positions = np.flatnonzero(kept.reshape(-1))
        np.testing.assert_array_equal(flat_positions, np.sort(snap.value_index))

        batchless = recording.snapshot(0, "p")
        assert batchless.shape == (7, 9, 11) and len(batchless.sample_index) == 0
        np.testing.assert_array_equal(batchless.value_index, evenly_spaced(693, 50))
        dense = batchless.dense()
        assert dense.shape == (7, 9, 11)
        kept = ~np.isnan(dense)
        np.testing.assert_array_equal(dense[kept], p.numpy()[kept])
        np.testing.assert_array_equal(np.flatnonzero(kept.reshape(-1)), evenly_spaced(693, 50))


@pytest.mark.parametrize("device", DEVICES)
def test_per_sample_statistics_with_nan_and_inf(device: str) -> None:
    x = torch.tanh(seeded((5, 4, 6), 4) * 3)
    x[0, 1, 2] = float("nan")
    x[1, 0, 0], x[1, 3, 5] = float("inf"), float("-inf")
    x[2] = float("nan")
    x[3, 2] = 0.0
    snap = take_snapshot(x.to(device), batched=True, num_samples=5, max_elements=1000, bounds=(-1.0, 1.0),
                         saturation_margin=MARGIN)
    for i in range(5):
        np.testing.assert_allclose(snap.sample_stats[i], sample_reference(x[i].numpy(), (-1.0, 1.0)), rtol=1e-12)
    stats = derive(snap.sample_stats)
    assert stats["nan"].tolist() == [1, 0, 24, 0, 0]
    assert stats["inf"].tolist() == [0, 2, 0, 0, 0]
    assert np.isnan(stats["mean"][2]) and np.isfinite(stats["mean"][[0, 1, 3, 4]]).all()
    assert stats["zero_fraction"][3] == pytest.approx(6 / 24)
    finite = x[1].numpy()[np.isfinite(x[1].numpy())]
    assert stats["std"][1] == pytest.approx(finite.astype(np.float64).std(), rel=1e-9)
    np.testing.assert_array_equal(np.isnan(snap.values), np.isnan(x.numpy().reshape(-1)))
    np.testing.assert_array_equal(np.isposinf(snap.values), np.isposinf(x.numpy().reshape(-1)))


def awkward_rows(dtype: np.dtype) -> np.ndarray:
    """Rows with NaN, ±Inf, zeros, values at the saturation bounds, a constant row (cancelling sums), a mean that
    dwarfs the spread and a wide range of magnitudes."""
    rng = np.random.default_rng(7)
    rows = rng.standard_normal((10, 300)).astype(dtype)
    rows[0, 3], rows[1, 0], rows[1, 9], rows[2] = np.nan, np.inf, -np.inf, np.nan
    rows[3, ::3] = 0.0
    rows[4, :50], rows[4, 50:100] = 0.999, -1.0
    rows[5] = 2.5
    rows[6] = 1 + 1e-4 * rng.standard_normal(300)
    rows[7] *= np.logspace(-20, 20, 300)
    rows[8] = np.tanh(4 * rows[8])
    rows[9] = 0.0
    return rows


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("bounds", [None, (-1.0, 1.0)])
def test_per_sample_kernel_rows_equal_the_exact_path_s(dtype: np.dtype, bounds: tuple[float, float] | None) -> None:
    """The kernel reads float32 and float64 rows in place and sums in float64: its rows match the exact torch
    path's, it flags the NaN, Inf and cancelling rows, and those are redone exactly."""
    rows = awkward_rows(dtype)
    exact = _exact_per_sample_stats(torch.from_numpy(rows), bounds, MARGIN)
    np.testing.assert_allclose(_host_sample_stats(rows, bounds, MARGIN), exact, rtol=1e-12)
    for i in range(len(rows)):
        np.testing.assert_allclose(exact[i], sample_reference(rows[i], bounds), rtol=1e-12)
    if not kernels.AVAILABLE:
        return
    got, flags = kernels.per_sample(rows, None if bounds is None else _float64_thresholds(bounds, MARGIN))
    assert got.shape == (10, NUM_FIELDS) and flags[:3].all()  # NaN and Inf are never summed: redone exactly
    keep = ~flags
    np.testing.assert_allclose(got[keep], exact[keep], rtol=1e-12)
    assert (got[:, FIELD["count"]] == 300).all()


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool, torch.float16, torch.bfloat16])
def test_integer_bool_and_half_precision_samples_have_exact_statistics(dtype: torch.dtype) -> None:
    """Class targets, token ids, masks and half-precision activations: their rows widened to float64 (as the
    exact path reads them) get the same per-sample statistics."""
    x = (torch.arange(40).view(5, 8) % 7 - (0 if dtype in (torch.uint8, torch.bool) else 3)).to(dtype)
    snap = take_snapshot(x, batched=True, num_samples=4, max_elements=100, bounds=(0.0, 1.0))
    for i in range(4):
        np.testing.assert_allclose(snap.sample_stats[i], sample_reference(x[i].double().numpy(), (0.0, 1.0)),
                                   rtol=1e-12)
    np.testing.assert_array_equal(snap.values, x[:4].float().numpy().reshape(-1))


@pytest.mark.parametrize("view", ["transposed", "every_other_row", "channels_last", "requires_grad"])
def test_strided_views_are_snapshotted_as_their_contiguous_copy(view: str) -> None:
    base = seeded((12, 3, 4, 5), 8)
    x = {"transposed": base.reshape(12, 60).t().contiguous().t(), "every_other_row": seeded((24, 3, 4, 5), 9)[::2],
         "channels_last": base.to(memory_format=torch.channels_last), "requires_grad": base.requires_grad_()}[view]
    for positions in (None, np.array([7, 0, 3])):
        got = take_snapshot(x, batched=True, num_samples=5, max_elements=40, bounds=(-1.0, 1.0),
                            sample_positions=positions)
        want = take_snapshot(x.detach().contiguous(), batched=True, num_samples=5, max_elements=40,
                             bounds=(-1.0, 1.0), sample_positions=positions)
        np.testing.assert_array_equal(got.values, want.values)
        np.testing.assert_array_equal(got.value_index, want.value_index)
        np.testing.assert_array_equal(got.sample_index, want.sample_index)
        np.testing.assert_allclose(got.sample_stats, want.sample_stats, rtol=1e-12)


def test_values_are_copies_and_index_patterns_are_shared() -> None:
    """The values outlive later in-place changes of the tensor; the index arrays of one pattern are one cached,
    read-only array (the store keeps each pattern once)."""
    x = seeded((16, 50), 11)
    before = x.clone()
    first = take_snapshot(x, batched=True, num_samples=8, max_elements=100)
    whole = take_snapshot(x, batched=True, num_samples=2, max_elements=1000)
    x.mul_(-2.0)
    np.testing.assert_array_equal(first.values, before[:8].numpy()[:, evenly_spaced(50, 12)].reshape(-1))
    np.testing.assert_array_equal(whole.values, before[:2].numpy().reshape(-1))
    second = take_snapshot(x, batched=True, num_samples=8, max_elements=100)
    assert second.value_index is first.value_index and second.sample_index is first.sample_index
    assert not first.value_index.flags.writeable and not first.sample_index.flags.writeable


@pytest.mark.parametrize("device", DEVICES)
def test_a_single_sample_has_no_sample_spread(device: str) -> None:
    """The spread compares samples: a per-sample row holds none (zeros, as the merge identity), so it derives
    NaN, never 0 (which would read as a collapsed batch), for rows from the kernels and from torch alike."""
    x = seeded((4, 3, 5), 6)
    x[1, 0, 0] = float("nan")  # this row is redone with torch
    snap = take_snapshot(x.to(device), batched=True, num_samples=4, max_elements=1000)
    spread = [FIELD[f] for f in ("spread_count", "spread_sum_sq", "spread_dev_sq")]
    assert (snap.sample_stats[:, spread] == 0).all()
    stats = derive(snap.sample_stats)
    assert np.isnan(stats["sample_spread"]).all() and np.isnan(stats["sample_spread_rms"]).all()
    assert np.isfinite(stats["std"]).all()


def test_num_samples_caps_the_samples_and_short_batches_are_fine() -> None:
    x = seeded((3, 4))
    snap = take_snapshot(x, batched=True, num_samples=8, max_elements=100)
    assert snap.sample_index.tolist() == [0, 1, 2] and snap.sample_stats.shape == (3, NUM_FIELDS)
    np.testing.assert_array_equal(snap.values, x.numpy().reshape(-1))


def test_zero_samples_and_zero_units_do_not_crash() -> None:
    none = take_snapshot(seeded((4, 3)), batched=True, num_samples=0, max_elements=100)
    assert none.shape == (4, 3) and none.sample_stats.shape == (0, NUM_FIELDS) and len(none.values) == 0
    empty = take_snapshot(torch.zeros(4, 0), batched=True, num_samples=2, max_elements=100)
    assert empty.shape == (4, 0) and len(empty.values) == 0
    np.testing.assert_array_equal(empty.sample_stats, np.stack([identity_row(), identity_row()]))
    scalar = take_snapshot(torch.tensor(2.5), batched=True, num_samples=2, max_elements=100)
    assert scalar.shape == () and scalar.values.tolist() == [2.5] and len(scalar.sample_index) == 0


def test_snapshot_does_not_touch_the_tensor_or_its_graph() -> None:
    w = torch.randn(3, 4, requires_grad=True)
    h = torch.tanh(w * 2)
    before = h.detach().clone()
    take_snapshot(h, batched=True, num_samples=2, max_elements=5, bounds=(-1.0, 1.0))
    assert h.requires_grad and h.grad_fn is not None and torch.equal(h, before)
    h.sum().backward()
    assert w.grad is not None


# ---- evenly_spaced ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("total", [0, 1, 2, 3, 7, 10, 99, 100, 101, 1000, 4097])
@pytest.mark.parametrize("count", [0, 1, 2, 3, 5, 64, 100, 4096])
def test_evenly_spaced_properties(total: int, count: int) -> None:
    idx = evenly_spaced(total, count)
    assert idx.dtype == np.int64
    assert len(idx) == min(total, count)
    assert len(np.unique(idx)) == len(idx) and np.all(np.diff(idx) > 0)
    if len(idx):
        assert idx[0] == 0 and idx[-1] <= total - 1
    if count >= 2 and total >= 2:
        assert idx[-1] == total - 1
        gaps = np.diff(idx)
        assert gaps.max() - gaps.min() <= 1  # evenly spaced
    if count >= total:
        np.testing.assert_array_equal(idx, np.arange(total))
    np.testing.assert_array_equal(idx, evenly_spaced(total, count))


def test_evenly_spaced_examples() -> None:
    assert evenly_spaced(10, 4).tolist() == [0, 3, 6, 9]
    assert evenly_spaced(5, 1).tolist() == [0]
    assert evenly_spaced(5, 2).tolist() == [0, 4]
    assert evenly_spaced(3, 5).tolist() == [0, 1, 2]


def test_a_lazily_negated_view_is_snapshotted_with_its_sign() -> None:
    negated = torch._neg_view(torch.arange(6.0).view(2, 3))
    data = take_snapshot(negated, batched=True, num_samples=2, max_elements=100)
    assert data.values.tolist() == [-0.0, -1.0, -2.0, -3.0, -4.0, -5.0]
    assert data.sample_stats[:, FIELD["sum"]].tolist() == [-3.0, -12.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("shape", [(5,), (64, 48), (3, 4, 5)])
def test_update_snapshot_equals_the_snapshot_of_the_materialised_difference(dtype: torch.dtype,
                                                                            shape: tuple[int, ...]) -> None:
    gen = torch.Generator().manual_seed(3)
    start = torch.randn(shape, generator=gen).to(dtype)
    value = (start.float() + 0.01 * torch.randn(shape, generator=gen)).to(dtype)
    value[(0,) * len(shape)] = float("nan")
    for max_elements in (7, 100_000):
        got = take_update_snapshot(value, start, max_elements=max_elements)
        exact = value.double() - start.double()  # not rounded to bfloat16's grid
        want = take_snapshot(exact, batched=False, num_samples=4, max_elements=max_elements)
        assert got.shape == want.shape and got.sample_stats.shape == want.sample_stats.shape == (0, NUM_FIELDS)
        # float64 parameters keep float64 updates (float32 would turn 1e300 into inf); the others float32
        assert got.values.dtype == (np.float64 if dtype == torch.float64 else np.float32)
        np.testing.assert_array_equal(got.values, want.values.astype(got.values.dtype))  # NaN where NaN
        if want.value_index is None:
            assert got.value_index is None
        else:
            np.testing.assert_array_equal(got.value_index, want.value_index)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("max_elements", [7, 100_000])
def test_update_snapshot_reads_the_start_from_the_start_s_value_snapshot(dtype: torch.dtype,
                                                                        max_elements: int) -> None:
    """A sub-sampled start's elements come from its value snapshot when that holds the same positions, and from
    ``start`` itself when it holds others (taken with another element limit): the update is the same."""
    gen = torch.Generator().manual_seed(5)
    start = torch.randn(16, 9, generator=gen, dtype=dtype)
    value = start - 0.01 * torch.randn(16, 9, generator=gen, dtype=dtype)
    want = take_update_snapshot(value, start, max_elements=max_elements)
    for start_snapshot in (take_snapshot(start, batched=False, num_samples=8, max_elements=max_elements),
                           take_snapshot(start, batched=False, num_samples=8, max_elements=5)):
        got = take_update_snapshot(value, start, max_elements=max_elements, start_snapshot=start_snapshot)
        np.testing.assert_array_equal(got.values, want.values)
        assert got.values.dtype == want.values.dtype and got.value_index is want.value_index
    if want.value_index is not None:  # read from the snapshot, not from start
        moved = take_snapshot(start + 1, batched=False, num_samples=8, max_elements=max_elements)
        got = take_update_snapshot(value, start, max_elements=max_elements, start_snapshot=moved)
        np.testing.assert_array_equal(got.values,
                                      take_update_snapshot(value, start + 1, max_elements=max_elements).values)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_recorded_sub_sampled_updates_are_the_parameters_change(tmp_path, dtype: torch.dtype) -> None:
    """The recorder reads the start of a sub-sampled update from the parameter's value snapshot at the step's
    start (float32, float64) or from its start-of-step copy (float16): the recorded update is the change of the
    kept elements either way."""
    torch.manual_seed(4)
    model = torch.nn.Sequential(torch.nn.Linear(12, 9), torch.nn.Tanh(), torch.nn.Linear(9, 2)).to(dtype)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    before, after = [], []
    with Recorder(tmp_path, trial="t", snapshots=1, max_elements=10) as rec:
        rec.track_module("model", model)
        for step in range(3):
            with rec.step(step):
                before.append(model[0].weight.detach().clone())
                optimizer.zero_grad()
                model(torch.randn(4, 12, dtype=dtype)).float().pow(2).mean().backward()
                optimizer.step()
                after.append(model[0].weight.detach().clone())
    with open_recording(tmp_path, "t") as recording:
        for step in range(3):
            update = recording.snapshot(step, "model.0.weight", "update")
            np.testing.assert_array_equal(update.value_index, evenly_spaced(108, 10))
            change = (after[step].double() - before[step].double()).numpy().reshape(-1)[update.value_index]
            np.testing.assert_array_equal(update.values, change.astype(update.values.dtype))


def test_update_snapshot_of_a_complex_parameter_holds_the_magnitude_of_the_change() -> None:
    start = torch.tensor([1 + 1j, 2 - 1j, 0j, -3j], dtype=torch.complex64)
    value = start + torch.tensor([3 + 4j, 0j, -1j, 1 + 0j], dtype=torch.complex64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "casting complex values to real discards the imaginary part"
        got = take_update_snapshot(value, start, max_elements=100)
    assert got.values.tolist() == [5.0, 0.0, 1.0, 1.0]


def test_update_snapshot_of_a_transposed_parameter_follows_its_logical_order() -> None:
    start = torch.arange(12.0).view(3, 4).t()
    value = start * 3
    got = take_update_snapshot(value, start, max_elements=5)
    want = take_snapshot(value - start, batched=False, num_samples=4, max_elements=5)
    np.testing.assert_array_equal(got.values, want.values)


def test_device_arrays_of_a_steps_snapshots_reach_the_host_together_with_their_dtypes() -> None:
    from comgra_ndbg.recorder.device_snapshots import materialize
    from comgra_ndbg.store.segment import SnapshotData

    stats = torch.arange(2 * NUM_FIELDS, dtype=torch.float64).view(2, NUM_FIELDS)
    on_device = SnapshotData((2, 3), np.arange(2), stats, torch.tensor([1.5, -2.0, 3.0]), np.array([0, 2, 4]))
    wide = SnapshotData((2,), np.zeros(0, np.int64), np.zeros((0, NUM_FIELDS)), torch.tensor([1e300, 2.0],
                        dtype=torch.float64), None)
    host = take_snapshot(torch.ones(3), batched=False, num_samples=1, max_elements=8)
    out = materialize([(4, 0, on_device), (5, 1, host), (6, 0, wide)])
    assert [(series, iteration) for series, iteration, _ in out] == [(4, 0), (5, 1), (6, 0)]
    first, second, third = (data for _, _, data in out)
    assert second is host  # host snapshots pass through untouched
    assert isinstance(first.values, np.ndarray) and first.values.dtype == np.float32
    assert first.values.tolist() == [1.5, -2.0, 3.0] and first.value_index.tolist() == [0, 2, 4]
    np.testing.assert_array_equal(first.sample_stats, stats.numpy())
    assert third.values.dtype == np.float64 and third.values.tolist() == [1e300, 2.0]
    assert materialize([(1, 0, host)])[0][2] is host

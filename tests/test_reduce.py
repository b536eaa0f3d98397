"""Summaries (``stats.reducer``) and their derived statistics (``statistics``) against numpy in float64.

Every row the reducer produces is compared with a reference row computed here with plain numpy, in float64,
on the very same values: counts, minima and maxima must be exact; moments of float32 data may differ by
float32 rounding of the accumulation only.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from comgra_ndbg.stats import kernels
from comgra_ndbg.stats import reducer as reduce_module
from comgra_ndbg.stats.bounds import DEFAULT_SATURATION_MARGIN, saturation_bounds
from comgra_ndbg.stats.reducer import Reducer, summarize
from comgra_ndbg.stats.statistics import STATISTICS, derive, derive_one, merge_groups, merge_rows
from comgra_ndbg.store.schema import FIELD, NUM_FIELDS, STAT_FIELDS, identity_row

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

pytestmark = pytest.mark.usefixtures("host_path")  # the compiled kernels and the numpy code alike
EXACT_FIELDS = [f for f in STAT_FIELDS if f not in ("sum", "sum_sq", "sum_abs", "spread_sum_sq", "spread_dev_sq")]
MOMENTS = ("sum", "sum_sq", "sum_abs")
SPREAD = [FIELD[f] for f in ("spread_count", "spread_sum_sq", "spread_dev_sq")]
SHAPES = [(), (7,), (5, 6), (4, 3, 5), (3, 4, 2, 5), (4, 3, 5, 6, 2)]


def reference_row(values: np.ndarray, *, batched: bool = False, bounds: tuple[float, float] | None = None,
                  margin: float = DEFAULT_SATURATION_MARGIN) -> np.ndarray:
    """The sufficient-statistic row of ``values``, computed with numpy in float64."""
    a = np.asarray(values, dtype=np.float64)
    flat = a.reshape(-1)
    finite = flat[np.isfinite(flat)]
    row = identity_row()
    row[FIELD["count"]] = flat.size
    row[FIELD["nan"]] = np.isnan(flat).sum()
    row[FIELD["inf"]] = np.isinf(flat).sum()
    row[FIELD["zeros"]] = (flat == 0).sum()
    row[FIELD["sum"]] = finite.sum()
    row[FIELD["sum_sq"]] = (finite * finite).sum()
    row[FIELD["sum_abs"]] = np.abs(finite).sum()
    if finite.size:
        row[FIELD["min"]], row[FIELD["max"]] = finite.min(), finite.max()
    has_units = batched and a.ndim >= 1 and a.shape[0] > 0 and flat.size > 0
    if has_units:
        units = a.reshape(a.shape[0], -1)
        row[FIELD["units"]] = units.shape[1]
        row[FIELD["dead_units"]] = (units == 0).all(axis=0).sum()
        if a.shape[0] > 1:  # the units without NaN or Inf in any sample
            kept = units[:, np.isfinite(units).all(axis=0)]
            row[SPREAD] = kept.size, (kept * kept).sum(), ((kept - kept.mean(axis=0)) ** 2).sum()
    if bounds is not None and flat.size:
        low, high = bounds
        width = margin * (high - low)
        saturated = (flat <= low + width) | (flat >= high - width)
        row[FIELD["bounded"]] = flat.size
        row[FIELD["saturated"]] = saturated.sum()
        if has_units:
            row[FIELD["saturated_units"]] = saturated.reshape(a.shape[0], -1).all(axis=0).sum()
    return row


def host(tensor: torch.Tensor) -> np.ndarray:
    """The tensor's values as float64 numpy (exact for every dtype used here)."""
    return tensor.detach().cpu().to(torch.float64).numpy()


def assert_row(row: np.ndarray, expected: np.ndarray, *, rtol: float) -> None:
    """Counts, extremes, units exact; moments within ``rtol`` (relative to the sum of |x| for the sum, and to
    the Σx² of the same elements for the sample spread)."""
    assert row.shape == (NUM_FIELDS,)
    for name in EXACT_FIELDS:
        assert row[FIELD[name]] == expected[FIELD[name]], (name, row[FIELD[name]], expected[FIELD[name]])
    scale = max(expected[FIELD["sum_abs"]], 1e-300)
    np.testing.assert_allclose(row[FIELD["sum"]], expected[FIELD["sum"]], rtol=rtol, atol=rtol * scale)
    np.testing.assert_allclose(row[FIELD["sum_sq"]], expected[FIELD["sum_sq"]], rtol=rtol, atol=0)
    np.testing.assert_allclose(row[FIELD["sum_abs"]], expected[FIELD["sum_abs"]], rtol=rtol, atol=0)
    np.testing.assert_allclose(row[FIELD["spread_sum_sq"]], expected[FIELD["spread_sum_sq"]], rtol=rtol, atol=0)
    np.testing.assert_allclose(row[FIELD["spread_dev_sq"]], expected[FIELD["spread_dev_sq"]], rtol=rtol,
                               atol=rtol * expected[FIELD["spread_sum_sq"]])


def random_tensor(shape: tuple[int, ...], seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=generator, dtype=torch.float64) * 3
    x[x.abs() < 0.4] = 0.0  # exact zeros, so zero counts are not trivially 0
    return x.to(dtype)


# ---- plain tensors -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"rank{len(s)}")
@pytest.mark.parametrize("batched", [False, True])
def test_float32_any_rank_equals_numpy(shape: tuple[int, ...], batched: bool, device: str) -> None:
    x = random_tensor(shape, seed=len(shape)).to(device)
    row = summarize(x, batched=batched)
    expected = reference_row(host(x), batched=batched)
    assert_row(row, expected, rtol=2e-6)
    assert row[FIELD["zeros"]] > 0 or x.numel() < 3
    if batched and len(shape) >= 1:
        assert row[FIELD["units"]] == int(np.prod(shape[1:]))
    else:
        assert row[FIELD["units"]] == 0


@pytest.mark.parametrize("device", DEVICES)
def test_float64_equals_numpy_to_double_precision(device: str) -> None:
    x = random_tensor((6, 7, 3), seed=11, dtype=torch.float64).to(device)
    assert_row(summarize(x, batched=True), reference_row(host(x), batched=True), rtol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_half_precision_equals_numpy_on_the_same_values(dtype: torch.dtype, device: str) -> None:
    x = random_tensor((9, 40), seed=5, dtype=dtype).to(device)
    x[0, :3] = torch.tensor([200.0, -250.0, 255.0], dtype=dtype)  # squares far beyond float16's range
    row = summarize(x, batched=True)
    assert_row(row, reference_row(host(x), batched=True), rtol=2e-6)
    assert row[FIELD["max"]] == 255.0 and row[FIELD["min"]] == -250.0


@pytest.mark.parametrize("device", DEVICES)
def test_int64_rows_are_exact(device: str) -> None:
    generator = torch.Generator().manual_seed(3)
    x = torch.randint(-10**6, 10**6, (12, 9), generator=generator, dtype=torch.int64)
    x[:, 4] = 0  # a dead unit
    x[x % 7 == 0] = 0
    row = summarize(x.to(device), batched=True)
    expected = reference_row(x.numpy(), batched=True)
    exact = [i for i in range(NUM_FIELDS) if i != FIELD["spread_dev_sq"]]  # Σ_u (Σ_i d)² / 12 is not an integer
    np.testing.assert_array_equal(row[exact], expected[exact])
    np.testing.assert_allclose(row[FIELD["spread_dev_sq"]], expected[FIELD["spread_dev_sq"]], rtol=1e-15)
    assert row[FIELD["dead_units"]] >= 1 and row[FIELD["spread_count"]] == x.numel()


@pytest.mark.parametrize("device", DEVICES)
def test_bool_rows_are_exact(device: str) -> None:
    x = torch.tensor([[True, False, True], [False, False, True]])
    row = summarize(x.to(device), batched=True)
    np.testing.assert_array_equal(row, reference_row(x.numpy(), batched=True))
    assert row[FIELD["zeros"]] == 3 and row[FIELD["sum"]] == 3 and row[FIELD["dead_units"]] == 1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(0,), (0, 5), (4, 0), (2, 0, 3)])
def test_empty_tensor_is_the_merge_identity_with_count_zero(shape: tuple[int, ...], device: str) -> None:
    row = summarize(torch.zeros(shape, device=device), batched=True, bounds=(-1.0, 1.0))
    np.testing.assert_array_equal(row, identity_row())
    assert row[FIELD["count"]] == 0 and row[FIELD["min"]] == np.inf and row[FIELD["max"]] == -np.inf


# ---- non-finite values ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16], ids=str)
def test_nan_and_inf_are_counted_and_moments_cover_finite_elements(dtype: torch.dtype, device: str) -> None:
    x = random_tensor((6, 10), seed=7, dtype=dtype)
    x[0, 0] = x[3, 5] = x[5, 9] = float("nan")
    x[1, 1] = x[2, 2] = float("inf")
    x[4, 3] = float("-inf")
    x[:, 7] = float("nan")  # a unit that is NaN everywhere: not dead
    x[:, 8] = 0.0  # a dead unit
    row = summarize(x.to(device), batched=True, bounds=(-1.0, 1.0))
    expected = reference_row(host(x), batched=True, bounds=(-1.0, 1.0))
    assert_row(row, expected, rtol=2e-6)
    assert row[FIELD["nan"]] == 3 + 6  # three single NaNs and the NaN column
    assert row[FIELD["inf"]] == 3
    assert row[FIELD["dead_units"]] == 1
    assert np.isfinite(row[[FIELD[m] for m in MOMENTS]]).all()


@pytest.mark.parametrize("device", DEVICES)
def test_float32_values_whose_squares_overflow_give_exact_float64_sums(device: str) -> None:
    generator = torch.Generator().manual_seed(2)
    x = (1e30 * (1 + 0.1 * torch.randn(64, generator=generator))).to(torch.float32)
    x[::3] *= -1
    a = x.numpy()
    with np.errstate(over="ignore"):
        assert not np.isfinite(np.dot(a, a)), "the test data must overflow float32"
    row = summarize(x.to(device))
    expected = reference_row(a.astype(np.float64))
    for name in MOMENTS:
        np.testing.assert_allclose(row[FIELD[name]], expected[FIELD[name]], rtol=1e-12)
    assert row[FIELD["nan"]] == row[FIELD["inf"]] == 0
    assert row[FIELD["min"]] == expected[FIELD["min"]] and row[FIELD["max"]] == expected[FIELD["max"]]


@pytest.mark.parametrize("scale", [1e-17, 1e-22, 1e-24, 1e-30, 1e-36])
@pytest.mark.parametrize("size", [2048, 70_000])  # one kernel call; work items shared by a thread team
def test_float32_values_whose_squares_underflow_give_exact_float64_sums(scale: float, size: int) -> None:
    """Float32 squares of |x| < 1e-19 fall below the smallest normal float32 (a vanishing gradient's): summed
    in float32 their Σx² read 0 or lost its digits, and so did rms, std and l2."""
    x = (scale * torch.randn(size, generator=torch.Generator().manual_seed(3))).to(torch.float32)
    expected = reference_row(host(x))
    rows = [summarize(x), summarize(x.view(64, -1) if size % 64 == 0 else x, batched=size % 64 == 0)]
    reducer = Reducer()
    reducer.add_many([x, x * 2])
    rows += list(reducer.collect())
    for row, factor in zip(rows, (1, 1, 1, 2)):
        np.testing.assert_allclose(row[FIELD["sum_sq"]], expected[FIELD["sum_sq"]] * factor ** 2, rtol=1e-6)
        np.testing.assert_allclose(derive_one(row[None], "rms")[0], factor * np.sqrt(np.mean(host(x) ** 2)),
                                   rtol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_overflowing_values_mixed_with_nan_and_inf(device: str) -> None:
    x = torch.tensor([3e38, 3e38, -3e38, float("nan"), float("inf"), 1.0, 0.0], dtype=torch.float32)
    row = summarize(x.to(device))
    expected = reference_row(host(x))
    np.testing.assert_allclose(row[[FIELD[m] for m in MOMENTS]], expected[[FIELD[m] for m in MOMENTS]],
                               rtol=1e-12)
    assert row[FIELD["nan"]] == 1 and row[FIELD["inf"]] == 1 and row[FIELD["zeros"]] == 1
    assert row[FIELD["sum"]] == pytest.approx(3e38 + 1.0, rel=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_all_nan_tensor_has_no_finite_moments(device: str) -> None:
    x = torch.full((3, 4), float("nan"), device=device)
    row = summarize(x, batched=True)
    np.testing.assert_array_equal(row, reference_row(host(x), batched=True))
    assert row[FIELD["nan"]] == 12 and row[FIELD["sum"]] == 0 and row[FIELD["dead_units"]] == 0
    stats = derive(row[None])
    assert np.isnan(stats["mean"][0]) and np.isnan(stats["min"][0]) and np.isnan(stats["l2"][0])
    assert stats["nonfinite"][0] == 12 and stats["nonfinite_fraction"][0] == 1.0


# ---- several tensors in one reducer -------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_rows_come_back_in_the_order_of_add(device: str) -> None:
    with_nan = random_tensor((5, 4), seed=1)
    with_nan[2, 2] = float("nan")
    tensors = [
        (random_tensor((8, 3), seed=2), True, None),
        (with_nan, True, None),
        (torch.zeros(0), False, None),
        (torch.tanh(random_tensor((8, 6), seed=3)), True, (-1.0, 1.0)),
        (torch.arange(10, dtype=torch.int64), False, None),
        (random_tensor((), seed=4, dtype=torch.float64), False, None),
        (torch.full((3,), 1e30), False, None),
    ]
    reducer = Reducer()
    indices = [reducer.add(t.to(device), batched=b, bounds=bounds) for t, b, bounds in tensors]
    assert indices == list(range(len(tensors))) and len(reducer) == len(tensors)
    rows = reducer.collect()
    assert rows.shape == (len(tensors), NUM_FIELDS)
    for row, (t, b, bounds) in zip(rows, tensors):
        assert_row(row, reference_row(host(t), batched=b, bounds=bounds), rtol=2e-6)
    assert len(reducer) == 0
    assert reducer.collect().shape == (0, NUM_FIELDS)
    reducer.add(torch.ones(2, device=device))
    again = reducer.collect()
    assert again.shape == (1, NUM_FIELDS) and again[0, FIELD["sum"]] == 2.0


# ---- dead units and saturation ------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(6, 10), (5, 4, 3), (4, 3, 2, 5), (4, 3, 5, 6, 2)], ids=lambda s: f"rank{len(s)}")
def test_dead_units_are_positions_zero_over_the_whole_batch(shape: tuple[int, ...], device: str) -> None:
    generator = torch.Generator().manual_seed(len(shape))
    x = torch.randn(shape, generator=generator) + 0.01
    units = x.view(shape[0], -1)
    dead = [0, 3, units.shape[1] - 1]
    units[:, dead] = 0.0
    units[0, 3] = -0.0  # negative zero is zero
    units[1:, 1] = 0.0  # zero in every sample but the first: alive
    units[0, 2] = 0.0  # zero in one sample only: alive
    row = summarize(x.to(device), batched=True)
    assert row[FIELD["units"]] == units.shape[1]
    assert row[FIELD["dead_units"]] == len(dead)
    assert row[FIELD["zeros"]] == len(dead) * shape[0] + (shape[0] - 1) + 1
    assert_row(row, reference_row(x.numpy(), batched=True), rtol=2e-6)
    assert derive(row[None])["dead_fraction"][0] == pytest.approx(len(dead) / units.shape[1])


def test_a_one_dimensional_batched_tensor_is_one_unit() -> None:
    assert summarize(torch.zeros(5), batched=True)[FIELD["dead_units"]] == 1
    row = summarize(torch.tensor([0.0, 0.0, 1.0]), batched=True)
    assert row[FIELD["units"]] == 1 and row[FIELD["dead_units"]] == 0


@pytest.mark.parametrize("device", DEVICES)
def test_saturation_counts_elements_within_the_margin_of_either_bound(device: str) -> None:
    threshold = np.float32(0.99)
    just_below = np.nextafter(threshold, np.float32(0))
    explicit = np.array([0.99, -0.99, just_below, -just_below, 0.995, -1.0, 1.0, 0.5, 0.0, -0.3],
                        dtype=np.float32)
    generator = torch.Generator().manual_seed(9)
    values = np.concatenate([explicit, torch.tanh(3 * torch.randn(500, generator=generator)).numpy()])
    row = summarize(torch.from_numpy(values).to(device), bounds=(-1.0, 1.0))
    a = values.astype(np.float64)
    assert row[FIELD["bounded"]] == values.size
    assert row[FIELD["saturated"]] == np.count_nonzero(np.abs(a) >= 0.99)
    assert row[FIELD["saturated"]] == reference_row(a, bounds=(-1.0, 1.0))[FIELD["saturated"]]
    explicit_row = summarize(torch.from_numpy(explicit).to(device), bounds=(-1.0, 1.0))
    assert explicit_row[FIELD["saturated"]] == 5  # ±0.99, 0.995, ±1.0
    assert derive(explicit_row[None])["saturated_fraction"][0] == pytest.approx(0.5)


@pytest.mark.parametrize("device", DEVICES)
def test_saturated_units_are_saturated_in_every_sample(device: str) -> None:
    x = torch.tensor([
        [0.995, 0.999, -0.995, 0.1],
        [1.000, 0.999, 0.996, 0.2],
        [0.992, 0.500, -0.999, 0.9],
        [0.999, 0.999, 0.995, -0.99],
        [0.993, 0.999, -1.000, 0.0],
    ])
    row = summarize(x.to(device), batched=True, bounds=(-1.0, 1.0))
    assert row[FIELD["saturated_units"]] == 2  # columns 0 and 2 (either bound counts)
    assert row[FIELD["saturated"]] == 5 + 4 + 5 + 1
    assert_row(row, reference_row(x.numpy(), batched=True, bounds=(-1.0, 1.0)), rtol=2e-6)
    assert derive(row[None])["saturated_unit_fraction"][0] == 0.5


@pytest.mark.parametrize("device", DEVICES)
def test_sigmoid_bounds_and_a_custom_margin(device: str) -> None:
    x = torch.tensor([0.004, 0.0049, 0.006, 0.5, 0.994, 0.9951, 1.0])
    assert summarize(x.to(device), bounds=(0.0, 1.0))[FIELD["saturated"]] == 4
    wide = summarize(torch.tensor([0.1, 0.25, 1.0, 1.85, 1.9, 2.0]).to(device), bounds=(0.0, 2.0),
                     saturation_margin=0.1)
    assert wide[FIELD["saturated"]] == 4  # within 0.2 of 0 or of 2
    assert summarize(x.to(device))[FIELD["bounded"]] == 0 and summarize(x)[FIELD["saturated"]] == 0


def test_saturation_bounds_follow_the_producing_activation() -> None:
    x = torch.randn(3, 4, requires_grad=True)
    assert saturation_bounds(torch.tanh(x)) == (-1.0, 1.0)
    assert saturation_bounds(torch.sigmoid(x)) == (0.0, 1.0)
    assert saturation_bounds(torch.softmax(x, dim=1)) == (0.0, 1.0)
    assert saturation_bounds(torch.nn.functional.softmax(x, dim=-1)) == (0.0, 1.0)
    assert saturation_bounds(torch.relu(x)) is None
    assert saturation_bounds(x) is None
    assert saturation_bounds(torch.tanh(x).detach()) is None
    with torch.no_grad():
        assert saturation_bounds(torch.tanh(x)) is None


# ---- the device path, run on CPU tensors ---------------------------------------------------------------------
@pytest.fixture()
def device_reductions(monkeypatch: pytest.MonkeyPatch) -> None:
    """Send CPU tensors down the device path (fused torch reductions queued as scalars, one host copy in
    ``collect``, flagged rows recomputed there), which otherwise runs only on an accelerator."""
    monkeypatch.setattr(kernels, "AVAILABLE", False)
    monkeypatch.setattr(reduce_module, "_HOST_DEVICE", "no host")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
                                   torch.bool, torch.complex64], ids=str)
def test_the_device_reductions_equal_numpy_for_every_dtype(dtype: torch.dtype, device_reductions) -> None:
    """Complex tensors are summarised by magnitude, half precision in float32, integers and booleans as values."""
    x = random_tensor((9, 4, 5), seed=13, dtype=torch.float64)
    x[:, 1, 2] = x[0, 1, 2]  # a unit identical in every sample
    if dtype is torch.complex64:
        x = torch.complex(x, random_tensor((9, 4, 5), seed=14, dtype=torch.float64)).to(dtype)
        values = x.abs().double().numpy()
    else:
        x = (x > 0) if dtype is torch.bool else (x * 1000 if dtype is torch.int64 else x).to(dtype)
        values = host(x)
    row = summarize(x, batched=True)
    assert_row(row, reference_row(values, batched=True), rtol=1e-12 if dtype in (torch.float64, torch.int64, torch.bool)
               else 2e-6)
    assert row[FIELD["spread_count"]] == x.numel() and row[FIELD["spread_dev_sq"]] > 0


@pytest.mark.parametrize("shape", [(6, 10), (1, 10), (10,)], ids=str)
def test_the_device_reductions_recompute_a_spread_with_nan_exactly(shape: tuple[int, ...], device_reductions) -> None:
    x = random_tensor(shape, seed=15)
    x.view(shape[0], -1)[0, -1] = float("nan")
    x.view(shape[0], -1)[-1, 0] = float("inf")
    row = summarize(x, batched=True)
    assert_row(row, reference_row(host(x), batched=True), rtol=1e-12)
    assert row[FIELD["spread_count"]] == {(6, 10): 6 * 8, (1, 10): 0, (10,): 0}[shape]  # the clean units


# ---- merging and deriving -----------------------------------------------------------------------------------
def nasty_data(seed: int) -> np.ndarray:
    generator = torch.Generator().manual_seed(seed)
    a = torch.randn(12, 5, generator=generator).numpy().astype(np.float64)
    a[a > 1.5] = 0.0
    a[1, 1], a[4, 0], a[7, 3], a[10, 4] = np.nan, np.inf, -np.inf, np.nan
    a[5:8, 2] = 1e30
    return a


@pytest.mark.parametrize("cuts", [[6], [1, 5, 11], [3, 4, 8]])
def test_streamed_statistics_equal_numpy_on_the_concatenated_data(cuts: list[int]) -> None:
    a = nasty_data(0)
    parts = np.split(a, cuts)
    rows = np.stack([summarize(torch.from_numpy(p), bounds=(-1.0, 1.0)) for p in parts])
    merged = merge_rows(rows)
    expected = reference_row(a, bounds=(-1.0, 1.0))
    assert_row(merged, expected, rtol=1e-12)
    np.testing.assert_allclose(merged, summarize(torch.from_numpy(a), bounds=(-1.0, 1.0)), rtol=1e-12)
    stats = derive(merged[None])
    finite = a[np.isfinite(a)]
    assert stats["mean"][0] == pytest.approx(finite.mean(), rel=1e-12)
    assert stats["nonfinite"][0] == 4


def test_merging_batched_parts_sums_units_like_iterations() -> None:
    a = nasty_data(1)
    a[:, 3] = 0.0
    parts = np.split(a, [4, 8])
    rows = np.stack([summarize(torch.from_numpy(p), batched=True) for p in parts])
    merged = merge_rows(rows)
    whole = reference_row(a, batched=True)
    for name in ("count", "nan", "inf", "zeros", "min", "max"):
        assert merged[FIELD[name]] == whole[FIELD[name]]
    assert merged[FIELD["units"]] == 3 * 5
    assert merged[FIELD["dead_units"]] == sum(reference_row(p, batched=True)[FIELD["dead_units"]] for p in parts)


def test_merging_batches_pools_their_within_batch_deviation() -> None:
    """Iterations (or devices) with batches of their own: the merged spread is each batch's deviation from
    its own units' means, summed, over the units clean in that batch, exactly as numpy pools them."""
    a = nasty_data(5)
    a[4:8, 1] = a[4, 1]  # one unit collapsed in the second batch only
    parts = np.split(a, [4, 8, 10])
    rows = np.stack([summarize(torch.from_numpy(p), batched=True) for p in parts])
    merged = merge_rows(rows)
    count = sum_sq = deviation = 0.0
    for p in parts:
        kept = p[:, np.isfinite(p).all(axis=0)]
        count, sum_sq = count + kept.size, sum_sq + (kept * kept).sum()
        deviation += ((kept - kept.mean(axis=0)) ** 2).sum()
    assert merged[FIELD["spread_count"]] == count == 4 * 4 + 4 * 3 + 2 * 5 + 2 * 4  # batch × clean units
    np.testing.assert_allclose(merged[[FIELD["spread_sum_sq"], FIELD["spread_dev_sq"]]], [sum_sq, deviation],
                               rtol=1e-12)
    stats = derive(merged[None])
    assert stats["sample_spread"][0] == pytest.approx(deviation / sum_sq, rel=1e-12)
    assert stats["sample_spread_rms"][0] == pytest.approx(np.sqrt(deviation / count), rel=1e-12)
    with_identity = merge_rows(np.stack([identity_row(), rows[0], identity_row()]))
    np.testing.assert_array_equal(with_identity, rows[0])


def test_merge_rows_along_another_axis_and_the_field_axis_is_refused() -> None:
    a = nasty_data(2)
    rows = np.stack([[summarize(torch.from_numpy(a[i:i + 3, j])) for j in range(5)] for i in (0, 3, 6, 9)])
    assert rows.shape == (4, 5, NUM_FIELDS)
    per_column = merge_rows(rows, axis=0)
    for j in range(5):
        assert_row(per_column[j], reference_row(a[:, j]), rtol=1e-12)
    np.testing.assert_array_equal(merge_rows(rows, axis=-3), per_column)
    with pytest.raises(ValueError, match="field axis"):
        merge_rows(rows, axis=-1)
    with pytest.raises(ValueError, match=str(NUM_FIELDS)):
        merge_rows(np.zeros((3, NUM_FIELDS - 1)))


def test_merge_rows_with_the_identity_changes_nothing() -> None:
    row = summarize(torch.from_numpy(nasty_data(3)))
    np.testing.assert_array_equal(merge_rows(np.stack([identity_row(), row, identity_row()])), row)


def test_merge_groups_merges_rows_sharing_a_key() -> None:
    a = nasty_data(4)
    keys = np.array([3, 1, 3, 2, 1, 3])
    chunks = np.split(a, 6)
    rows = np.stack([summarize(torch.from_numpy(c)) for c in chunks])
    unique, merged = merge_groups(keys, rows)
    assert unique.tolist() == [1, 2, 3]
    for key, row in zip(unique, merged):
        expected = reference_row(np.concatenate([c for k, c in zip(keys, chunks) if k == key]))
        assert_row(row, expected, rtol=1e-12)


def test_merge_groups_with_unique_keys_sorts_the_rows() -> None:
    rows = np.stack([summarize(torch.full((2,), float(v))) for v in (5.0, 7.0, 6.0)])
    keys, merged = merge_groups(np.array([20, 0, 10]), rows)
    assert keys.tolist() == [0, 10, 20]
    assert merged[:, FIELD["sum"]].tolist() == [14.0, 12.0, 10.0]


def test_derived_statistics_equal_numpy() -> None:
    generator = torch.Generator().manual_seed(8)
    x = torch.tanh(2 * torch.randn(16, 6, generator=generator, dtype=torch.float64))
    x[:, 2] = 0.0
    x[x.abs() < 0.05] = 0.0
    x[3, 4], x[9, 1] = float("nan"), float("-inf")
    stats = derive(summarize(x, batched=True, bounds=(-1.0, 1.0))[None])
    a = x.numpy()
    finite = a[np.isfinite(a)]
    clean = a[:, [0, 2, 3, 5]]  # the units without NaN or Inf
    deviation = ((clean - clean.mean(axis=0)) ** 2).sum()
    expected = {
        "count": a.size,
        "nonfinite": 2,
        "nan": 1,
        "inf": 1,
        "mean": finite.mean(),
        "std": finite.std(),
        "abs_mean": np.abs(finite).mean(),
        "abs_max": np.abs(finite).max(),
        "min": finite.min(),
        "max": finite.max(),
        "l2": np.sqrt((finite ** 2).sum()),
        "rms": np.sqrt((finite ** 2).mean()),
        "zero_fraction": (a == 0).sum() / a.size,
        "nonfinite_fraction": 2 / a.size,
        "dead_fraction": 1 / 6,
        "saturated_fraction": ((a <= -0.99) | (a >= 0.99)).sum() / a.size,
        "saturated_unit_fraction": ((a <= -0.99) | (a >= 0.99)).all(axis=0).sum() / 6,
        "sample_spread": deviation / (clean ** 2).sum(),
        "sample_spread_rms": np.sqrt(deviation / clean.size),
    }
    assert set(expected) == set(STATISTICS)
    for name, value in expected.items():
        assert stats[name].shape == (1,)
        assert stats[name][0] == pytest.approx(value, rel=1e-12, abs=1e-15), name
        np.testing.assert_array_equal(derive_one(summarize(x, batched=True, bounds=(-1.0, 1.0)), name),
                                      stats[name][0])
    assert 0 < expected["saturated_fraction"] < 1


def test_derive_on_rows_of_any_leading_shape_and_on_the_identity() -> None:
    rows = np.stack([[summarize(torch.tensor([1.0, 3.0])), identity_row()]] * 3)
    stats = derive(rows)
    assert stats["mean"].shape == (3, 2)
    np.testing.assert_array_equal(stats["mean"][:, 0], 2.0)
    np.testing.assert_array_equal(stats["std"][:, 0], 1.0)
    for name in ("mean", "std", "abs_mean", "abs_max", "min", "max", "l2", "zero_fraction", "dead_fraction",
                 "saturated_fraction", "sample_spread", "sample_spread_rms"):
        assert np.isnan(stats[name][:, 1]).all(), name
    assert (stats["count"][:, 1] == 0).all() and (stats["nonfinite"][:, 1] == 0).all()


def test_derive_one_names_the_valid_statistics() -> None:
    with pytest.raises(KeyError, match="abs_mean"):
        derive_one(identity_row()[None], "average")


def test_std_is_the_population_std_of_the_finite_elements() -> None:
    row = summarize(torch.tensor([2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0, float("nan")]))
    assert derive_one(row, "std") == pytest.approx(2.0)
    assert derive_one(row, "mean") == pytest.approx(5.0)


def test_reducing_overflowing_data_is_silent_under_strict_numpy_and_warning_settings() -> None:
    """Training scripts that run with ``np.seterr(all="raise")`` or ``-W error`` must not see the recorder's
    float32 overflow, which it handles itself by recomputing the row in float64."""
    import warnings

    x = torch.tensor([3e38, 3e38, 1e30, float("inf"), float("-inf"), float("nan"), 0.0], dtype=torch.float32)
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")
        row = summarize(x, batched=True, bounds=(-1.0, 1.0))
        merged = merge_rows(np.stack([row, summarize(torch.full((4,), 1e30))]))
    assert_row(row, reference_row(host(x), batched=True, bounds=(-1.0, 1.0)), rtol=1e-12)
    assert merged[FIELD["count"]] == 11 and merged[FIELD["inf"]] == 2


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("offset, spread, size", [(1.0, 1e-4, 4096), (100.0, 0.01, 100_000), (-3e3, 1.0, 1000),
                                                  (0.5, 0.02, 64 * 256)])
def test_std_is_right_when_the_mean_dwarfs_the_spread(offset: float, spread: float, size: int, device: str) -> None:
    """A LayerNorm gain (1 ± 1e-4) or a sigmoid output: Σx²/n - mean² cancels badly in float32 sums."""
    generator = torch.Generator().manual_seed(size)
    x = (offset + spread * torch.randn(size, generator=generator, dtype=torch.float64)).to(torch.float32)
    stats = derive(summarize(x.to(device), batched=True)[None])
    a = x.double().numpy()
    assert stats["std"][0] == pytest.approx(a.std(), rel=1e-4)
    assert stats["mean"][0] == pytest.approx(a.mean(), rel=1e-9)
    assert stats["l2"][0] == pytest.approx(np.sqrt((a ** 2).sum()), rel=1e-9)


@pytest.mark.parametrize("device", DEVICES)
def test_a_constant_tensor_has_no_spread(device: str) -> None:
    for value in (0.1, 1.0, -7.3, 1e6):
        stats = derive(summarize(torch.full((3000,), value, device=device))[None])
        assert stats["std"][0] <= 1e-7 * abs(value), value
        assert stats["mean"][0] == pytest.approx(np.float32(value), rel=1e-12)


def test_add_many_refuses_flags_starts_or_copies_that_do_not_pair_up_with_the_tensors() -> None:
    """One batched flag, start and copy per tensor: a shorter list would describe arrays the compiled pass
    reads past; it is refused before any row is claimed."""
    reducer = Reducer()
    tensors = [torch.ones(4, 2), torch.ones(3)]
    for options in ({"batched": [True]}, {"starts": [torch.zeros(4, 2)]}, {"copies": [torch.zeros(4, 2)] * 3}):
        with pytest.raises(ValueError, match="one batched flag, start and copy per tensor"):
            reducer.add_many(tensors, **options)
    assert len(reducer) == 0
    assert reducer.add_many(tensors, batched=[True, False]) == [0, 1]

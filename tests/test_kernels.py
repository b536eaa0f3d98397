"""The compiled single-pass kernels (``stats.kernels``, ``stats.compiled``) and ``Reducer.add_many`` against
numpy in float64.

The kernels take liberties for speed (float32 partial sums, fast-math, min/max from bit patterns, no NaN
checks); these tests pin down where that is safe: block boundaries, signs and signed zeros, integer data,
a mean that dwarfs the spread, values whose squares overflow, the fused copy and difference, and the sample
spread of identical, nearly identical and non-finite samples.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from comgra_ndbg.stats import kernels
from comgra_ndbg.stats.host import lean, lean_flags
from comgra_ndbg.stats.reducer import Reducer, summarize
from comgra_ndbg.stats.statistics import derive
from comgra_ndbg.store.schema import FIELD, identity_row

pytestmark = pytest.mark.skipif(not kernels.AVAILABLE, reason="numba is not installed")

MOMENT_FIELDS = ("zeros", "sum", "sum_sq", "sum_abs", "min", "max")


def reference(values: np.ndarray) -> dict[str, float]:
    w = np.asarray(values, dtype=np.float64).reshape(-1)
    return {"zeros": float((w == 0).sum()), "sum": float(w.sum()), "sum_sq": float((w * w).sum()),
            "sum_abs": float(np.abs(w).sum()), "min": float(w.min()), "max": float(w.max())}


def check(row: np.ndarray, values: np.ndarray, *, rtol: float) -> None:
    expected = reference(values)
    scale = float(np.abs(np.asarray(values, dtype=np.float64)).sum()) or 1.0
    for name in ("zeros", "min", "max"):
        assert row[FIELD[name]] == expected[name], (name, row[FIELD[name]], expected[name])
    np.testing.assert_allclose(row[FIELD["sum"]], expected["sum"], rtol=rtol, atol=rtol * scale)
    np.testing.assert_allclose(row[FIELD["sum_sq"]], expected["sum_sq"], rtol=rtol)
    np.testing.assert_allclose(row[FIELD["sum_abs"]], expected["sum_abs"], rtol=rtol)


def assert_row_close(row: np.ndarray, expected: np.ndarray) -> None:
    """Rows of one tensor from two summary paths: a sum near zero gets a tolerance relative to the sum of
    magnitudes (float32 block sums may differ in their last bits between compiled copies of a kernel, and
    ``add_many`` may cut a large tensor into pieces for several threads); everything else 2e-6."""
    with np.errstate(invalid="ignore"):
        assert abs(row[FIELD["sum"]] - expected[FIELD["sum"]]) <= 1e-6 * expected[FIELD["sum_abs"]] + 1e-9 or (
            np.isnan(row[FIELD["sum"]]) and np.isnan(expected[FIELD["sum"]]))
    others = [i for i in range(len(row)) if i != FIELD["sum"]]
    np.testing.assert_allclose(row[others], expected[others], rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("size", [1, 2, 63, 64, 65, kernels.BLOCK - 1, kernels.BLOCK, kernels.BLOCK + 1,
                                  3 * kernels.BLOCK + 17, 250_000])
def test_moments_equal_numpy_across_block_boundaries(size: int, dtype: type) -> None:
    a = np.random.default_rng(size).standard_normal(size).astype(dtype)
    row = identity_row()
    assert kernels.moments(a, row) is False
    check(row, a, rtol=2e-6 if dtype is np.float32 else 1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("case", ["negative", "positive", "signed zeros", "one negative", "tiny", "huge"])
def test_minimum_and_maximum_from_bit_patterns_are_exact(case: str, dtype: type) -> None:
    rng = np.random.default_rng(1)
    a = {
        "negative": -np.abs(rng.standard_normal(1000)) - 0.5,
        "positive": np.abs(rng.standard_normal(1000)) + 0.5,
        "signed zeros": np.array([0.0, -0.0, 0.0, -0.0]),
        "one negative": np.concatenate([np.abs(rng.standard_normal(999)), [-1e-30]]),
        "tiny": rng.standard_normal(1000) * 1e-40,  # subnormal in float32
        "huge": rng.standard_normal(1000) * 1e18,
    }[case].astype(dtype)
    row = identity_row()
    kernels.moments(a, row)
    assert row[FIELD["min"]] == a.min() and row[FIELD["max"]] == a.max()
    assert row[FIELD["zeros"]] == (a == 0).sum()


def test_integer_valued_data_is_summed_exactly() -> None:
    a = np.random.default_rng(2).integers(-1000, 1000, 100_000).astype(np.float64)
    row = identity_row()
    kernels.moments(a, row)
    for name, value in reference(a).items():
        assert row[FIELD[name]] == value, name


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_a_mean_that_dwarfs_the_spread_keeps_the_variance(dtype: type) -> None:
    a = (1.0 + 1e-4 * np.random.default_rng(3).standard_normal(100_000)).astype(dtype)
    row = identity_row()
    assert kernels.moments(a, row) is False
    n = a.size
    variance = row[FIELD["sum_sq"]] / n - (row[FIELD["sum"]] / n) ** 2
    np.testing.assert_allclose(variance, a.astype(np.float64).var(), rtol=1e-3)


def test_probes_that_all_hit_an_outlier_still_give_the_right_mean_and_spread() -> None:
    a = np.full(4096, 1.0, dtype=np.float32)
    a[::64] = 1e6  # every probe is the outlier: the sums are shifted far from most elements
    a[1::64] = 1.0 + 1e-3
    row = identity_row()
    exact = kernels.moments(a, row)
    if not exact:  # trusted shifted sums carry float32 rounding only, well below what the statistics show
        n, wide = a.size, a.astype(np.float64)
        mean = row[FIELD["sum"]] / n
        np.testing.assert_allclose(mean, wide.mean(), rtol=1e-4)
        np.testing.assert_allclose(np.sqrt(row[FIELD["sum_sq"]] / n - mean ** 2), wide.std(), rtol=1e-3)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, 3e38])
def test_non_finite_values_and_overflowing_squares_ask_for_the_exact_recompute(bad: float) -> None:
    a = np.random.default_rng(4).standard_normal(10_000).astype(np.float32)
    a[1234] = bad
    assert kernels.moments(a, identity_row()) is True


def test_the_fused_copy_is_exact_and_the_moments_are_those_of_the_source() -> None:
    a = np.random.default_rng(5).standard_normal(70_001).astype(np.float32)
    target = np.full_like(a, np.nan)
    row = identity_row()
    kernels.moments(a, row, copy_to=target)
    np.testing.assert_array_equal(target, a)
    check(row, a, rtol=2e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_the_difference_is_summarised_without_materialising_it(dtype: type) -> None:
    rng = np.random.default_rng(6)
    before = rng.standard_normal(70_001).astype(dtype)
    after = (before + 1e-3 * rng.standard_normal(before.size)).astype(dtype)
    after[::7] = before[::7]  # unchanged elements are zeros of the difference
    row = identity_row()
    kernels.moments(after, row, start=before)
    check(row, after - before, rtol=2e-6 if dtype is np.float32 else 1e-12)


def test_units_count_dead_and_saturated_units_and_nan_is_alive() -> None:
    a = np.array([[0.0, 0.999, np.nan, -0.0, 0.5],
                  [-0.0, 0.998, 0.0, 0.0, -0.9999]], dtype=np.float32)
    row = identity_row()
    kernels.units(a, row, (-0.99, 0.99))
    counts = {f: int(row[FIELD[f]]) for f in ("units", "dead_units", "bounded", "saturated", "saturated_units")}
    assert counts == {"units": 5, "dead_units": 2, "bounded": 10, "saturated": 3, "saturated_units": 1}


def test_add_many_equals_add_one_by_one_and_keeps_the_order() -> None:
    rng = torch.Generator().manual_seed(7)
    tensors = [torch.randn(300, 200, generator=rng), torch.randn(5, generator=rng, dtype=torch.float64),
               torch.randn(64, 32, generator=rng).t(),  # not contiguous: summarised one by one
               torch.randn(10, generator=rng).half(),  # no kernel dtype: one by one
               torch.zeros(0), torch.randn(7, generator=rng), torch.tensor([1.0, float("nan")])]
    reducer = Reducer()
    first = reducer.add(torch.ones(3))
    indices = reducer.add_many(tensors)
    rows = reducer.collect()
    assert first == 0 and indices == list(range(1, len(tensors) + 1))
    for tensor, index in zip(tensors, indices):
        assert_row_close(rows[index], summarize(tensor))
    assert rows[indices[-1], FIELD["nan"]] == 1 and rows[indices[-1], FIELD["sum"]] == 1.0


def test_lean_flags_read_all_tensors_at_once_as_lean_reads_each() -> None:
    """The C-level passes of ``lean_flags`` decide as ``lean`` does, also for layouts that have no strides
    (a sparse CSR tensor refuses ``is_contiguous``: the flags then fall back to ``lean`` one by one)."""
    tensors = [torch.ones(2, 3), torch.ones(2, 3).t(), torch._neg_view(torch.ones(3)), torch.zeros(0),
               torch.ones(3, dtype=torch.float16), torch.arange(3), torch.ones(2, 2, dtype=torch.float64),
               torch.ones(2, device="meta"), torch.eye(2).to_sparse()]
    expected = [lean(t) for t in tensors]
    assert lean_flags(tensors) == expected == [True, False, False, False, False, False, True, False, False]
    csr = torch.eye(2).to_sparse_csr()
    with pytest.raises(RuntimeError):
        lean(csr)
    assert lean_flags([torch.ones(2), csr.half()]) == [True, False]


def test_add_many_copies_and_differences_pair_up_with_their_tensors() -> None:
    rng = torch.Generator().manual_seed(8)
    params = [torch.randn(256, 256, generator=rng), torch.randn(256, generator=rng), torch.randn(3, 3, generator=rng)]
    buffers = [torch.full_like(p, float("nan")) for p in params]
    reducer = Reducer()
    values = reducer.add_many(params, copies=buffers)
    for p, b in zip(params, buffers):
        torch.testing.assert_close(b, p, rtol=0, atol=0)
        p.add_(0.01 * torch.randn(p.shape, generator=rng))
    updates = reducer.add_many(params, starts=buffers)
    rows = reducer.collect()
    for p, b, v, u in zip(params, buffers, values, updates):
        assert_row_close(rows[u], summarize(p - b))
        assert_row_close(rows[v], summarize(b))


def test_a_lazily_negated_view_is_summarised_with_its_sign() -> None:
    values = torch.tensor([0.0, 1.0, 2.0, 3.0])
    negated = torch._neg_view(values)  # memory holds +x, the tensor means -x
    assert negated.is_neg()
    reducer = Reducer()
    indices = reducer.add_many([negated]) + [reducer.add(negated)]
    rows = reducer.collect()
    for index in indices:
        assert rows[index, FIELD["sum"]] == -6.0 and rows[index, FIELD["min"]] == -3.0


# ---- the sample spread -------------------------------------------------------------------------------------
def spread_reference(a: np.ndarray) -> tuple[float, float, float]:
    """(elements, Σx², Σ squared deviations from each unit's mean over the batch) of the units of a
    ``[batch, units]`` array that hold no NaN or Inf, in float64, two passes."""
    w = np.asarray(a, dtype=np.float64)
    kept = w[:, np.isfinite(w).all(axis=0)]
    return float(kept.size), float((kept * kept).sum()), float(((kept - kept.mean(axis=0)) ** 2).sum())


def spread_of(row: np.ndarray) -> tuple[float, float, float]:
    return tuple(float(row[FIELD[f]]) for f in ("spread_count", "spread_sum_sq", "spread_dev_sq"))


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("shape", [(2, 1), (2, 3), (64, 256), (3, kernels.ROWS + 5), (kernels.ROWS + 3, 2),
                                   (2 * kernels.ROWS + 1, 3)], ids=str)
def test_the_sample_spread_equals_numpy_across_row_and_column_blocks(shape: tuple[int, int], dtype: type) -> None:
    rng = np.random.default_rng(shape[0] * 7 + shape[1])
    a = (rng.standard_normal(shape) * rng.uniform(0.1, 3.0, shape[1]) + rng.standard_normal(shape[1])).astype(dtype)
    row = identity_row()
    assert kernels.summarize(a, row, None, True) is False
    count, sum_sq, deviation = spread_reference(a)
    assert row[FIELD["spread_count"]] == count == a.size
    assert row[FIELD["spread_sum_sq"]] == row[FIELD["sum_sq"]]
    rtol = 1e-6 if dtype is np.float32 else 1e-12
    np.testing.assert_allclose(row[FIELD["spread_sum_sq"]], sum_sq, rtol=rtol)
    np.testing.assert_allclose(row[FIELD["spread_dev_sq"]], deviation, rtol=rtol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_identical_samples_have_no_spread_and_centred_units_all_of_it(dtype: type) -> None:
    rng = np.random.default_rng(1)
    sample = rng.standard_normal(300)
    sample = (sample - sample.mean()) / sample.std()  # a LayerNorm output: mean 0 and std 1 in every sample
    collapsed = np.tile(sample, (64, 1)).astype(dtype)
    row = identity_row()
    assert kernels.summarize(collapsed, row, None, True) is False
    assert row[FIELD["spread_dev_sq"]] == 0.0 and row[FIELD["spread_count"]] == collapsed.size
    assert derive(row[None])["sample_spread"][0] == 0.0 and derive(row[None])["sample_spread_rms"][0] == 0.0
    mirrored = np.concatenate([collapsed[:32], -collapsed[:32]])  # every unit has mean 0 over the batch
    assert kernels.summarize(mirrored, row, None, True) is False
    assert derive(row[None])["sample_spread"][0] == pytest.approx(1.0, rel=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_nearly_identical_samples_keep_their_small_spread(dtype: type) -> None:
    """Collapse in progress: samples differ by 1e-4 of the units' values. Σx² − (Σx)²/n would cancel to
    nothing in float32; sums around each unit's first sample keep the spread to float32 rounding."""
    rng = np.random.default_rng(2)
    a = (3.0 + rng.standard_normal(256) + 1e-4 * rng.standard_normal((64, 256))).astype(dtype)
    row = identity_row()
    assert kernels.summarize(a, row, None, True) is False
    count, sum_sq, deviation = spread_reference(a)
    np.testing.assert_allclose(row[FIELD["spread_dev_sq"]], deviation, rtol=1e-5 if dtype is np.float32 else 1e-10)
    assert 1e-10 < derive(row[None])["sample_spread"][0] < 1e-8


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, 3e38])
def test_a_non_finite_or_overflowing_unit_asks_for_the_exact_recompute(bad: float) -> None:
    a = np.random.default_rng(3).standard_normal((16, 40)).astype(np.float32)
    a[5, 7] = bad
    assert kernels.summarize(a, identity_row(), None, True) is True
    if bad == 3e38:  # squares that fit float32 (Σx² = 3.38e38), a deviation from the first sample whose does not
        a[5, 7], a[0, 7], a[6, 7] = 0.5, 1.3e19, -1.3e19
        assert kernels.moments(a.reshape(-1), identity_row()) is False
        assert kernels.summarize(a, identity_row(), None, True) is True
        count, sum_sq, deviation = spread_reference(a)
        np.testing.assert_allclose(spread_of(summarize(torch.from_numpy(a), batched=True)), (count, sum_sq, deviation),
                                   rtol=1e-12)


def test_a_first_sample_far_from_the_others_asks_for_the_exact_recompute() -> None:
    a = np.full((256, 8), 5.0, dtype=np.float32)
    a[1:] += np.random.default_rng(4).standard_normal((255, 8)).astype(np.float32) * 1e-3
    a[0] = 100.0  # the shift: every other sample lies ~1e5 of their spread away from it
    row = identity_row()
    assert kernels.summarize(a, row, None, True) is True
    reduced = summarize(torch.from_numpy(a), batched=True)  # the reducer recomputes it in float64
    count, sum_sq, deviation = spread_reference(a)
    assert spread_of(reduced)[0] == count
    np.testing.assert_allclose(spread_of(reduced)[1:], (sum_sq, deviation), rtol=1e-12)


def test_units_holding_nan_or_inf_are_left_out_of_the_spread() -> None:
    a = torch.tensor([[1.0, float("nan"), 2.0, 0.0],
                      [3.0, 4.0, float("inf"), 0.0],
                      [5.0, 6.0, 2.0, 0.0]])
    row = summarize(a, batched=True)
    assert spread_of(row) == (6.0, 1.0 + 9.0 + 25.0, 8.0)  # units 0 and 3: deviations -2, 0, 2 and 0, 0, 0
    stats = derive(row[None])
    assert stats["sample_spread"][0] == 8.0 / 35.0 and stats["sample_spread_rms"][0] == (8.0 / 6.0) ** 0.5
    all_bad = summarize(torch.tensor([[float("nan")], [1.0]]), batched=True)
    assert spread_of(all_bad) == (0.0, 0.0, 0.0) and np.isnan(derive(all_bad[None])["sample_spread"][0])


@pytest.mark.parametrize("tensor,batched", [(torch.randn(1, 50), True), (torch.randn(4, 50), False),
                                            (torch.randn(()), True)], ids=["one sample", "batch-less", "scalar"])
def test_without_two_samples_the_spread_is_unknown_never_zero(tensor: torch.Tensor, batched: bool) -> None:
    row = summarize(tensor, batched=batched)
    assert spread_of(row) == (0.0, 0.0, 0.0)
    stats = derive(row[None])
    assert np.isnan(stats["sample_spread"][0]) and np.isnan(stats["sample_spread_rms"][0])


def test_squares_rounded_below_zero_give_an_rms_of_zero_without_a_warning() -> None:
    row = identity_row()
    row[FIELD["count"]], row[FIELD["sum"]], row[FIELD["sum_sq"]] = 4, 0.0, -1e-12  # the shifted sums' rounding
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        stats = derive(row[None])
    assert stats["rms"].tolist() == [0.0] and stats["l2"].tolist() == [0.0]

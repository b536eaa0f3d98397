"""The sample spread on every reduction path against one float64 numpy reference.

The same tensors go through each way a summary row can be made: the compiled kernels one tensor at a time
and many at a time (on one thread and on torch's shared team), numpy where numba is missing, the torch
reductions of the device path, the segmented reductions, and the float64 recompute. Each must give the
reference's fields; where the spread is unknown (no batch, one sample, no unit without NaN or ±Inf) each
must leave the fields at the merge identity, which derives NaN and never 0 (0 would read as a collapse).
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

from comgra_ndbg.recorder.snapshot import take_snapshot
from comgra_ndbg.stats import kernels, openmp, parallel, segmented
from comgra_ndbg.stats import reducer as reduce_module
from comgra_ndbg.stats.exact import exact_moments
from comgra_ndbg.stats.reducer import Reducer
from comgra_ndbg.stats.statistics import derive, merge_rows
from comgra_ndbg.store.schema import FIELD, identity_row

SPREAD = [FIELD[f] for f in ("spread_count", "spread_sum_sq", "spread_dev_sq")]
PATHS = ["kernel", "kernel-many", "kernel-shared", "numpy", "device", "segmented", "exact"]


def reference(a: np.ndarray, batched: bool = True) -> np.ndarray:
    """(elements, Σx², Σ squared deviations from each unit's batch mean) over the units of ``a`` seen as
    ``[batch, units]`` that hold no NaN or ±Inf, in float64 and two passes; zeros where it is unknown."""
    if not batched or a.ndim == 0 or a.shape[0] < 2:
        return np.zeros(3)
    w = np.asarray(a, dtype=np.float64).reshape(a.shape[0], -1)
    kept = w[:, np.isfinite(w).all(axis=0)]
    if not kept.size:
        return np.zeros(3)
    return np.array([kept.size, (kept * kept).sum(), ((kept - kept.mean(axis=0)) ** 2).sum()])


@pytest.fixture(params=PATHS)
def spread_row(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
               ) -> Callable[[torch.Tensor, bool], np.ndarray]:
    """A function giving the summary row of a tensor on one path (and checking that path was taken)."""
    path = request.param
    if path.startswith("kernel") and not kernels.AVAILABLE:
        pytest.skip("numba is not installed")
    if path == "kernel-shared":
        if not openmp.entry():
            pytest.skip("no OpenMP team to share")
        original = parallel.moments_many
        monkeypatch.setattr(parallel, "moments_many", lambda *args, **options: original(*args, **options, shared=True))
    if path in ("numpy", "device", "segmented"):
        monkeypatch.setattr(kernels, "AVAILABLE", False)
    if path == "device":  # CPU tensors down the torch reductions an accelerator's tensors take
        monkeypatch.setattr(reduce_module, "_HOST_DEVICE", "no host")
    calls: list[int] = []
    if path == "segmented":
        original_segments = segmented.segment_moments

        def counting(tensors: list[torch.Tensor], *args: object) -> torch.Tensor:
            calls.append(len(tensors))
            return original_segments(tensors, *args)

        monkeypatch.setattr(segmented, "segmentable", lambda t: 0 < t.numel() <= segmented.SEGMENT_MAX)
        monkeypatch.setattr(segmented, "segment_moments", counting)

    def row_of(tensor: torch.Tensor, batched: bool) -> np.ndarray:
        if path == "exact":
            row = identity_row()
            row[FIELD["count"]] = tensor.numel()  # the reducer's part
            exact_moments(tensor, row, batch=tensor.shape[0] if batched and tensor.dim() else 0)
            return row
        reducer = Reducer()
        if path.startswith("kernel-"):
            index = reducer.add_many([tensor, torch.zeros(3)], batched=[batched, False])[0]
        else:
            index = reducer.add(tensor, batched=batched)
        row = reducer.collect()[index]
        assert path != "segmented" or calls, "the segmented path was not taken"
        return row

    return row_of


def random_batch(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Units with means and scales of their own, so that the spread is neither 0 nor 1."""
    g = torch.Generator().manual_seed(seed)
    units = shape[1:]
    scale, offset = 0.1 + 2 * torch.rand(units, generator=g), torch.randn(units, generator=g)
    return torch.randn(shape, generator=g) * scale + offset


@pytest.mark.parametrize("shape", [(2, 1), (16, 3, 5), (64, 300), (5000, 4), (3, 9000)], ids=str)
def test_every_path_gives_the_spread_of_numpy_in_float64(shape: tuple[int, ...], spread_row) -> None:
    x = random_batch(shape, seed=sum(shape))
    row = spread_row(x, True)
    expected = reference(x.numpy())
    assert row[SPREAD[0]] == expected[0] == x.numel()
    np.testing.assert_allclose(row[SPREAD[1:]], expected[1:], rtol=2e-6)
    spread = derive(row[None])["sample_spread"][0]
    assert 0 < spread < 1 and spread == pytest.approx(expected[2] / expected[1], rel=2e-6)


def test_identical_samples_have_a_spread_of_exactly_zero(spread_row) -> None:
    """A collapsed LayerNorm output: every sample has mean 0 and std 1, and all samples are the same."""
    sample = torch.randn(200, generator=torch.Generator().manual_seed(1))
    sample = (sample - sample.mean()) / sample.std(correction=0)
    row = spread_row(sample.expand(32, 200).contiguous(), True)
    stats = derive(row[None])
    assert row[SPREAD[0]] == 32 * 200 and row[SPREAD[2]] == 0.0
    assert stats["sample_spread"][0] == 0.0 and stats["sample_spread_rms"][0] == 0.0
    assert stats["std"][0] == pytest.approx(1.0, rel=1e-5)


def test_independent_centred_samples_have_a_spread_near_one(spread_row) -> None:
    """Units with mean 0: Σ(x - m)² / Σx² = 1 - B Σm² / Σx², about (B - 1) / B for B independent samples."""
    x = torch.randn(64, 500, generator=torch.Generator().manual_seed(2))
    row = spread_row(x, True)
    spread = derive(row[None])["sample_spread"][0]
    expected = reference(x.numpy())
    assert spread == pytest.approx(expected[2] / expected[1], rel=2e-6)
    assert spread == pytest.approx(63 / 64, abs=0.01)


def test_nearly_identical_samples_keep_their_small_spread(spread_row) -> None:
    """Collapse under way: samples differ by 1e-4 of the values. Σx² − (Σx)²/B cancels in float32 here; every
    path must still see a spread of about 1e-9, not 0 (a complete collapse) and not noise."""
    g = torch.Generator().manual_seed(3)
    x = 3.0 + torch.randn(256, generator=g) + 1e-4 * torch.randn(64, 256, generator=g)
    row = spread_row(x, True)
    expected = reference(x.numpy())
    np.testing.assert_allclose(row[SPREAD[2]], expected[2], rtol=1e-3)
    assert 1e-10 < derive(row[None])["sample_spread"][0] < 1e-8


@pytest.mark.parametrize("where", [(0, 2), (5, 2), (11, 0)], ids=["first sample", "a later sample", "last"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
def test_a_unit_holding_a_non_finite_value_is_left_out(where: tuple[int, int], bad: float, spread_row) -> None:
    x = random_batch((12, 6), seed=4)
    x[where] = bad
    row = spread_row(x, True)
    expected = reference(x.numpy())
    assert row[SPREAD[0]] == expected[0] == 12 * 5
    np.testing.assert_allclose(row[SPREAD[1:]], expected[1:], rtol=1e-12)


@pytest.mark.parametrize("case", ["one sample", "batch-less", "scalar", "all NaN", "NaN in every unit"])
def test_where_the_spread_is_unknown_it_derives_nan_never_zero(case: str, spread_row) -> None:
    x = random_batch((6, 4), seed=5)
    tensor, batched = {"one sample": (x[:1].contiguous(), True), "batch-less": (x, False),
                       "scalar": (x[0, 0].clone(), True), "all NaN": (torch.full((6, 4), float("nan")), True),
                       "NaN in every unit": (x.fill_diagonal_(float("nan")), True)}[case]
    row = spread_row(tensor, batched)
    assert row[SPREAD].tolist() == [0.0, 0.0, 0.0]
    stats = derive(row[None])
    assert np.isnan(stats["sample_spread"][0]) and np.isnan(stats["sample_spread_rms"][0])


def test_merged_iterations_pool_each_batchs_own_deviation(spread_row) -> None:
    """Rows merged across iterations (or devices) add their fields: the spread of the merged row is that of
    the concatenated statistics, each batch measured against its own units' means, never a mean of spreads."""
    batches = [random_batch((8, 10), seed=6), 5.0 + random_batch((8, 10), seed=7), random_batch((1, 10), seed=8)]
    batches[1][:, :4] = batches[1][0, :4]  # four units collapsed in the second iteration only
    merged = merge_rows(np.stack([spread_row(b, True) for b in batches]))
    pooled = sum(reference(b.numpy()) for b in batches)
    assert merged[SPREAD[0]] == pooled[0] == 160
    np.testing.assert_allclose(merged[SPREAD[1:]], pooled[1:], rtol=2e-6)
    assert derive(merged[None])["sample_spread"][0] == pytest.approx(pooled[2] / pooled[1], rel=2e-6)
    whole = reference(torch.cat(batches[:2]).numpy())  # one batch of 16 would measure the offset between them
    assert derive(merged[None])["sample_spread"][0] < 0.5 * whole[2] / whole[1]


def test_per_sample_rows_of_a_snapshot_carry_no_spread() -> None:
    x = random_batch((5, 3, 4), seed=9)
    snap = take_snapshot(x, batched=True, num_samples=5, max_elements=1000)
    assert (snap.sample_stats[:, SPREAD] == 0).all()
    assert np.isnan(derive(snap.sample_stats)["sample_spread"]).all()

"""``parallel.moments_many``: the summary kernels run on torch's OpenMP threads.

It must give what the single-thread ``kernels.moments_many`` gives (rows, copies, "recompute exactly"
flags) whatever the cut into work items, on torch's own threads rather than new ones, and still be right
when torch runs on one thread.
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from comgra_ndbg.stats import kernels, openmp, parallel
from comgra_ndbg.stats.reducer import Reducer
from comgra_ndbg.store.schema import FIELD, NUM_FIELDS, identity_row

pytestmark = pytest.mark.skipif(not kernels.AVAILABLE, reason="numba is not installed")

SHARES = openmp.entry() != 0


def addresses(arrays: list[np.ndarray]) -> np.ndarray:
    return np.array([a.ctypes.data for a in arrays], dtype=np.int64)


def both(arrays: list[np.ndarray], **options: object) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rows and flags of the single-thread and the shared kernel over ``arrays`` (one dtype)."""
    sizes = np.array([a.size for a in arrays], dtype=np.int64)
    alone, shared = np.tile(identity_row(), (len(arrays), 1)), np.tile(identity_row(), (len(arrays), 1))
    flags_alone = kernels.moments_many(arrays[0].dtype, addresses(arrays), sizes, alone, **options)
    flags_shared = parallel.moments_many(arrays[0].dtype, addresses(arrays), sizes, shared, shared=True, **options)
    return alone, shared, flags_alone, flags_shared


def assert_same(shared: np.ndarray, alone: np.ndarray, arrays: list[np.ndarray]) -> None:
    """Counts and extremes equal; sums equal up to the float32 (or float64) rounding of the array's dtype,
    in whatever order the compiled code adds up a block (relative to the sum of magnitudes)."""
    for name in ("zeros", "min", "max", "units", "dead_units", "spread_count"):
        np.testing.assert_array_equal(shared[:, FIELD[name]], alone[:, FIELD[name]], err_msg=name)
    eps = 1e-6 if arrays[0].dtype == np.float32 else 1e-12
    for j, a in enumerate(arrays):
        scale = float(np.abs(a.astype(np.float64)).sum())
        assert abs(shared[j, FIELD["sum"]] - alone[j, FIELD["sum"]]) <= eps * scale, j
        for name in ("sum_sq", "sum_abs", "spread_sum_sq", "spread_dev_sq"):
            np.testing.assert_allclose(shared[j, FIELD[name]], alone[j, FIELD[name]], rtol=eps, err_msg=name)


def test_torchs_openmp_runtime_is_found_where_torch_uses_one() -> None:
    uses_openmp = "parallel backend: OpenMP" in torch.__config__.parallel_info()
    if sys.platform.startswith("linux") and uses_openmp:
        assert openmp.entry() != 0
    else:
        assert openmp.entry() == 0


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_rows_equal_the_single_thread_kernel_across_item_boundaries(dtype: type) -> None:
    rng = np.random.default_rng(1)
    sizes = [1, 7, kernels.BLOCK - 1, 2 * kernels.BLOCK + 5, 250_000, 3, 40_000]
    arrays = [(rng.standard_normal(n) * (j + 1) + j).astype(dtype) for j, n in enumerate(sizes)]
    arrays[4][::97] = 0.0
    alone, shared, flags_alone, flags_shared = both(arrays)
    np.testing.assert_array_equal(flags_shared, flags_alone)
    assert_same(shared, alone, arrays)
    assert shared[4, FIELD["zeros"]] == len(range(0, 250_000, 97))


def test_copies_and_differences_are_those_of_every_item() -> None:
    rng = np.random.default_rng(2)
    values = [rng.standard_normal(n).astype(np.float32) for n in (100_000, 300, 70_000)]
    targets = [np.full_like(v, np.nan) for v in values]
    alone, shared, _, _ = both(values, copies=addresses(targets))
    for value, target in zip(values, targets):
        np.testing.assert_array_equal(target, value)
    assert_same(shared, alone, values)
    before = [v - rng.uniform(-1e-3, 1e-3, v.size).astype(np.float32) for v in values]
    alone, shared, _, _ = both(values, starts=addresses(before))
    differences = [v.astype(np.float64) - b.astype(np.float64) for v, b in zip(values, before)]
    for j, difference in enumerate(differences):
        assert abs(shared[j, FIELD["sum"]] - difference.sum()) < 1e-6 * float(np.abs(difference).sum())
    assert_same(shared, alone, [d.astype(np.float32) for d in differences])


def test_dead_units_of_batched_arrays_match() -> None:
    rng = np.random.default_rng(3)
    wide = rng.standard_normal((64, 2048)).astype(np.float32)
    wide[:, [5, 700, 2047]] = 0.0
    narrow = rng.standard_normal((8, 3)).astype(np.float32)
    narrow[:, 1] = -0.0
    alone, shared, _, _ = both([wide.reshape(-1), narrow.reshape(-1)], batches=np.array([64, 8], dtype=np.int64))
    assert shared[:, FIELD["dead_units"]].tolist() == [3.0, 1.0]
    assert shared[:, FIELD["units"]].tolist() == [2048.0, 3.0]
    assert_same(shared, alone, [wide.reshape(-1), narrow.reshape(-1)])


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_the_sample_spread_equals_numpy_across_unit_item_boundaries(dtype: type) -> None:
    """Units are shared out in ranges, each item summing around its own units' first samples: the merged
    spread is that of the whole batch, whatever the cut (``MIN_UNITS`` per item when the batch is taller than
    an item; rows past ``kernels.ROWS`` move to float64 sums within an item)."""
    rng = np.random.default_rng(5)
    shapes = [(64, 2048), (3, 50_000), (5000, 300), (20_000, 3), (1, 9000), (8, 3)]
    arrays = [(rng.standard_normal(shape) * rng.uniform(0.5, 2.0, shape[1]) + rng.standard_normal(shape[1]))
              .astype(dtype) for shape in shapes]
    arrays[0][:, 100:300] = arrays[0][0, 100:300]  # collapsed units: identical in every sample
    flat = [a.reshape(-1) for a in arrays]
    batches = np.array([shape[0] for shape in shapes], dtype=np.int64)
    sizes = np.array([a.size for a in flat], dtype=np.int64)
    table = parallel.plan(sizes, batches, parallel._part(int(sizes.sum()), 2))
    units = table[table[:, 1] == parallel.UNIT_COUNTS]
    part = parallel._part(int(sizes.sum()), 2)
    assert part // 5000 < parallel.MIN_UNITS
    assert np.bincount(units[:, 0]).tolist() == [-(-shape[1] // max(part // shape[0], parallel.MIN_UNITS))
                                                 for shape in shapes]
    assert all(count > 1 for count in np.bincount(units[:, 0])[:3]) and np.bincount(units[:, 0])[3] == 1
    alone, shared, flags_alone, flags_shared = both(flat, batches=batches)
    assert flags_alone.tolist() == flags_shared.tolist() == [False] * len(arrays)
    assert_same(shared, alone, flat)
    for j, a in enumerate(arrays):
        w = a.astype(np.float64)
        deviation = ((w - w.mean(axis=0)) ** 2).sum() if a.shape[0] > 1 else 0.0
        expected = (a.size, (w * w).sum(), deviation) if a.shape[0] > 1 else (0.0, 0.0, 0.0)
        got = [shared[j, FIELD[f]] for f in ("spread_count", "spread_sum_sq", "spread_dev_sq")]
        assert got[0] == expected[0], j
        np.testing.assert_allclose(got[1:], expected[1:], rtol=1e-6 if dtype is np.float32 else 1e-12, err_msg=str(j))


def test_a_unit_holding_nan_flags_its_array_and_the_reducer_leaves_the_unit_out() -> None:
    rng = np.random.default_rng(6)
    values = torch.from_numpy(rng.standard_normal((32, 4000)).astype(np.float32))
    values[17, 3333] = float("nan")
    clean = torch.from_numpy(rng.standard_normal((32, 1000)).astype(np.float32))
    flat = [values.numpy().reshape(-1), clean.numpy().reshape(-1)]
    _, _, flags_alone, flags_shared = both(flat, batches=np.array([32, 32], dtype=np.int64))
    assert flags_alone.tolist() == flags_shared.tolist() == [True, False]
    reducer = Reducer()
    indices = reducer.add_many([values, clean], batched=[True, True])
    rows = reducer.collect()[indices]
    kept = np.delete(values.numpy().astype(np.float64), 3333, axis=1)
    assert rows[0, FIELD["spread_count"]] == kept.size and rows[0, FIELD["nan"]] == 1
    np.testing.assert_allclose(rows[0, FIELD["spread_sum_sq"]], (kept * kept).sum(), rtol=1e-12)
    np.testing.assert_allclose(rows[0, FIELD["spread_dev_sq"]], ((kept - kept.mean(axis=0)) ** 2).sum(), rtol=1e-12)
    whole = clean.numpy().astype(np.float64)
    np.testing.assert_allclose(rows[1, FIELD["spread_dev_sq"]], ((whole - whole.mean(axis=0)) ** 2).sum(), rtol=1e-6)


@pytest.mark.parametrize("bad", [np.nan, np.inf, 3e38])
def test_an_item_with_non_finite_sums_flags_its_array_for_the_exact_recompute(bad: float) -> None:
    arrays = [np.ones(200_000, dtype=np.float32), np.ones(50_000, dtype=np.float32)]
    arrays[0][150_001] = bad
    arrays[0][150_002] = bad
    _, _, flags_alone, flags_shared = both(arrays)
    assert flags_shared.tolist() == flags_alone.tolist() == [True, False]


def test_the_reducer_recomputes_a_flagged_row_exactly() -> None:
    values = torch.ones(100_000)
    values[77_777] = float("nan")
    reducer = Reducer()
    assert reducer.add_many([values, torch.full((40_000,), 2.0)]) == [0, 1]
    out = reducer.collect()
    assert out[0, FIELD["nan"]] == 1 and out[0, FIELD["sum"]] == 99_999.0
    assert out[1, FIELD["sum"]] == 80_000.0


_THREADS_SCRIPT = """
import os, numpy as np, torch
from comgra_ndbg.stats import parallel
from comgra_ndbg.store.schema import identity_row
torch.set_num_threads(2)
def count():
    return len(os.listdir("/proc/self/task"))
def shared():
    a = np.ones(1_000_000, dtype=np.float32)
    row = np.tile(identity_row(), (1, 1))
    parallel.moments_many(a.dtype, np.array([a.ctypes.data]), np.array([a.size]), row, shared=True)
before = count()
shared()
after_ours = count()
torch.ones(1_000_000).exp_()
after_torch = count()
shared()
print(before, after_ours, after_torch, count())
"""


@pytest.mark.skipif(not SHARES, reason="torch does not run on a shareable OpenMP runtime here")
def test_the_work_runs_on_torchs_threads_without_starting_new_ones() -> None:
    # A clean process: the team our first call starts is the one torch's operators then use, and back.
    out = subprocess.run([sys.executable, "-c", _THREADS_SCRIPT], capture_output=True, text=True, timeout=120,
                         check=True).stdout.split()
    before, after_ours, after_torch, after_both = map(int, out)
    assert after_ours == before + 1  # two threads: the caller and one team thread
    assert after_torch == after_ours == after_both


@pytest.mark.skipif(not SHARES, reason="torch does not run on a shareable OpenMP runtime here")
def test_one_torch_thread_still_gives_the_right_rows() -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a = np.arange(300_000, dtype=np.float64)
        row = np.zeros((1, NUM_FIELDS))
        parallel.moments_many(a.dtype, addresses([a]), np.array([a.size]), row, shared=True)
    finally:
        torch.set_num_threads(threads)
    assert row[0, FIELD["sum"]] == a.sum() and row[0, FIELD["max"]] == 299_999.0 and row[0, FIELD["zeros"]] == 1


def _never(*args: object) -> None:
    raise AssertionError("the shared team was called for work too small to share")


def test_small_work_stays_on_the_calling_thread_and_the_part_size_is_bounded(monkeypatch) -> None:
    assert parallel._part(10, 2) == parallel.PART[0]
    assert parallel._part(10**9, 2) == parallel.PART[1]
    middle = parallel._part(2_000_000, 4)
    assert parallel.PART[0] <= middle <= parallel.PART[1] and middle % kernels.BLOCK == 0
    monkeypatch.setattr(parallel, "_TEAM", [_never])  # calling the team would fail
    a = np.ones(100, dtype=np.float32)
    row = np.tile(identity_row(), (1, 1))
    assert parallel.moments_many(a.dtype, addresses([a]), np.array([100]), row).tolist() == [False]
    assert row[0, FIELD["sum"]] == 100.0


@pytest.mark.parametrize("total", ["small", "large"])
def test_the_call_without_argument_checks_gives_the_checked_calls_rows(total: str) -> None:
    """``moments_many_built`` (the recorder's packed passes, whose arguments it builds itself) returns what
    ``moments_many`` returns for the same arguments, on the calling thread and on the team, with copies,
    starts and batches; the compiled pass still refuses an array it cannot read."""
    rng = np.random.default_rng(7)
    sizes = [6, 300] if total == "small" else [6, 300, 3 * parallel.MIN_ELEMENTS]
    values = [rng.standard_normal(n).astype(np.float32) for n in sizes]
    before = [v + np.float32(0.25) for v in values]
    batches = np.array([2] + [0] * (len(sizes) - 1), dtype=np.int64)
    size_array = np.array(sizes, dtype=np.int64)
    for options in ({}, {"starts": addresses(before)}, {"batches": batches}):
        checked, built = np.tile(identity_row(), (len(sizes), 1)), np.tile(identity_row(), (len(sizes), 1))
        flags = parallel.moments_many(np.dtype(np.float32), addresses(values), size_array, checked, **options)
        flags_built = parallel.moments_many_built(np.dtype(np.float32), addresses(values), size_array, built,
                                                  options.get("starts"), None, options.get("batches"))
        np.testing.assert_array_equal(flags_built, flags)
        np.testing.assert_array_equal(built, checked)
    copies = [np.zeros_like(v) for v in values]
    built = np.tile(identity_row(), (len(sizes), 1))
    parallel.moments_many_built(np.dtype(np.float32), addresses(values), size_array, built, None, addresses(copies),
                                None)
    for value, copy in zip(values, copies):
        np.testing.assert_array_equal(copy, value)
    with pytest.raises(ValueError, match="cannot be read as described"):
        parallel.moments_many_built(np.dtype(np.float32), addresses(values), size_array, built, None, None,
                                    np.array([4] + [0] * (len(sizes) - 1), dtype=np.int64))  # 4 does not divide 6

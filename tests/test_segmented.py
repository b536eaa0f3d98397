"""Small device tensors reduced together (``stats.segmented``), against numpy in float64.

The segmented path serves tensors off the host; on a machine without a GPU the same code runs on CPU
tensors by letting ``segmentable`` accept them and switching the compiled host kernels off, so every
assertion here holds wherever the suite runs (and on CUDA as well when one is present).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from test_reduce import host, reference_row

from comgra_ndbg.stats import fused, kernels, segmented
from comgra_ndbg.stats.reducer import Reducer
from comgra_ndbg.stats.statistics import derive
from comgra_ndbg.store.schema import FIELD

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
EXACT = [FIELD[f] for f in ("count", "nan", "inf", "zeros", "min", "max")]
MOMENTS = [FIELD[f] for f in ("sum", "sum_sq", "sum_abs")]


@pytest.fixture(autouse=True)
def segmented_everywhere(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Route CPU tensors through the segmented path (as GPU tensors are); returns the sizes of every call."""
    calls: list[int] = []
    original = segmented.segment_moments

    def counting(tensors, *args):
        calls.append(len(tensors))
        return original(tensors, *args)

    monkeypatch.setattr(kernels, "AVAILABLE", False)
    monkeypatch.setattr(fused, "usable", lambda t: False)  # where Triton runs, this path is the fallback
    monkeypatch.setattr(segmented, "segmentable", lambda t: t.is_floating_point() and 0 < t.numel()
                        <= segmented.SEGMENT_MAX and not t.is_neg())
    monkeypatch.setattr(segmented, "segment_moments", counting)
    return calls


def tensors(device: str, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    shapes = [(16, 8), (16,), (3, 4, 5), (1,), (7, 7)]
    out = [torch.randn(shape, generator=g).to(dtype) for shape in shapes]
    out[1][::3] = 0
    out[3][0] = 0
    return [t.to(device) for t in out]


def assert_rows(rows: np.ndarray, values: list[np.ndarray]) -> None:
    for row, value in zip(rows, values):
        expected = reference_row(value)
        np.testing.assert_array_equal(row[EXACT], expected[EXACT])
        np.testing.assert_allclose(row[MOMENTS], expected[MOMENTS], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_many_tensors_in_one_call_equal_numpy(device: str, dtype: torch.dtype, segmented_everywhere) -> None:
    group = tensors(device, dtype)
    reducer = Reducer()
    indices = reducer.add_many(group)
    rows = reducer.collect()[indices]
    assert segmented_everywhere == [len(group)]
    assert_rows(rows, [host(t) for t in group])  # float64 sums of the exact values: to double precision


@pytest.mark.parametrize("device", DEVICES)
def test_updates_and_start_of_step_copies(device: str, segmented_everywhere) -> None:
    now, before = tensors(device), [t * 0.5 + 1 for t in tensors(device)]
    copies = [torch.empty_like(t) for t in now]
    reducer = Reducer()
    values = reducer.add_many(now, copies=copies)
    updates = reducer.add_many(now, starts=before)
    rows = reducer.collect()
    assert segmented_everywhere == [len(now), len(now)]
    for copy, tensor in zip(copies, now):
        assert torch.equal(copy, tensor)
    assert_rows(rows[values], [host(t) for t in now])
    assert_rows(rows[updates], [host(a - b) for a, b in zip(now, before)])  # ΔW as float32 holds it


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_updates_are_not_rounded_to_the_dtype(device: str, dtype: torch.dtype,
                                                             segmented_everywhere) -> None:
    now = tensors(device, dtype)
    before = [t * 0.3 + 0.1 for t in now]  # differences that take more bits than the dtype holds
    reducer = Reducer()
    updates = reducer.add_many(now, starts=before)
    single = Reducer()
    alone = single.add(now[0], start=before[0])
    assert segmented_everywhere == [len(now)]
    rows = reducer.collect()[updates]
    assert_rows(rows, [host(a) - host(b) for a, b in zip(now, before)])
    row, expected = single.collect()[alone], reference_row(host(now[0]) - host(before[0]))
    np.testing.assert_array_equal(row[EXACT], expected[EXACT])  # the float32 difference: sums to its rounding
    np.testing.assert_allclose(row[MOMENTS], expected[MOMENTS], rtol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_non_finite_rows_are_recomputed_exactly(device: str) -> None:
    group = tensors(device)
    group[0][0, 0], group[0][1, 1], group[2][0, 0, 0] = float("nan"), float("inf"), float("-inf")
    reducer = Reducer()
    indices = reducer.add_many(group)
    rows = reducer.collect()[indices]
    assert rows[0, FIELD["nan"]] == 1 and rows[0, FIELD["inf"]] == 1 and rows[2, FIELD["inf"]] == 1
    assert_rows(rows, [host(t) for t in group])


@pytest.mark.parametrize("device", DEVICES)
def test_a_mean_that_dwarfs_the_spread_keeps_its_std(device: str) -> None:
    """float64 sums resolve a LayerNorm gain of 1 ± 1e-4 without the exact recompute."""
    g = torch.Generator().manual_seed(5)
    gain = (1 + 1e-4 * torch.randn(512, generator=g)).to(device)
    reducer = Reducer()
    [index] = reducer.add_many([gain])
    row = reducer.collect()[index]
    expected = host(gain).std()
    assert derive(row[None])["std"][0] == pytest.approx(expected, rel=1e-6)


def test_chunks_bound_the_concatenation(monkeypatch: pytest.MonkeyPatch, segmented_everywhere) -> None:
    monkeypatch.setattr(segmented, "CHUNK", 100)
    group = tensors("cpu")  # 128, 16, 60, 1, 49 elements
    reducer = Reducer()
    indices = reducer.add_many(group)
    rows = reducer.collect()[indices]
    assert segmented_everywhere == [1, 3, 1]
    assert_rows(rows, [host(t) for t in group])


def test_mixed_groups_keep_the_order_of_add(segmented_everywhere) -> None:
    """Tensors of two dtypes, a batched one and an empty one (reduced apart) in one call."""
    group = [torch.ones(3), torch.arange(4, dtype=torch.float64), torch.zeros(0), torch.full((2, 3), 2.0),
             torch.tensor([1.5, -1.5], dtype=torch.float64)]
    reducer = Reducer()
    indices = reducer.add_many(group, batched=[False, False, False, True, False])
    rows = reducer.collect()[indices]
    assert sorted(segmented_everywhere) == [2, 2]  # float32: the first and the batched one; float64: two
    assert rows[:, FIELD["count"]].tolist() == [3, 4, 0, 6, 2]
    assert rows[:, FIELD["sum"]].tolist() == [3.0, 6.0, 0.0, 12.0, 0.0]
    assert rows[:, FIELD["units"]].tolist() == [0, 0, 0, 3, 0]
    assert rows[:, FIELD["dead_units"]].tolist() == [0, 0, 0, 0, 0]


@pytest.mark.parametrize("device", DEVICES)
def test_batched_tensors_count_dead_and_saturated_units(device: str, segmented_everywhere) -> None:
    """Activations registered one by one: copied at once, reduced together at collect(), with their units
    and saturation counted as numpy counts them."""
    g = torch.Generator().manual_seed(9)
    hidden = torch.tanh(3 * torch.randn(6, 5, generator=g))
    hidden[:, 1] = 0  # a dead unit
    hidden[:, 3] = 0.999  # saturated in every sample
    relu = torch.relu(torch.randn(6, 2, 3, generator=g))
    relu[:, 0] = 0
    weight = torch.randn(5, 5, generator=g)
    cases = [(hidden, True, (-1.0, 1.0)), (relu, True, None), (weight, False, None),
             (hidden.sum(0), False, (-1.0, 1.0))]
    expected = [reference_row(host(t), batched=b, bounds=bounds) for t, b, bounds in cases]
    reducer = Reducer()
    registered = [t.to(device) for t, _, _ in cases]
    indices = [reducer.add(t, batched=b, bounds=bounds) for t, (_, b, bounds) in zip(registered, cases)]
    registered[0].mul_(0)  # changed after registration: the row keeps the values it had
    assert segmented_everywhere == []  # nothing reduced before collect()
    rows = reducer.collect()[indices]
    assert segmented_everywhere == [4]
    np.testing.assert_allclose(rows, np.stack(expected), rtol=1e-12, atol=1e-12)
    assert rows[0, FIELD["dead_units"]] == 1 and rows[0, FIELD["saturated_units"]] >= 1
    assert rows[1, FIELD["dead_units"]] == 3 and rows[1, FIELD["units"]] == 6


def test_segment_layouts_are_made_once() -> None:
    device = torch.device("cpu")
    layout = segmented._layout(device, (4, 3), (2, 0), (None, (-0.5, 0.5)))
    assert layout.units.tolist() == [0, 1, 0, 1, 2, 3, 4]
    assert layout.unit_counts == (2, 3) and layout.unit_bounded.tolist() == [0, 0, 0, 0, 0]
    assert layout.offsets(2).tolist() == [0, 4, 7, 11, 14]
    assert layout.unit_offsets(1).tolist() == [0, 2, 5]
    assert segmented._layout(device, (4, 3), (2, 0), (None, (-0.5, 0.5))) is layout
    assert layout.offsets(2) is layout.offsets(2)


SPREAD = [FIELD[f] for f in ("spread_count", "spread_sum_sq", "spread_dev_sq")]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_the_sample_spread_of_many_tensors_in_one_call(device: str, dtype: torch.dtype, segmented_everywhere) -> None:
    """Batched tensors of several batch sizes beside batch-less ones: each element's deviation from its unit's
    mean over the batch, in float64 on the exact values; identical samples give exactly 0."""
    g = torch.Generator().manual_seed(11)
    collapsed = (3 * torch.randn(1, 12, generator=g)).expand(8, 12).clone()
    cases = [(torch.randn(16, 3, 4, generator=g) + 3 * torch.randn(3, 4, generator=g), True), (collapsed, True),
             (torch.randn(1, 7, generator=g), True), (torch.randn(9, generator=g), False),
             (torch.randn(5, 1, generator=g), True), (torch.randn(4, 6, generator=g), False)]
    group = [t.to(dtype).to(device) for t, _ in cases]
    reducer = Reducer()
    indices = reducer.add_many(group, batched=[b for _, b in cases])
    rows = reducer.collect()[indices]
    assert segmented_everywhere == [len(group)]
    for row, tensor, (_, batched) in zip(rows, group, cases):
        np.testing.assert_allclose(row[SPREAD], reference_row(host(tensor), batched=batched)[SPREAD], rtol=1e-12)
    assert rows[:, FIELD["spread_count"]].tolist() == [192, 96, 0, 0, 5, 0]
    assert rows[1, FIELD["spread_dev_sq"]] == 0.0 and derive(rows[1][None])["sample_spread"][0] == 0.0


@pytest.mark.parametrize("device", DEVICES)
def test_a_registered_activation_with_nan_keeps_the_spread_of_its_clean_units(device: str,
                                                                             segmented_everywhere) -> None:
    g = torch.Generator().manual_seed(12)
    hidden = torch.randn(6, 5, generator=g)
    hidden[2, 1], hidden[4, 3] = float("nan"), float("-inf")
    reducer = Reducer()
    index = reducer.add(hidden.to(device), batched=True)
    row = reducer.collect()[index]
    assert segmented_everywhere == [1]
    kept = host(hidden)[:, [0, 2, 4]]
    assert row[FIELD["spread_count"]] == 18 and row[FIELD["nan"]] == 1 and row[FIELD["inf"]] == 1
    np.testing.assert_allclose(row[SPREAD[1:]], [(kept * kept).sum(), ((kept - kept.mean(0)) ** 2).sum()], rtol=1e-12)

"""The Triton kernels of ``fused`` (imported only where Triton is installed).

One launch reduces a whole group: every program writes one partial row of 9 float64 values (a flat
program: ``BLOCK`` consecutive elements; a unit program: ``UNITS`` columns of the ``[samples, units]`` view
over every sample), then counts itself done on its tensor's counter; the tensor's last program (the one that
reads count − 1) sums the partial rows into the tensor's row and sets the counter back to 0 for the next
launch. ``moments_many`` reads each tensor from a table of ``fused._META`` int64 entries (address, numel,
samples, units, its first flat program and their count, its first unit program and their count, the
saturation thresholds' float64 bits); ``moments_one`` takes one tensor's entries as arguments, so a
registration uploads nothing. ``like`` is the group's first tensor: its element type is the type every
address of the table is read as.
"""
from __future__ import annotations

import triton
import triton.language as tl

_META: tl.constexpr = tl.constexpr(10)
_PARTIAL: tl.constexpr = tl.constexpr(9)
_ROW: tl.constexpr = tl.constexpr(14)


@triton.jit
def _flat_partials(base, numel, chunk, low, high, slot, BLOCK: tl.constexpr):
    """``BLOCK`` elements: Σx, Σx², Σ|x|, min and max over the finite ones, the non-zero count (NaN and ±Inf are
    non-zero), the saturated count (NaN thresholds match nothing), the NaN count and the ±Inf count."""
    offsets = chunk.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < numel
    x = tl.load(base + offsets, mask=inside, other=0.0).to(tl.float64)
    finite = tl.abs(x) < float("inf")  # false for NaN too
    kept = inside & finite
    y = tl.where(kept, x, 0.0)
    tl.store(slot, tl.sum(y, axis=0))
    tl.store(slot + 1, tl.sum(y * y, axis=0))
    tl.store(slot + 2, tl.sum(tl.abs(y), axis=0))
    tl.store(slot + 3, tl.min(tl.where(kept, x, float("inf")), axis=0))
    tl.store(slot + 4, tl.max(tl.where(kept, x, float("-inf")), axis=0))
    tl.store(slot + 5, tl.sum(((x != 0) & inside).to(tl.float64), axis=0))
    tl.store(slot + 6, tl.sum((((x <= low) | (x >= high)) & inside).to(tl.float64), axis=0))
    tl.store(slot + 7, tl.sum(((x != x) & inside).to(tl.float64), axis=0))
    tl.store(slot + 8, tl.sum(((x == x) & ~finite & inside).to(tl.float64), axis=0))


@triton.jit
def _unit_partials(base, samples, units, block, low, high, slot, UNITS: tl.constexpr):
    """``UNITS`` columns over every sample: dead units (zero in every sample; NaN is not zero), units
    saturated in every sample, and over the units finite in every sample: Σ(x − unit mean)², their count and
    their Σx². The spread sums differences to the first sample, so a mean that dwarfs it does not cancel."""
    columns = block.to(tl.int64) * UNITS + tl.arange(0, UNITS)
    inside = columns < units
    stride = units.to(tl.int64)  # a sample's elements: 64-bit offsets for tensors beyond 2**31 elements
    shift = tl.load(base + columns, mask=inside, other=0.0).to(tl.float64)
    shift = tl.where(tl.abs(shift) < float("inf"), shift, 0.0)
    total = tl.zeros([UNITS], dtype=tl.float64)
    deviations = tl.zeros([UNITS], dtype=tl.float64)
    squares = tl.zeros([UNITS], dtype=tl.float64)
    alive = tl.zeros([UNITS], dtype=tl.int32)
    saturated = tl.full([UNITS], 1, dtype=tl.int32)
    finite = tl.full([UNITS], 1, dtype=tl.int32)
    for sample in range(0, samples):
        x = tl.load(base + sample * stride + columns, mask=inside, other=0.0).to(tl.float64)
        ok = tl.abs(x) < float("inf")
        y = tl.where(ok, x, 0.0)
        d = tl.where(ok, x - shift, 0.0)
        total += d
        deviations += d * d
        squares += y * y
        alive = alive | (x != 0).to(tl.int32)
        saturated = saturated & ((x <= low) | (x >= high)).to(tl.int32)
        finite = finite & ok.to(tl.int32)
    whole = inside & (finite == 1)
    tl.store(slot, tl.sum(tl.where(inside & (alive == 0), 1.0, 0.0), axis=0))
    tl.store(slot + 1, tl.sum(tl.where(inside & (saturated == 1), 1.0, 0.0), axis=0))
    tl.store(slot + 2, tl.sum(tl.where(whole, deviations - total * total / samples.to(tl.float64), 0.0), axis=0))
    tl.store(slot + 3, tl.sum(tl.where(whole, 1.0, 0.0), axis=0))
    tl.store(slot + 4, tl.sum(tl.where(whole, squares, 0.0), axis=0))


@triton.jit
def _finish(partial, flat_first, flat_count, unit_first, unit_count, target, PARTS: tl.constexpr):
    """One tensor's row from its partial rows (flat rows from ``flat_first``, unit rows from ``unit_first``):
    Σx, Σx², Σ|x|, min, max, non-zero, dead units, saturated, saturated units, spread, NaN, ±Inf, finite units
    and their Σx². Partial rows are read past the first-level cache: other programs wrote them."""
    sums = tl.zeros([PARTS], dtype=tl.float64)
    squares = tl.zeros([PARTS], dtype=tl.float64)
    absolute = tl.zeros([PARTS], dtype=tl.float64)
    low = tl.full([PARTS], float("inf"), dtype=tl.float64)
    high = tl.full([PARTS], float("-inf"), dtype=tl.float64)
    nonzero = tl.zeros([PARTS], dtype=tl.float64)
    saturated = tl.zeros([PARTS], dtype=tl.float64)
    nan = tl.zeros([PARTS], dtype=tl.float64)
    inf = tl.zeros([PARTS], dtype=tl.float64)
    for begin in range(0, flat_count, PARTS):
        index = begin + tl.arange(0, PARTS)
        inside = index < flat_count
        at = partial + (flat_first + index).to(tl.int64) * _PARTIAL
        sums += tl.load(at, mask=inside, other=0.0, cache_modifier=".cg")
        squares += tl.load(at + 1, mask=inside, other=0.0, cache_modifier=".cg")
        absolute += tl.load(at + 2, mask=inside, other=0.0, cache_modifier=".cg")
        low = tl.minimum(low, tl.load(at + 3, mask=inside, other=float("inf"), cache_modifier=".cg"))
        high = tl.maximum(high, tl.load(at + 4, mask=inside, other=float("-inf"), cache_modifier=".cg"))
        nonzero += tl.load(at + 5, mask=inside, other=0.0, cache_modifier=".cg")
        saturated += tl.load(at + 6, mask=inside, other=0.0, cache_modifier=".cg")
        nan += tl.load(at + 7, mask=inside, other=0.0, cache_modifier=".cg")
        inf += tl.load(at + 8, mask=inside, other=0.0, cache_modifier=".cg")
    dead = tl.zeros([PARTS], dtype=tl.float64)
    saturated_units = tl.zeros([PARTS], dtype=tl.float64)
    spread = tl.zeros([PARTS], dtype=tl.float64)
    finite_units = tl.zeros([PARTS], dtype=tl.float64)
    finite_squares = tl.zeros([PARTS], dtype=tl.float64)
    for begin in range(0, unit_count, PARTS):
        index = begin + tl.arange(0, PARTS)
        inside = index < unit_count
        at = partial + (unit_first + index).to(tl.int64) * _PARTIAL
        dead += tl.load(at, mask=inside, other=0.0, cache_modifier=".cg")
        saturated_units += tl.load(at + 1, mask=inside, other=0.0, cache_modifier=".cg")
        spread += tl.load(at + 2, mask=inside, other=0.0, cache_modifier=".cg")
        finite_units += tl.load(at + 3, mask=inside, other=0.0, cache_modifier=".cg")
        finite_squares += tl.load(at + 4, mask=inside, other=0.0, cache_modifier=".cg")
    tl.store(target, tl.sum(sums, axis=0))
    tl.store(target + 1, tl.sum(squares, axis=0))
    tl.store(target + 2, tl.sum(absolute, axis=0))
    tl.store(target + 3, tl.min(low, axis=0))
    tl.store(target + 4, tl.max(high, axis=0))
    tl.store(target + 5, tl.sum(nonzero, axis=0))
    tl.store(target + 6, tl.sum(dead, axis=0))
    tl.store(target + 7, tl.sum(saturated, axis=0))
    tl.store(target + 8, tl.sum(saturated_units, axis=0))
    tl.store(target + 9, tl.sum(spread, axis=0))
    tl.store(target + 10, tl.sum(nan, axis=0))
    tl.store(target + 11, tl.sum(inf, axis=0))
    tl.store(target + 12, tl.sum(finite_units, axis=0))
    tl.store(target + 13, tl.sum(finite_squares, axis=0))


@triton.jit
def moments_many(meta, program_tensor, flat_total, partial, counters, out, like, BLOCK: tl.constexpr,
                 UNITS: tl.constexpr, PARTS: tl.constexpr):
    """Every tensor of the table: programs ``[0, flat_total)`` are flat programs, the rest unit programs."""
    program = tl.program_id(0)
    tensor = tl.load(program_tensor + program)
    row = meta + tensor * _META
    base = tl.load(row).to(tl.pointer_type(like.dtype.element_ty))
    flat_first = tl.load(row + 4)
    flat_count = tl.load(row + 5)
    unit_first = tl.load(row + 6)
    unit_count = tl.load(row + 7)
    low = tl.load(row + 8).to(tl.float64, bitcast=True)
    high = tl.load(row + 9).to(tl.float64, bitcast=True)
    slot = partial + program.to(tl.int64) * _PARTIAL
    if program < flat_total:
        _flat_partials(base, tl.load(row + 1), program - flat_first, low, high, slot, BLOCK)
    else:
        _unit_partials(base, tl.load(row + 2), tl.load(row + 3), program - flat_total - unit_first, low, high, slot,
                       UNITS)
    done = tl.atomic_add(counters + tensor, 1)
    if done == flat_count + unit_count - 1:
        _finish(partial, flat_first, flat_count, flat_total + unit_first, unit_count, out + tensor * _ROW, PARTS)
        tl.atomic_xchg(counters + tensor, 0)


@triton.jit(do_not_specialize=["numel", "samples", "units", "low_bits", "high_bits", "flat_count", "unit_count"])
def moments_one(x, partial, counter, out, numel, samples, units, low_bits, high_bits, flat_count, unit_count,
                BLOCK: tl.constexpr, UNITS: tl.constexpr, PARTS: tl.constexpr):
    """One tensor, its entries as arguments (thresholds as float64 bits): programs ``[0, flat_count)`` are flat
    programs, the rest unit programs."""
    program = tl.program_id(0)
    low = low_bits.to(tl.int64).to(tl.float64, bitcast=True)
    high = high_bits.to(tl.int64).to(tl.float64, bitcast=True)
    slot = partial + program.to(tl.int64) * _PARTIAL
    if program < flat_count:
        _flat_partials(x, numel, program, low, high, slot, BLOCK)
    else:
        _unit_partials(x, samples, units, program - flat_count, low, high, slot, UNITS)
    done = tl.atomic_add(counter, 1)
    if done == flat_count + unit_count - 1:
        _finish(partial, 0, flat_count, flat_count, unit_count, out, PARTS)
        tl.atomic_xchg(counter, 0)

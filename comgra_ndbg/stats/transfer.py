"""Device results on their way into host rows: the blocks of rows ``segmented.segment_moments`` and
``fused.fused_moments`` computed (written into the reducer's rows once ``collected`` copied them to the
host), and the count fields that device reductions deliver as their complement (non-zero elements and
units, stored as zero ones).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from comgra_ndbg.stats import fused, segmented
from comgra_ndbg.stats.fields import FIELD

__all__ = ["Block", "complement", "segmentable", "single_block", "write_complete"]

_SEGMENT_COLUMNS = [FIELD[f] for f in ("sum", "sum_sq", "sum_abs", "min", "max")]  # segment_moments' order
_COUNT = FIELD["count"]
_SPREAD_COUNT, _SPREAD_SUM_SQ, _SPREAD_DEV = FIELD["spread_count"], FIELD["spread_sum_sq"], FIELD["spread_dev_sq"]


@dataclass
class Block:
    """Rows that ``segmented.segment_moments`` computed on the device, waiting for ``collect``'s host copy."""

    rows: np.ndarray
    moments: torch.Tensor
    batched: np.ndarray  # per row: has units
    bounded: np.ndarray  # per row: has saturation bounds
    spread: np.ndarray  # per row: has a sample spread (2 samples or more)
    complete: bool = False  # fused's rows: finite moments, NaN and Inf counts; nothing to recompute

    def write(self, rows: np.ndarray, values: np.ndarray) -> None:
        """Put the block's host ``values`` (``[k, 10]``, or ``[k, fused.COLUMNS]`` when complete) into the
        reducer's ``rows``."""
        if self.complete:
            write_complete(rows, [self], values)
            return
        rows[self.rows[:, None], _SEGMENT_COLUMNS] = values[:, :segmented.NONZERO]
        rows[self.rows, FIELD["zeros"]] = rows[self.rows, _COUNT] - values[:, segmented.NONZERO]
        rows[self.rows[self.batched], FIELD["dead_units"]] = values[self.batched, segmented.DEAD]
        rows[self.rows[self.bounded], FIELD["saturated"]] = values[self.bounded, segmented.SATURATED]
        both = self.batched & self.bounded
        rows[self.rows[both], FIELD["saturated_units"]] = values[both, segmented.SATURATED_UNITS]
        spread = self.rows[self.spread]  # every element takes part: a NaN or Inf sends the row to the recompute
        rows[spread, _SPREAD_COUNT] = rows[spread, _COUNT]
        rows[spread, _SPREAD_SUM_SQ] = values[self.spread, segmented.SUM_SQ]
        rows[spread, _SPREAD_DEV] = values[self.spread, segmented.SPREAD]


def single_block(row: int, moments: torch.Tensor, batch: int, bounded: bool) -> Block:
    """The complete block of one tensor's row (a large device tensor ``fused`` reduced at its registration),
    from shared read-only index and flag arrays."""
    return Block(_ONE_ROW[row] if row < len(_ONE_ROW) else np.array([row]), moments,
                 *_FLAGS[(batch > 0, bounded, batch > 1)], True)


_ONE_ROW = [np.array([row]) for row in range(4096)]
_FLAGS = {(a, b, c): tuple(np.array([flag]) for flag in (a, b, c)) for a in (False, True) for b in (False, True)
          for c in (False, True)}
for _arrays in (*_ONE_ROW, *(array for flags in _FLAGS.values() for array in flags)):
    _arrays.flags.writeable = False


def write_complete(rows: np.ndarray, blocks: list[Block], values: np.ndarray) -> None:
    """Put the host ``values`` of complete ``blocks`` (their ``[k, fused.COLUMNS]`` rows one after the other)
    into the reducer's ``rows``, all blocks at once (a step has a block per large tensor it registered)."""
    at = np.concatenate([b.rows for b in blocks]) if len(blocks) > 1 else blocks[0].rows
    batched, bounded, spread_rows = (np.concatenate([getattr(b, name) for b in blocks]) if len(blocks) > 1
                                     else getattr(blocks[0], name) for name in ("batched", "bounded", "spread"))
    rows[at[:, None], _SEGMENT_COLUMNS] = values[:, :segmented.NONZERO]
    rows[at, FIELD["nan"]] = values[:, fused.NAN]
    rows[at, FIELD["inf"]] = values[:, fused.INF]
    rows[at, FIELD["zeros"]] = rows[at, _COUNT] - values[:, segmented.NONZERO]
    rows[at[batched], FIELD["dead_units"]] = values[batched, segmented.DEAD]
    rows[at[bounded], FIELD["saturated"]] = values[bounded, segmented.SATURATED]
    both = batched & bounded
    rows[at[both], FIELD["saturated_units"]] = values[both, segmented.SATURATED_UNITS]
    spread = at[spread_rows]  # the units finite in every sample, each counted with all its samples
    samples = rows[spread, _COUNT] / rows[spread, FIELD["units"]]
    rows[spread, _SPREAD_COUNT] = values[spread_rows, fused.FINITE_UNITS] * samples
    rows[spread, _SPREAD_SUM_SQ] = values[spread_rows, fused.FINITE_SUM_SQ]
    rows[spread, _SPREAD_DEV] = values[spread_rows, segmented.SPREAD]


def segmentable(tensor: torch.Tensor, start: torch.Tensor | None, copy_to: torch.Tensor | None) -> bool:
    """Whether ``add_many`` reduces ``tensor`` (and its start and copy) with the other tensors of its device
    and dtype (``segmented``, or ``fused`` where Triton runs, which takes tensors of any size)."""
    if not (segmented.segmentable(tensor) or fused.usable(tensor)):
        return False
    for other in (start, copy_to):
        if other is not None and not (other.dtype == tensor.dtype and other.device == tensor.device
                                      and other.shape == tensor.shape and not other.is_neg()):
            return False
    return True


def complement(rows: np.ndarray, slots: np.ndarray, packed: np.ndarray, field: int, total_field: int) -> None:
    """Turn the non-zero counts that device reductions delivered for ``field`` (in ``packed``, at ``slots``) into
    the zero counts the row stores: ``total_field`` minus them."""
    mask = slots[:, 1] == field
    target = slots[mask, 0]
    rows[target, field] = rows[target, total_field] - packed[mask]

"""Device results on their way into host rows: the blocks of rows ``segmented.segment_moments`` computed,
the one host copy per device that ``Reducer.collect`` makes of every pending result, and the count fields
that device reductions deliver as their complement (non-zero elements and units, stored as zero ones).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from comgra_ndbg.stats import segmented
from comgra_ndbg.stats.fields import FIELD

__all__ = ["Block", "to_host", "segmentable", "complement"]

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

    def write(self, rows: np.ndarray, values: np.ndarray) -> None:
        """Put the block's host ``values`` (``[k, 10]``) into the reducer's ``rows``."""
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


def to_host(parts: list[torch.Tensor]) -> list[np.ndarray]:
    """Every tensor of ``parts`` as a flat float64 numpy array, in one copy per device."""
    out: list[np.ndarray | None] = [None] * len(parts)
    by_device: dict[torch.device, list[int]] = {}
    for i, part in enumerate(parts):
        by_device.setdefault(part.device, []).append(i)
    for members in by_device.values():
        host = torch.cat([parts[i].reshape(-1) for i in members]).cpu().numpy()
        for i, values in zip(members, np.split(host, np.cumsum([parts[i].numel() for i in members])[:-1])):
            out[i] = values
    return out


def segmentable(tensor: torch.Tensor, start: torch.Tensor | None, copy_to: torch.Tensor | None) -> bool:
    """Whether ``add_many`` reduces ``tensor`` (and its start and copy) with ``segmented``."""
    if not segmented.segmentable(tensor):
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

"""Snapshots of device tensors, computed where the tensors lie and copied to the host together.

Every array of a snapshot taken on the host path is a numpy array at once. On a device, each ``.cpu()``
waits for the device to finish everything queued before it, and so does each index uploaded from pageable
memory: a step's snapshots waited hundreds of times. Here a device snapshot keeps its arrays on the device
(``on_host`` leaves them as tensors), its indices come from a per-device cache or through pinned memory
(``device_index``), its per-sample statistics are one ``fused`` call where Triton runs
(``fused_per_sample_stats``), and ``materialize`` copies all of a step's device arrays in one copy per device
and dtype when the step's record is built.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from comgra_ndbg.stats import fused, segmented
from comgra_ndbg.store.schema import STAT_FIELDS
from comgra_ndbg.store.segment import SnapshotData

__all__ = ["device_index", "fused_per_sample_stats", "materialize", "on_host"]

_NOTHING = np.zeros(0, dtype=np.int64)


def device_index(index: np.ndarray, device: torch.device) -> torch.Tensor:
    """``index`` (int64) on ``device``, without waiting for the device: a cached index (read-only, as the
    recorder's own are) is uploaded once per device, any other through pinned memory."""
    if index.flags.writeable or device.type != "cuda":
        host = torch.from_numpy(np.array(index, dtype=np.int64))
        return host.to(device) if device.type != "cuda" else host.pin_memory().to(device, non_blocking=True)
    key = (id(index), device)
    found = _INDICES.get(key)
    if found is None or found[0] is not index:
        if len(_INDICES) >= _MAX_INDICES:  # shapes that no longer recur: start over
            _INDICES.clear()
        uploaded = torch.from_numpy(index.copy()).pin_memory().to(device, non_blocking=True)
        found = _INDICES[key] = (index, uploaded)
    return found[1]


_INDICES: dict[tuple[int, torch.device], tuple[np.ndarray, torch.Tensor]] = {}  # the array kept: its id stays its own
_MAX_INDICES = 4096


def on_host(x: torch.Tensor) -> np.ndarray | torch.Tensor:
    """A host tensor as a numpy array; a device tensor as it is, for ``materialize`` to copy with the step's
    other snapshots."""
    return x.numpy() if x.is_cpu else x


def materialize(snapshots: list[tuple[int, int, SnapshotData]]) -> list[tuple[int, int, SnapshotData]]:
    """``snapshots`` (series, iteration, data) with the arrays the device path left on a device copied to
    the host: one copy per device and dtype for the whole step, instead of one synchronising copy per
    array of every tensor."""
    pending = [(i, name, getattr(data, name)) for i, (_, _, data) in enumerate(snapshots)
               for name in ("sample_stats", "values") if isinstance(getattr(data, name), torch.Tensor)]
    if not pending:
        return snapshots
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for j, (_, _, tensor) in enumerate(pending):
        groups.setdefault((tensor.device, tensor.dtype), []).append(j)
    host: list[np.ndarray] = [_NOTHING] * len(pending)
    for members in groups.values():
        flat = torch.cat([pending[j][2].reshape(-1) for j in members]).cpu().numpy()
        cuts = np.cumsum([pending[j][2].numel() for j in members])[:-1]
        for j, part in zip(members, np.split(flat, cuts)):
            host[j] = part.reshape(pending[j][2].shape)
    out = list(snapshots)
    for (i, name, _), array in zip(pending, host):
        series, iteration, data = out[i]
        out[i] = (series, iteration, replace(data, **{name: array}))
    return out


def fused_per_sample_stats(x: torch.Tensor, thresholds: tuple[float, float] | None) -> torch.Tensor:
    """The sufficient-statistic row of every sample of ``x`` (``[samples, units]``, both non-zero, on a device
    ``fused.usable`` takes), ``saturated`` counting elements at or beyond ``thresholds`` (the margin applied),
    left on the device: one ``fused_moments`` call over the samples (its rows are complete: finite moments,
    NaN and Inf counts), laid out by one ``stack`` (no index tensor to upload)."""
    samples, units = x.shape
    moments = fused.fused_moments(list(x), None, [thresholds] * samples)
    zero = moments.new_zeros(samples)
    count = torch.full_like(zero, units)
    columns = {"count": count, "zeros": count - moments[:, segmented.NONZERO]}
    columns.update((name, moments[:, column]) for name, column in _PER_SAMPLE_COLUMNS.items())
    if thresholds is not None:
        columns.update(bounded=count, saturated=moments[:, segmented.SATURATED])
    return torch.stack([columns.get(name, zero) for name in STAT_FIELDS], 1)


_PER_SAMPLE_COLUMNS = {"nan": fused.NAN, "inf": fused.INF, "sum": segmented.SUM, "sum_sq": segmented.SUM_SQ,
                       "sum_abs": segmented.SUM_ABS, "min": segmented.MIN, "max": segmented.MAX}

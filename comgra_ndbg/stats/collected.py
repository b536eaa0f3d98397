"""One ``Reducer.collect``'s results on their way to the host, and the rows they become there.

A device's results (the scalars of per-tensor reductions, the rows of ``segmented`` and ``fused``) leave in
one copy per device: a non-blocking copy into pinned memory on CUDA, followed by an event, so the training
step goes on while they travel. ``Collected.rows()`` waits only for that event, then fills the rows: the
copied values into their fields, the non-zero counts turned into zero counts, and an exact float64
recompute of the rows a fast path could not finish (NaN, ±Inf or cancellation in its sums; ``fused``'s
rows are complete and never recomputed). A part that cannot be copied costs its own rows, listed in
``failed``, and never the others.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from comgra_ndbg.stats import fused
from comgra_ndbg.stats.exact import cancels, exact_moments
from comgra_ndbg.stats.fields import FIELD, identity_row
from comgra_ndbg.stats.host import CHECKED_COLUMNS, MOMENT_COLUMNS
from comgra_ndbg.stats.transfer import Block, complement, write_complete

__all__ = ["Collected", "Pending", "Transfer"]

_IDENTITY = identity_row()
_Key = tuple[torch.device, torch.dtype]


@dataclass
class Pending:
    """A tensor whose row may need the exact recompute, kept until its rows are on the host."""

    tensor: torch.Tensor
    row: int
    batched: bool
    bounds: tuple[float, float] | None


class Transfer:
    """Float64 device tensors copied to the host together: one copy per device, non-blocking into pinned
    memory for CUDA (read once its event has passed), at once for any other device."""

    def __init__(self, parts: list[torch.Tensor]) -> None:
        self._sizes = [part.numel() for part in parts]
        self._copies: list[tuple[list[int], torch.Tensor, torch.cuda.Event | None]] = []
        by_device: dict[torch.device, list[int]] = {}
        for i, part in enumerate(parts):
            by_device.setdefault(part.device, []).append(i)
        for device, members in by_device.items():
            flat = torch.cat([parts[i].reshape(-1) for i in members])
            if device.type == "cuda":
                host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
                host.copy_(flat, non_blocking=True)
                event = torch.cuda.Event()
                event.record(torch.cuda.current_stream(device))
                self._copies.append((members, host, event))
            else:
                self._copies.append((members, flat.cpu(), None))

    @property
    def waits(self) -> bool:
        """Whether a copy from a device is part of this transfer."""
        return any(event is not None for _, _, event in self._copies)

    def result(self) -> list[np.ndarray]:
        """Every part as a flat float64 numpy array, in the order given (waits for the copies)."""
        out: list[np.ndarray] = [np.zeros(0)] * len(self._sizes)
        for members, host, event in self._copies:
            if event is not None:
                event.synchronize()
            cuts = np.cumsum([self._sizes[i] for i in members])[:-1]
            for i, values in zip(members, np.split(host.numpy(), cuts)):
                out[i] = values
        return out


class Collected:
    """What one ``collect_later`` took from its reducer: the host rows so far, the device results travelling
    to the host, and the tensors the exact recompute may read."""

    def __init__(self, rows: np.ndarray, scalars: dict[_Key, list[torch.Tensor]],
                 slots: dict[_Key, list[tuple[int, int]]], blocks: list[Block], pending: list[Pending],
                 failed: dict[int, str]) -> None:
        self.failed = failed  # row -> why it could not be computed
        self.reported = False  # whether the recorder logged ``failed`` (rows read late report once)
        self._rows = rows
        self._slots = [slots[key] for key in scalars]
        self._blocks = blocks
        self._pending = pending
        self._result: np.ndarray | None = None
        self._parts: list[torch.Tensor] = []
        self._transfer: Transfer | None = None
        if scalars or blocks:
            try:
                self._parts = [torch.stack(group).to(torch.float64) for group in scalars.values()]
                self._parts += [block.moments for block in blocks]
                self._transfer = Transfer(self._parts)
            except Exception:  # noqa: BLE001 - rows() copies one part at a time, to find the ones that fail
                self._transfer = None

    @classmethod
    def ready(cls, rows: np.ndarray, failed: dict[int, str]) -> Collected:
        """Rows computed on the host already: nothing travels, nothing is recomputed."""
        done = cls.__new__(cls)
        done.failed, done.reported, done._result, done._transfer = failed, False, rows, None
        done._rows, done._slots, done._blocks, done._pending, done._parts = rows, [], [], [], []
        return done

    def __len__(self) -> int:
        """How many rows the reducer handed over (computed or not)."""
        return len(self._rows)

    @property
    def travelling(self) -> bool:
        """Whether some result is still on its way from a device (``rows()`` would wait for it)."""
        return self._result is None and self._transfer is not None and self._transfer.waits

    def rows(self) -> np.ndarray:
        """The ``[n, NUM_FIELDS]`` rows (waits for the copies the first time; the same array after)."""
        if self._result is None:
            try:
                self._result = self._finish()
            finally:
                self._parts, self._pending, self._blocks, self._transfer = [], [], [], None
        return self._result

    def _finish(self) -> np.ndarray:
        rows = self._rows
        if not (self._slots or self._blocks):
            return self._failed_absent(rows)
        count = len(self._slots)
        host: list[np.ndarray | None]
        try:
            host = self._transfer.result() if self._transfer is not None else self._one_by_one()
        except Exception:  # noqa: BLE001 - one part at a time, to find the ones that fail
            host = self._one_by_one()
        good = [i for i in range(count) if host[i] is not None]
        if good:
            packed = np.concatenate([host[i] for i in good])
            slots = np.array([slot for i in good for slot in self._slots[i]], dtype=np.int64)
            rows[slots[:, 0], slots[:, 1]] = packed
            for f in ("zeros", "dead_units"):  # count_nonzero counted the non-zero elements / units
                complement(rows, slots, packed, FIELD[f], FIELD["count"] if f == "zeros" else FIELD["units"])
        wide, complete = np.zeros((2, len(rows)), dtype=np.bool_)  # summed in float64; fused's, final
        finished = [(block, values) for block, values in zip(self._blocks, host[count:]) if values is not None]
        if any(block.complete for block, _ in finished):  # all of them in one write
            whole = [(block, values) for block, values in finished if block.complete]
            write_complete(rows, [block for block, _ in whole], np.concatenate([values for _, values in whole])
                           .reshape(-1, fused.COLUMNS))
            complete[np.concatenate([block.rows for block, _ in whole])] = True
        for block, values in finished:
            if not block.complete:
                block.write(rows, values.reshape(len(block.rows), -1))
                wide[block.rows] = True
        cancelling = cancels(rows)
        cancelling[wide] = cancels(rows[wide], tolerance=1e-8)
        suspicious = (~np.isfinite(rows[:, CHECKED_COLUMNS]).all(axis=1) | cancelling) & ~complete
        if suspicious.any():
            for pending in self._pending:
                if suspicious[pending.row] and pending.row not in self.failed:
                    rows[pending.row, MOMENT_COLUMNS] = np.nan
                    try:
                        exact_moments(pending.tensor, rows[pending.row],
                                      batch=pending.tensor.shape[0] if pending.batched else 0)
                    except Exception as error:  # noqa: BLE001 - reported as failed
                        self._fail([pending.row], error)
        return self._failed_absent(rows)

    def _failed_absent(self, rows: np.ndarray) -> np.ndarray:
        if self.failed:
            rows[list(self.failed)] = _IDENTITY
        return rows

    def _one_by_one(self) -> list[np.ndarray | None]:
        """Each part copied on its own: a part that fails marks its rows failed and comes back as None."""
        out: list[np.ndarray | None] = []
        for i, part in enumerate(self._parts):
            try:
                out.append(part.reshape(-1).cpu().numpy())
            except Exception as error:  # noqa: BLE001 - reported as failed
                rows = ([slot[0] for slot in self._slots[i]] if i < len(self._slots)
                        else self._blocks[i - len(self._slots)].rows.tolist())
                self._fail(rows, error)
                out.append(None)
        if len(self._parts) < len(self._slots) + len(self._blocks):  # stacking failed: every row with them
            for slot_rows in self._slots:
                self._fail([slot[0] for slot in slot_rows], RuntimeError("its results could not be gathered"))
            for block in self._blocks:
                self._fail(block.rows.tolist(), RuntimeError("its results could not be gathered"))
            return [None] * (len(self._slots) + len(self._blocks))
        return out

    def _fail(self, rows: list[int], error: BaseException) -> None:
        for row in rows:
            self.failed.setdefault(int(row), f"{type(error).__name__}: {error}")

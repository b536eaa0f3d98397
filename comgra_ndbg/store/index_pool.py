"""The value-index pool of snapshots, with one copy of each distinct index.

Sub-sampling is deterministic, so every snapshot of a tensor keeps the same element positions: a run that
snapshots 80 tensors every 10th step stored the same few index arrays thousands of times, more bytes than
the values themselves (int64 against float32), and compressing them took most of a flush's time.
Snapshots refer to their index by offset and count, so equal indices can share one slice of the pool;
readers need no change.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["SharedPool", "merge_index_pools"]


class SharedPool:
    """Appends int64 index arrays to a pool, storing each distinct one once.

    Arrays are recognised by identity first (the recorder hands out one cached, read-only array per
    sub-sampling pattern) and by content otherwise; the pool holds a reference to every array it was given,
    so an identity cannot be reused by another array while it is in use.

    >>> pool = SharedPool()
    >>> a = np.array([0, 5, 9])
    >>> pool.add(a), pool.add(np.array([1, 2])), pool.add(a.copy())
    (0, 3, 0)
    >>> pool.array().tolist()
    [0, 5, 9, 1, 2]
    """

    def __init__(self) -> None:
        self._parts: list[np.ndarray] = []
        self._size = 0
        self._by_identity: dict[int, tuple[np.ndarray, int]] = {}
        self._by_content: dict[bytes, int] = {}

    def add(self, index: np.ndarray) -> int:
        """The pool offset of ``index``'s slice (``len(index)`` long), appending it if it is new."""
        known = self._by_identity.get(id(index))
        if known is not None:
            return known[1]
        wide = np.asarray(index, dtype=np.int64)
        key = wide.tobytes()
        offset = self._by_content.get(key)
        if offset is None:
            offset = self._by_content[key] = self._size
            self._parts.append(wide)
            self._size += len(wide)
        self._by_identity[id(index)] = (index, offset)
        return offset

    def array(self) -> np.ndarray:
        """The pool: every distinct index back to back."""
        return np.concatenate(self._parts) if self._parts else np.zeros(0, np.int64)


def merge_index_pools(pools: Sequence[np.ndarray], offsets: Sequence[np.ndarray], counts: Sequence[np.ndarray]
                      ) -> tuple[np.ndarray, list[np.ndarray]]:
    """One pool for several segments' ``(pool, index offsets, value counts)``, equal slices stored once;
    returns the pool and each segment's new offsets (``-1`` stays ``-1``). Slices nothing refers to are
    dropped.

    >>> pool, new = merge_index_pools([np.array([0, 2, 4]), np.array([7, 0, 2, 4])],
    ...                               [np.array([0, -1]), np.array([1, 0])], [np.array([3, 5]), np.array([3, 1])])
    >>> pool.tolist(), [o.tolist() for o in new]
    ([0, 2, 4, 7], [[0, -1], [0, 3]])
    """
    shared = SharedPool()
    merged = []
    for pool, old, count in zip(pools, offsets, counts):
        new = np.full(len(old), -1, np.int64)
        seen: dict[tuple[int, int], int] = {}
        for i in np.flatnonzero(old >= 0).tolist():
            key = (int(old[i]), int(count[i]))
            at = seen.get(key)
            if at is None:
                at = seen[key] = shared.add(pool[key[0]:key[0] + key[1]])
            new[i] = at
        merged.append(new)
    return shared.array(), merged

"""Ranks of a distributed trial in the explorer: one trial entry per run, a rank selector beside it.

The explorer names what it reads by a *trial key*: the trial's name for a single-process trial, and
``<trial>/rank<r>`` for one rank of a distributed trial (a trial name never holds ``/``, so the key is
unambiguous). The reader cache opens one recording per key, so memoized series, generations and overlays
work per rank unchanged; timeline overlays offer every rank of the other trials (and the other ranks of
this one) as overlay trials.

>>> rank_key("run", 1), split_rank_key("run/rank1"), split_rank_key("solo"), rank_key("solo", None)
('run/rank1', ('run', 1), ('solo', None), 'solo')
"""
from __future__ import annotations

from typing import Any

from comgra_ndbg.store.ranks import parse_rank_folder, rank_folder_name

__all__ = ["RANK_SEPARATOR", "rank_key", "split_rank_key", "rank_options"]

RANK_SEPARATOR = "/"


def rank_key(trial: str, rank: int | None) -> str:
    """The key of rank ``rank`` of ``trial`` (the trial's own name when ``rank`` is None)."""
    return trial if rank is None else f"{trial}{RANK_SEPARATOR}{rank_folder_name(rank)}"


def split_rank_key(key: str) -> tuple[str, int | None]:
    """``(trial, rank)`` of a key; rank None for a plain trial name (or anything that is no rank key)."""
    trial, separator, tail = str(key).rpartition(RANK_SEPARATOR)
    rank = parse_rank_folder(tail) if separator else None
    return (trial, rank) if rank is not None else (str(key), None)


def rank_options(ranks: list[int]) -> list[dict[str, Any]]:
    """The rank selector's options: ``rank 0``, ``rank 1``, … (none for a single-process trial)."""
    return [{"label": f"rank {rank}", "value": rank} for rank in ranks]

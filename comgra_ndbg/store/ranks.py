"""The layout of a distributed run: one trial folder, one sub-folder per rank, each a complete recording.

::

    <group>/<trial>/ranks.json             {"world_size": 2}: marks the folder as a distributed trial
    <group>/<trial>/rank0/recording.h5     (or its segment files while it runs)
    <group>/<trial>/rank1/recording.h5
    ...

Each rank writes its own folder with its own writer and lock, so no rank ever waits for another (each
writes the same ``ranks.json``, by atomic rename, if it is not there yet; it tells a distributed trial from
a group folder whose trials happen to be named ``rank0``, ``rank1``). The
rank, the world size and whether the model was wrapped in ``DistributedDataParallel`` are keys of the
``config`` root attribute of every file (``CONFIG_RANK``, ``CONFIG_WORLD_SIZE``, ``CONFIG_DDP_WRAPPED``).
A trial folder holds either a single-process recording or rank folders, never both.

>>> import tempfile
>>> with tempfile.TemporaryDirectory() as folder:
...     trial = Path(folder) / "run"
...     for rank in (1, 0):
...         (rank_directory(trial, rank, world_size=2)).mkdir()
...         _ = (trial / rank_folder_name(rank) / schema.FINAL_NAME).write_bytes(b"")
...     sorted(rank_folders(trial)), parse_rank_folder("rank12"), parse_rank_folder("rankx")
([0, 1], 12, None)
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from comgra_ndbg.errors import InvalidArgumentError, RecordingExistsError, UnknownSeriesError
from comgra_ndbg.store import schema

__all__ = ["RANK_PREFIX", "RANKS_FILE", "CONFIG_RANK", "CONFIG_WORLD_SIZE", "CONFIG_DDP_WRAPPED", "rank_folder_name",
           "parse_rank_folder", "holds_recording", "rank_folders", "rank_of_folder", "locate_rank", "rank_directory",
           "RankAccess"]

RANK_PREFIX = "rank"
RANKS_FILE = "ranks.json"
CONFIG_RANK = "rank"
CONFIG_WORLD_SIZE = "world_size"
CONFIG_DDP_WRAPPED = "ddp_wrapped"


def rank_folder_name(rank: int) -> str:
    """``rank3`` for rank 3."""
    return f"{RANK_PREFIX}{int(rank)}"


def parse_rank_folder(name: str) -> int | None:
    """The rank a folder name stands for, or None when it is no rank folder."""
    digits = name[len(RANK_PREFIX):]
    if not name.startswith(RANK_PREFIX) or not digits.isdigit() or digits != str(int(digits)):
        return None
    return int(digits)


def holds_recording(path: Path) -> bool:
    """Whether ``path`` is a folder with one recording: a consolidated file or segment files."""
    return path.is_dir() and ((path / schema.FINAL_NAME).exists()
                              or any(path.glob(f"{schema.SEGMENT_PREFIX}*{schema.SEGMENT_SUFFIX}")))


def rank_folders(trial: Path) -> dict[int, Path]:
    """Rank -> folder of every rank of a distributed trial that holds a recording (empty for a
    single-process trial or a folder that is no trial)."""
    if not (trial / RANKS_FILE).is_file():
        return {}
    found = {}
    for path in trial.iterdir():
        rank = parse_rank_folder(path.name)
        if rank is not None and holds_recording(path):
            found[rank] = path
    return dict(sorted(found.items()))


def rank_of_folder(path: Path) -> tuple[Path, int] | None:
    """(trial folder, rank) when ``path`` is the rank folder of a distributed trial, else None."""
    rank = parse_rank_folder(path.name)
    return (path.parent, rank) if rank is not None and rank in rank_folders(path.parent) else None


def locate_rank(location: Path, trial: str, rank: int | None) -> tuple[Path, dict[str, Any]]:
    """The folder a reader of rank ``rank`` (None: the lowest) of the trial at ``location`` opens, and the
    ``Recording`` keywords that say which rank it is; a single-process trial has no rank to ask for."""
    ranks = rank_folders(location)
    if not ranks:
        if rank is not None:
            raise UnknownSeriesError(f"trial {trial!r} was recorded by a single process; it has no rank {rank} "
                                     f"(open it without rank=)")
        return location, {}
    rank = next(iter(ranks)) if rank is None else int(rank)
    if rank not in ranks:
        raise UnknownSeriesError(f"trial {trial!r} has no rank {rank}; its ranks are {list(ranks)}")
    return ranks[rank], {"rank": rank, "ranks": list(ranks), "ranks_root": location}


def rank_directory(trial: Path, rank: int, *, world_size: int) -> Path:
    """The folder rank ``rank`` records into, with the trial folder created and marked as distributed
    (``RANKS_FILE``); refuses a trial folder that holds a single-process recording (its files and the ranks'
    would be two recordings under one name)."""
    if holds_recording(trial):
        raise RecordingExistsError(f"trial folder {trial} holds a recording of a single process; a distributed run "
                                   f"records one folder per rank inside its trial folder: choose another trial name")
    marker = trial / RANKS_FILE
    if not marker.is_file():
        temporary = trial / f"{RANKS_FILE}.{rank}{schema.TEMP_SUFFIX}"
        try:
            trial.mkdir(parents=True, exist_ok=True)
            temporary.write_text(json.dumps({CONFIG_WORLD_SIZE: int(world_size)}))
            os.replace(temporary, marker)  # every rank writes the same content: whichever lands last is right
        except OSError as error:
            raise InvalidArgumentError(f"cannot write into {trial} ({error.strerror or error}); pass a folder you can "
                                       f"write to") from error
    return trial / rank_folder_name(rank)


class RankAccess:
    """What ``Recording`` knows of the ranks of its trial: ``rank`` (None for a single-process trial),
    ``ranks`` (every rank recorded, sorted; empty for a single process), ``world_size`` and
    ``ddp_wrapped`` from the recording's config, and :meth:`with_rank` to open another rank."""

    rank: int | None
    ranks: list[int]
    _ranks_root: Path | None

    def _init_ranks(self, rank: int | None, ranks: list[int], root: Path | None) -> None:
        self.rank, self.ranks, self._ranks_root = rank, list(ranks), root

    @property
    def trial_folder(self) -> Path:
        """The trial's folder: the one holding the rank folders for a distributed trial, else ``location``."""
        return self._ranks_root if self._ranks_root is not None else self.location

    @property
    def config(self) -> dict[str, Any]:
        """The recorder's settings, as stored in the newest file's ``config`` attribute ({} when unreadable)."""
        for view in reversed(list(self._views.values())):
            try:
                return json.loads(str(view.file.attrs.get(schema.ATTR_CONFIG, "{}")))
            except (OSError, ValueError, KeyError):
                continue
        return {}

    @property
    def world_size(self) -> int:
        """Processes of the run as the recorder saw them (1 for a single-process recording)."""
        value = self.config.get(CONFIG_WORLD_SIZE)
        return int(value) if isinstance(value, int) else max(1, len(self.ranks))

    @property
    def ddp_wrapped(self) -> bool | None:
        """Whether this rank's model was wrapped in ``DistributedDataParallel`` (None: not recorded, e.g. a
        ``Recorder`` used directly)."""
        value = self.config.get(CONFIG_DDP_WRAPPED)
        return bool(value) if isinstance(value, bool) else None

    def with_rank(self, rank: int) -> Any:
        """The recording of rank ``rank`` of the same trial."""
        if not self.ranks or self._ranks_root is None:
            raise UnknownSeriesError(f"trial {self.trial!r} was recorded by a single process; it has no ranks")
        if isinstance(rank, bool) or not isinstance(rank, int) or rank not in self.ranks:
            raise UnknownSeriesError(f"trial {self.trial!r} has no rank {rank!r}; its ranks are {self.ranks}")
        return type(self)(self._ranks_root / rank_folder_name(rank), trial=self.trial, trials=self.trials,
                          group=self.group, damaged="skip" if self.skip_damage else "raise", rank=rank,
                          ranks=self.ranks, ranks_root=self._ranks_root)

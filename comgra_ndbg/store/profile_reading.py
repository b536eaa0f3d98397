"""Reading the profiling tables (format version 4, ``schema.PROFILE_*`` and ``schema.PROCESS_*``): a mixin of
``Recording`` whose :meth:`ProfileReading.profile` returns one :class:`ProfileTables`. Files written without
``profile=`` (and files of versions 1 to 3) have none: their profile is empty."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from comgra_ndbg.errors import UnknownSeriesError
from comgra_ndbg.store import schema

__all__ = ["ProfileReading", "ProfileTables"]


@dataclass(frozen=True)
class ProfileTables:
    """Per-layer profile and process memory of a recording, as dense arrays.

    ``modules`` in first-profiled order; ``steps`` the profiled steps, ascending; ``data[step, module, field]``
    over ``schema.PROFILE_FIELDS``, NaN where a module did not run in a step or a field was not measured.
    ``process_steps`` and ``process[row, field]`` over ``schema.PROCESS_FIELDS``: every step seen while
    profiling was on (wall time, RSS, device allocator).

    >>> empty = ProfileTables.empty()
    >>> empty.is_empty, empty.field("flops").shape
    (True, (0, 0))
    """

    modules: tuple[str, ...]
    steps: np.ndarray
    data: np.ndarray
    process_steps: np.ndarray
    process: np.ndarray

    @classmethod
    def empty(cls) -> ProfileTables:
        return cls((), np.zeros(0, np.int64), np.zeros((0, 0, len(schema.PROFILE_FIELDS))), np.zeros(0, np.int64),
                   np.zeros((0, len(schema.PROCESS_FIELDS))))

    @property
    def is_empty(self) -> bool:
        """Neither module profiles nor process rows (the recording was made without ``profile=``)."""
        return not len(self.steps) and not len(self.process_steps)

    def field(self, name: str) -> np.ndarray:
        """``[steps, modules]`` of one of ``schema.PROFILE_FIELDS``."""
        if name not in schema.PROFILE_FIELD:
            raise UnknownSeriesError(f"no profile field {name!r}; fields are {list(schema.PROFILE_FIELDS)}")
        return self.data[:, :, schema.PROFILE_FIELD[name]]

    def process_field(self, name: str) -> np.ndarray:
        """``[process rows]`` of one of ``schema.PROCESS_FIELDS``, parallel to ``process_steps``."""
        if name not in schema.PROCESS_FIELD:
            raise UnknownSeriesError(f"no process field {name!r}; fields are {list(schema.PROCESS_FIELDS)}")
        return self.process[:, schema.PROCESS_FIELD[name]]

    def at(self, step: int) -> np.ndarray:
        """``[modules, fields]`` of one profiled step."""
        found = np.flatnonzero(self.steps == step)
        if not len(found):
            raise UnknownSeriesError(f"step {step} was not profiled; profiled steps are "
                                     f"{self.steps.tolist()[:20]}{' …' if len(self.steps) > 20 else ''}")
        return self.data[int(found[0])]


class ProfileReading:
    """``Recording.profile()``; not used on its own."""

    def profile(self) -> ProfileTables:
        """The recording's per-layer profile and process memory (empty without ``profile=``)."""
        fields, process_fields = len(schema.PROFILE_FIELDS), len(schema.PROCESS_FIELDS)
        steps = self._concat(schema.PROFILE_STEP).astype(np.int64)
        names = self._concat(schema.PROFILE_MODULE)
        data = self._concat(schema.PROFILE_DATA).reshape(-1, fields).astype(np.float64)
        process_steps = self._concat(schema.PROCESS_STEP).astype(np.int64)
        process = self._concat(schema.PROCESS_DATA).reshape(-1, process_fields).astype(np.float64)
        if len(steps) != len(names) or len(steps) != len(data) or len(process_steps) != len(process):
            return ProfileTables.empty()  # a file that lost part of a table: left out like other damaged tables
        order = np.argsort(process_steps, kind="stable")
        modules = tuple(dict.fromkeys(str(n) for n in names))
        profiled = np.unique(steps)
        dense = np.full((len(profiled), len(modules), fields), np.nan)
        column = {name: i for i, name in enumerate(modules)}
        rows = np.searchsorted(profiled, steps)
        cols = np.array([column[str(n)] for n in names], np.int64)
        dense[rows, cols] = data
        return ProfileTables(modules, profiled, dense, process_steps[order], process[order])

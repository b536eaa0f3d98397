"""Typed errors raised at the library's boundary.

Every message names what was wrong (the tensor, the step, the path) and what to do about it, so that a
user reading a traceback in the middle of a training script can fix the call without opening the docs.
"""
from __future__ import annotations

__all__ = [
    "ComgraError",
    "RecorderStateError",
    "InvalidTensorError",
    "InvalidArgumentError",
    "DuplicateTensorError",
    "RecordingExistsError",
    "RecordingNotFoundError",
    "RecordingFormatError",
    "CorruptRecordingError",
    "UnknownSeriesError",
    "GraphError",
    "UnknownModuleError",
    "NoFailureError",
    "MissingDependencyError",
    "RecorderWarning",
]


class ComgraError(Exception):
    """Base class of every error this library raises on purpose."""


class RecorderStateError(ComgraError, RuntimeError):
    """A recorder method was called in the wrong order (e.g. ``register_tensor`` outside a step)."""


class InvalidTensorError(ComgraError, TypeError):
    """Something that is not a ``torch.Tensor`` (or not usable as one) was handed to the recorder."""


class InvalidArgumentError(ComgraError, ValueError):
    """An argument of a library call has a wrong value (an unknown role, a negative step, ...)."""


class DuplicateTensorError(ComgraError, ValueError):
    """The same tensor name was registered twice in one iteration of one step."""


class RecordingExistsError(ComgraError, FileExistsError):
    """A recording for this trial already exists and the mode forbids overwriting it."""


class RecordingNotFoundError(ComgraError, FileNotFoundError):
    """The path given to the reader holds no recording."""


class RecordingFormatError(ComgraError, ValueError):
    """A file exists but is not a recording this version can read (wrong or newer format)."""


class CorruptRecordingError(RecordingFormatError):
    """A recording is damaged: a file is unreadable, truncated, fails its checksums, belongs to another
    recording, or is missing. The message names the file, the steps affected and what to run
    (``comgra-ndbg check PATH --salvage``); ``damage`` lists each finding."""

    def __init__(self, message: str, damage: tuple = ()) -> None:
        super().__init__(message)
        self.damage = tuple(damage)


class UnknownSeriesError(ComgraError, KeyError):
    """A query named a node, tensor, kind, statistic or step that the recording does not contain."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class GraphError(ComgraError, ValueError):
    """A graph, a graph description or a graph request is inconsistent (unknown tensor, bad format)."""


class UnknownModuleError(ComgraError, KeyError):
    """A module was looked up by object that was never given to ``track_module`` (nor is inside one that was)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class NoFailureError(ComgraError, LookupError):
    """Something that exists only for a failing run (a failure signature) was asked of a run whose analysis
    found no failure; the message names the trial and how to look at it anyway (``explain``, the GUI)."""


class MissingDependencyError(ComgraError, ImportError):
    """An optional feature needs a package that is not installed; the message names the package and the
    ``pip install`` line (an extra of ``comgra_ndbg``) that brings it."""


class RecorderWarning(UserWarning):
    """The recorder hit a problem of its own and carried on without it; training is unaffected. Each
    problem is also logged in the recording (``Recording.problems()``)."""

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
    "MissingDependencyError",
    "NotebookError",
    "BreakpointHit",
    "TrainingHalted",
    "ReferenceMismatchError",
    "NoFailureError",
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
    """A module was looked up by object that was never given to ``track_module`` (nor is inside one that was),
    or by a path the model does not have (``NeuralDbg.break_at``)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class MissingDependencyError(ComgraError, ImportError):
    """An optional part of the library needs a package that is not installed (a training framework for its
    callback, Jupyter for inline display); the message names the package and the ``pip install`` line."""


class NotebookError(ComgraError, RuntimeError):
    """Something that only works inside a Jupyter kernel (showing the explorer inline) was called outside
    one; the message says what to run instead."""


class BreakpointHit(ComgraError, RuntimeError):
    """A ``NeuralDbg.break_at(..., action="raise")`` breakpoint fired: raised from the module's forward hook
    (``at="forward"``) or from the gradient hook in ``backward()`` (``at="backward"``), carrying what the
    module saw so the caller can inspect it, as the ``"pdb"`` action and a callback see it: ``module`` (the
    module object), ``path`` (its path inside the model, ``"blocks.2"``), ``step``, ``at``, ``inputs`` (the
    forward arguments), ``output``, ``grad`` (the output's gradient, backward only) and ``reason``."""

    def __init__(self, message: str, *, module: object, path: str, step: int | None, at: str, inputs: tuple,
                 output: object, grad: object = None, reason: str = "") -> None:
        super().__init__(message)
        self.module, self.path, self.step, self.at = module, path, step, at
        self.inputs, self.output, self.grad, self.reason = inputs, output, grad, reason


class TrainingHalted(ComgraError, RuntimeError):
    """A flight-recorder trigger with ``halt=True`` fired: training was stopped (``halt_delay`` steps after the
    step that tripped it, ``last_step``), with everything recorded before on disk. ``step`` and ``reason``
    say what fired, ``diagnosis`` is the analysis of the recording at that moment (None if the analysis
    itself failed), ``path`` the recording."""

    def __init__(self, message: str, *, step: int, reason: str, last_step: int | None, diagnosis: object,
                 path: object) -> None:
        super().__init__(message)
        self.step, self.reason, self.last_step, self.diagnosis, self.path = step, reason, last_step, diagnosis, path


class ReferenceMismatchError(ComgraError, ValueError):
    """A reference run given to the analysis cannot be compared with the run: no node in common, other
    parameter nodes, or parameters of other shapes. The message says what differs and what to do."""


class NoFailureError(ComgraError, LookupError):
    """Something that exists only for a failing run (a failure signature) was asked of a run whose analysis
    found no failure; the message names the trial and how to look at it anyway (``explain``, the GUI)."""


class RecorderWarning(UserWarning):
    """The recorder hit a problem of its own and carried on without it; training is unaffected. Each
    problem is also logged in the recording (``Recording.problems()``)."""

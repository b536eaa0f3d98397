"""What every framework callback shares: one :class:`~comgra_ndbg.NeuralDbg` over the trainer's model, the
framework's logged metrics as KPIs, and the analysis when training ends.

The framework drives the loop, so every call from a callback goes through :meth:`FrameworkRecording._guard`:
a problem of the recorder (a full disk, a metric it cannot read) is warned about once and logged, and the
training run goes on unchanged — at worst without its recording.

>>> import tempfile, torch
>>> from torch import nn
>>> with tempfile.TemporaryDirectory() as folder:
...     recording = FrameworkRecording("demo", path=folder, trial="t", kpi_prefix="demo/")
...     recording.start(nn.Linear(4, 2), None, default_path=folder)
...     loss = recording.dbg.model(torch.randn(8, 4)).pow(2).mean(); loss.backward()
...     recorded = recording.record_metrics({"acc": 0.5, "note": "text"})  # the text is no KPI
...     diagnosis = recording.finish()
...     from comgra_ndbg import open_recording
...     print(recorded, open_recording(folder).kpi("demo/acc")[1].tolist(), diagnosis.num_steps)
1 [0.5] 1
"""
from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from comgra_ndbg.analysis import Diagnosis, analyze
from comgra_ndbg.errors import MissingDependencyError, RecorderWarning
from comgra_ndbg.neuraldbg import NeuralDbg

__all__ = ["VALIDATION", "FrameworkRecording", "RecordingAccess", "require", "scalar", "unwrap_optimizer", "summary_line"]

VALIDATION = "validation"
"""The step type under which validation (evaluation) metrics are recorded as KPIs, and the framework's
validation passes as NeuralDbg's evaluation runs (``eval_step_type``, ``instrument/evaluation.py``)."""


def require(module: str, *, extra: str, framework: str) -> Any:
    """Import ``module``, or raise :class:`MissingDependencyError` naming the ``pip install`` line.

    >>> require("comgra_ndbg_no_such_framework", extra="x", framework="X")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    comgra_ndbg.errors.MissingDependencyError: X is not installed (...); install it with `pip install 'comgra-ndbg[x]'`...
    """
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingDependencyError(f"{framework} is not installed (module {module!r} not found); install it with "
                                     f"`pip install 'comgra-ndbg[{extra}]'`, then import this callback again") from None


def scalar(value: Any) -> float | None:
    """``value`` as a float when it is one real number (a number, a one-element tensor or array), else None:
    frameworks log strings and vectors too, which are not KPIs.

    >>> scalar(3), scalar(torch.tensor([0.25])), scalar("epoch"), scalar(True), scalar(torch.ones(2))
    (3.0, 0.25, None, None, None)
    """
    if isinstance(value, bool) or isinstance(value, str):
        return None
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.is_complex() or value.is_nested or value.device.type == "meta":
            return None
        return float(value.detach().reshape(()).item())
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number


def unwrap_optimizer(optimizer: Any) -> torch.optim.Optimizer | None:
    """The ``torch.optim.Optimizer`` that updates the parameters, inside a framework's wrapper
    (``accelerate``'s ``AcceleratedOptimizer``, Lightning's ``LightningOptimizer``); None when there is none.

    >>> unwrap_optimizer(None) is None
    True
    """
    seen = 0
    while optimizer is not None and seen < 8:
        inner = getattr(optimizer, "optimizer", None)
        if isinstance(inner, torch.optim.Optimizer):
            optimizer, seen = inner, seen + 1
            continue
        return optimizer if callable(getattr(optimizer, "register_step_post_hook", None)) and \
            hasattr(optimizer, "_optimizer_step_post_hooks") else None
    return optimizer


def summary_line(diagnosis: Diagnosis) -> str:
    """The line a callback logs when training ends: the top hypothesis with its confidence, or that none
    was found (with the number of steps analysed)."""
    top = diagnosis.top
    if top is None:
        return f"comgra_ndbg: no failure found in {diagnosis.num_steps} recorded steps"
    more = len(diagnosis.hypotheses) - 1
    return (f"comgra_ndbg: {top.sentence} [{top.type}, origin {top.origin}, step {top.onset}, confidence "
            f"{top.confidence:.2f}]" + (f" ({more} more hypotheses: `comgra-ndbg explain`)" if more else ""))


class FrameworkRecording:
    """One recording of a trainer's run: started with the model, fed the framework's metrics, finished and
    analysed at the end. ``framework`` names the framework in warnings; ``path``, ``trial`` and ``options``
    go to :class:`NeuralDbg` (``path=None``: ``default_path`` of :meth:`start`); the framework's metrics
    become KPIs named ``kpi_prefix + name``, so they never mix with the recorder's own ``loss`` and
    ``lr/<group>``."""

    def __init__(self, framework: str, *, path: str | Path | None, trial: str | None, kpi_prefix: str,
                 analyze_at_end: bool = True, options: Mapping[str, Any] | None = None) -> None:
        self.framework = framework
        self.path = None if path is None else Path(path)
        self.trial = trial
        self.kpi_prefix = kpi_prefix
        self.analyze_at_end = analyze_at_end
        self.options = dict(options or {})
        self.dbg: NeuralDbg | None = None
        self._optimizer: torch.optim.Optimizer | None = None
        self.diagnosis: Diagnosis | None = None
        self._warned: set[str] = set()
        self._recorded_at: dict[tuple[str, str | None], int] = {}  # (KPI, step type) -> the step of its last value

    @property
    def active(self) -> bool:
        """Whether a recording is open (started, not finished, not given up after a problem)."""
        return self.dbg is not None and not self.dbg._closed

    @property
    def location(self) -> Path | None:
        """The trial folder being (or last) recorded, or None before :meth:`start`."""
        return None if self.dbg is None else self.dbg.path

    def start(self, model: nn.Module, optimizer: Any, *, default_path: str | Path) -> None:
        """Install NeuralDbg's hooks on ``model``; steps end at ``optimizer``'s steps when it is one
        ``torch.optim.Optimizer`` (possibly wrapped), else where NeuralDbg sees the parameters change."""
        if self.active:
            return
        path = self.path if self.path is not None else Path(default_path)
        self._guard("starting the recording", lambda: self._start(model, unwrap_optimizer(optimizer), path))

    @property
    def exact_steps(self) -> bool:
        """Whether steps end exactly at the optimizer's ``step()`` (else when the next pass sees the change)."""
        return self.active and self._optimizer is not None

    def _start(self, model: nn.Module, optimizer: torch.optim.Optimizer | None, path: Path) -> None:
        self._optimizer = optimizer
        options = {"eval_step_type": VALIDATION, **self.options}  # validation passes: summaries of their own type
        self.dbg = NeuralDbg(model, path, trial=self.trial, optimizer=optimizer, **options)

    def record_metrics(self, metrics: Mapping[str, Any], *, step_type: str | None = None) -> int:
        """Record every real number of ``metrics`` as a KPI of the last step (``step_type``: its own type,
        or e.g. :data:`VALIDATION`); returns how many were recorded. A KPI keeps one value per step and step
        type, the first: frameworks publish a metric again unchanged (Lightning after a validation run), and a
        second point at the same step would be a duplicate. Nothing is recorded before the first step."""
        if not self.active or self.dbg.steps == 0:
            return 0
        recorder = self.dbg.recorder
        step = recorder.current_step if recorder.current_step is not None else recorder._last_step
        count = 0
        for name, value in metrics.items():
            if isinstance(name, str) and name:
                kpi = self.kpi_prefix + name
                if self._recorded_at.get((kpi, step_type)) == step:
                    continue
                if self._guard(f"recording the metric {kpi!r}",
                               lambda: self._record(recorder, kpi, value, step_type)) is True:
                    self._recorded_at[(kpi, step_type)] = step
                    count += 1
        return count

    @staticmethod
    def _record(recorder: Any, kpi: str, value: Any, step_type: str | None) -> bool:
        """Record ``value`` as KPI ``kpi`` when it is one real number; whether it was."""
        number = scalar(value)
        if number is None:
            return False
        recorder.record_kpi(kpi, number, step_type=step_type)
        return True

    def finish(self) -> Diagnosis | None:
        """Close the recording (removing every hook) and, with ``analyze_at_end``, analyse it; the diagnosis
        is also stored with the recording for the GUI and ``comgra-ndbg explain``. None when nothing was
        recorded or the analysis failed (warned)."""
        return self.analyse() if self.close() else None

    def close(self) -> bool:
        """Close the recording (removing every hook); whether there was one open to close."""
        if not self.active:
            return False
        self._guard("closing the recording", self.dbg.close)
        return True

    def analyse(self) -> Diagnosis | None:
        """With ``analyze_at_end``, analyse the closed recording (of a distributed run: with the checks across
        its ranks, once every rank has closed its own); None when nothing was recorded or the analysis failed
        (warned)."""
        dbg = self.dbg
        if not self.analyze_at_end or dbg is None or dbg.steps == 0 or dbg.path is None:
            return None
        found = self._guard("analysing the recording", lambda: analyze(dbg.path))
        self.diagnosis = None if found is _FAILED else found
        return self.diagnosis

    def abort(self) -> None:
        """Close the recording without analysing it (the training run raised)."""
        if self.active:
            self._guard("closing the recording", self.dbg.close)

    def _guard(self, what: str, fn: Callable[[], Any]) -> Any:
        """``fn()``, or a warning (once per ``what``) and :data:`_FAILED` when it raises: the training run
        must not stop for the recorder."""
        try:
            return fn()
        except Exception as error:  # a recorder problem must never break the framework's training loop
            if self.active:
                try:  # logged in the recording's problems log and warned about once per part
                    self.dbg.recorder._warn(f"{self.framework} callback: {what}", error)
                    return _FAILED
                except Exception:  # the problems log itself failed: warn below instead
                    self._warned.discard(what)
            if what not in self._warned:
                self._warned.add(what)
                warnings.warn(f"comgra_ndbg ({self.framework} callback): {what} failed ({type(error).__name__}: "
                              f"{error}); training continues" + ("" if self.active else " without a recording"),
                              RecorderWarning, stacklevel=3)
            return _FAILED


_FAILED = object()
"""What :meth:`FrameworkRecording._guard` returns for a call that raised."""


class RecordingAccess:
    """``diagnosis`` and ``path`` of a framework callback, read from its :class:`FrameworkRecording`
    (``self.recording``); not used on its own."""

    recording: FrameworkRecording

    @property
    def diagnosis(self) -> Any:
        """The analysis made when training ended (:class:`~comgra_ndbg.analysis.Diagnosis`), or None."""
        return self.recording.diagnosis

    @property
    def path(self) -> Path | None:
        """The trial folder recorded into (None before training starts)."""
        return self.recording.location

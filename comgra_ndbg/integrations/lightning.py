"""PyTorch Lightning: ``ComgraCallback`` records a ``Trainer.fit`` run with :class:`~comgra_ndbg.NeuralDbg`.

>>> from comgra_ndbg.integrations.lightning import ComgraCallback   # doctest: +SKIP
>>> trainer = lightning.pytorch.Trainer(callbacks=[ComgraCallback("runs/lit")], ...)   # doctest: +SKIP

One recorded step per optimizer step (gradient accumulation included: the step ends at the optimizer's
``step()``), the metrics the module logs (``self.log``) as KPIs ``lightning/<name>`` of the step they were
logged at, the metrics logged during each validation run as KPIs of step type ``validation`` at the last
training step (the sanity check is left out), the validation passes themselves as NeuralDbg's evaluation
runs of that step type (KPIs ``eval/<node>/{nonfinite,abs_mean,rms}`` and ``eval/passes``, at the same
step; ``record_eval=False`` turns them off), and at the end of training the analysis, whose top
hypothesis goes to Lightning's console log and whose counts go to the trainer's loggers as metrics
``comgra/failure_hypotheses`` and ``comgra/top_confidence`` (and the hypothesis itself as text
``comgra/diagnosis`` to a TensorBoard logger).

The class subclasses the ``Callback`` of ``lightning.pytorch`` and of ``pytorch_lightning``, whichever are
installed, so either package's ``Trainer`` accepts it. Under a multi-process strategy (``strategy="ddp"``)
every rank records its own folder of one trial (named on rank 0 and broadcast when training starts, with
whether the strategy wrapped the model in ``DistributedDataParallel``); when training ends the ranks wait for
each other's recordings to close and global rank zero analyses them, the checks across ranks included.
"""
from __future__ import annotations

import importlib
import logging
import math
import time
from pathlib import Path
from typing import Any

from torch import nn

from comgra_ndbg.errors import InvalidArgumentError, MissingDependencyError
from comgra_ndbg.integrations.core import VALIDATION, FrameworkRecording, RecordingAccess, scalar, summary_line

__all__ = ["ComgraCallback", "KPI_PREFIX"]

KPI_PREFIX = "lightning/"


def _callback_bases() -> tuple[type, ...]:
    """The ``Callback`` classes of the Lightning packages present (``lightning.pytorch`` first)."""
    bases = []
    for name in ("lightning.pytorch", "pytorch_lightning"):
        try:
            bases.append(importlib.import_module(name).Callback)
        except ImportError:
            continue
    if not bases:
        raise MissingDependencyError("PyTorch Lightning is not installed (neither 'lightning' nor "
                                     "'pytorch_lightning' can be imported); install it with `pip install "
                                     "'comgra-ndbg[lightning]'`, then import this callback again")
    return tuple(bases)


_LOG = logging.getLogger("lightning.pytorch.callbacks.comgra")


class _Hooks(RecordingAccess):
    """The hooks of :class:`ComgraCallback`; see the module docstring."""

    def __init__(self, path: str | Path | None = None, *, trial: str | None = None, module: str | None = None,
                 analyze: bool = True, **neuraldbg_options: Any) -> None:
        """``path``: the group folder (default ``<default_root_dir>/comgra``); ``trial``: the trial's name
        (default: a time stamp); ``module``: the attribute path of the submodule ``training_step`` calls
        (e.g. ``"model"``) when it does not call the LightningModule itself (``self(x)``); ``analyze``:
        analyse and log when training ends; other keyword arguments go to :class:`~comgra_ndbg.NeuralDbg`
        (``summaries=``, ``snapshots=``, ``modules=``, ...)."""
        super().__init__()
        if module is not None and (not isinstance(module, str) or not module):
            raise InvalidArgumentError(f"module= takes the attribute path of a submodule (e.g. 'model'), got "
                                       f"{module!r}")
        for taken in ("model", "optimizer", "path", "trial"):
            if taken in neuraldbg_options:
                raise InvalidArgumentError(f"ComgraCallback sets NeuralDbg's {taken}= itself from the trainer; "
                                           f"leave it out")
        self.module = module
        self.recording = FrameworkRecording("Lightning", path=path, trial=trial, kpi_prefix=KPI_PREFIX,
                                            analyze_at_end=analyze, options=neuraldbg_options)
        self._seen: dict[str, Any] = {}  # metric name -> the value object last recorded or skipped
        self._validated: dict[str, float | None] = {}  # metric name -> its value at the last validation run

    # ---- Lightning hooks ------------------------------------------------------------------------------
    def on_train_start(self, trainer: Any, pl_module: nn.Module) -> None:
        model = pl_module if self.module is None else _submodule(pl_module, self.module)
        optimizers = list(trainer.optimizers)
        default = Path(trainer.default_root_dir) / "comgra"
        self._seen = dict(trainer.callback_metrics)  # metrics from before training (the sanity check) are old
        if trainer.world_size > 1:  # every rank records its own folder of one trial, named alike on all ranks
            if self.recording.trial is None:  # before the first step: no collective inside a training step
                self.recording.trial = trainer.strategy.broadcast(time.strftime("lightning-%Y%m%d-%H%M%S"), 0)
            self.recording.options["ddp_wrapped"] = isinstance(trainer.strategy.model,
                                                               nn.parallel.DistributedDataParallel)
        self.recording.start(model, optimizers[0] if len(optimizers) == 1 else None, default_path=default)

    def on_train_batch_start(self, trainer: Any, pl_module: nn.Module, batch: Any, batch_idx: int) -> None:
        self._take_metrics(trainer, None)  # Lightning publishes a batch's step metrics after its batch-end hooks

    def on_validation_start(self, trainer: Any, pl_module: nn.Module) -> None:
        if not trainer.sanity_checking:
            self._take_metrics(trainer, None)  # what training logged so far belongs to the training steps

    def on_validation_end(self, trainer: Any, pl_module: nn.Module) -> None:
        if trainer.sanity_checking:
            self._seen = dict(trainer.callback_metrics)
            return
        self._take_metrics(trainer, VALIDATION)

    def on_train_end(self, trainer: Any, pl_module: nn.Module) -> None:
        self._take_metrics(trainer, None)
        self.recording.close()
        if trainer.world_size > 1:  # every rank's recording is closed before global rank zero reads them all
            trainer.strategy.barrier("comgra_ndbg recordings closed")
        if not trainer.is_global_zero:
            return
        diagnosis = self.recording.analyse()
        if diagnosis is None:
            return
        line = summary_line(diagnosis)
        (_LOG.info if diagnosis.healthy else _LOG.warning)(line)
        metrics = {"comgra/failure_hypotheses": float(len(diagnosis.hypotheses)),
                   "comgra/top_confidence": float(diagnosis.top.confidence) if diagnosis.top else 0.0}
        for logger in trainer.loggers:
            self.recording._guard("logging the diagnosis",
                                  lambda: _log_diagnosis(logger, metrics, line, trainer.global_step))

    def on_exception(self, trainer: Any, pl_module: nn.Module, exception: BaseException) -> None:
        self.recording.abort()

    def _take_metrics(self, trainer: Any, step_type: str | None) -> None:
        """Record the metrics Lightning published since the last look (new value objects), as KPIs of the
        last step (of ``step_type``)."""
        recording = self.recording
        if not recording.active:
            return
        if step_type is None and recording.exact_steps and recording.dbg.recorder.current_step is not None:
            return  # inside an accumulating step: its metrics are taken once it ends, the latest values
        current = dict(trainer.callback_metrics)
        fresh = {name: value for name, value in current.items() if self._seen.get(name) is not value}
        self._seen = current
        if step_type == VALIDATION:
            self._validated.update((name, scalar(value)) for name, value in fresh.items())
        else:  # Lightning publishes the validation metrics again after the run: they are no training metrics
            fresh = {name: value for name, value in fresh.items()
                     if name not in self._validated or not _same(scalar(value), self._validated[name])}
        if fresh:
            recording.record_metrics(fresh, step_type=step_type)


def _same(a: float | None, b: float | None) -> bool:
    """Whether two metric values are the same number (NaN equals NaN here)."""
    return a == b or (a is not None and b is not None and math.isnan(a) and math.isnan(b))


def _log_diagnosis(logger: Any, metrics: dict[str, float], line: str, step: int) -> None:
    """The diagnosis' counts as metrics to a trainer's logger, and its line as text where the logger's
    experiment takes text (``add_text`` of TensorBoard's ``SummaryWriter``: tag ``comgra/diagnosis``), so the
    top hypothesis sits in the dashboard beside the run's curves."""
    logger.log_metrics(metrics, step)
    add_text = getattr(getattr(logger, "experiment", None), "add_text", None)
    if callable(add_text):
        add_text("comgra/diagnosis", line, step)
    logger.save()


def _submodule(pl_module: nn.Module, path: str) -> nn.Module:
    """``pl_module``'s submodule at ``path``, or an error naming the submodules there are."""
    try:
        return pl_module.get_submodule(path)
    except AttributeError:
        children = [name for name, _ in pl_module.named_children()]
        raise InvalidArgumentError(f"ComgraCallback(module={path!r}): {type(pl_module).__name__} has no submodule "
                                   f"{path!r}; its submodules are {children} (a dotted path reaches deeper ones)") \
            from None


ComgraCallback = type("ComgraCallback", (_Hooks, *_callback_bases()), {
    "__doc__": "Records a Lightning ``Trainer.fit`` run with NeuralDbg and analyses it when training ends "
               "(see :mod:`comgra_ndbg.integrations.lightning`).",
    "__module__": __name__,
})

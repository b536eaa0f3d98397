"""Hugging Face ``transformers``: ``ComgraCallback`` records a ``Trainer.train()`` run with
:class:`~comgra_ndbg.NeuralDbg`.

>>> from comgra_ndbg.integrations.transformers import ComgraCallback   # doctest: +SKIP
>>> Trainer(model, args, train_dataset=..., callbacks=[ComgraCallback("runs/hf")]).train()   # doctest: +SKIP

One recorded step per optimizer step (with ``gradient_accumulation_steps`` the step ends at the optimizer's
``step()``, inside ``accelerate``'s wrapper), the Trainer's logs (``loss``, ``grad_norm``,
``learning_rate``, ...) as KPIs ``trainer/<name>`` of the step they were logged at, the metrics of each
evaluation (``eval_loss``, ...) as KPIs of step type ``validation`` at the last training step, the
evaluation's forward passes as NeuralDbg's evaluation runs of that step type (KPIs
``eval/<node>/{nonfinite,abs_mean,rms}`` and ``eval/passes``, at the same step; ``record_eval=False`` turns
them off), and when
training ends the analysis, whose top hypothesis goes to the ``transformers`` logger (a warning when a
failure was found) and into ``TrainerState.log_history`` as ``comgra/*`` entries. Under several processes
(``torchrun``, ``accelerate launch``) every rank records its own folder of one trial (named alike on every
rank from the launcher's run id, with whether the Trainer wraps the model in ``DistributedDataParallel``);
when training ends the ranks wait for each other's recordings to close and the world-process zero analyses
them, the checks across ranks included.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from comgra_ndbg.errors import InvalidArgumentError
from comgra_ndbg.integrations.core import VALIDATION, FrameworkRecording, RecordingAccess, require, summary_line

_transformers = require("transformers", extra="transformers", framework="Hugging Face transformers")

__all__ = ["ComgraCallback", "KPI_PREFIX", "wraps_in_ddp"]

KPI_PREFIX = "trainer/"
_EVAL_PREFIX = "eval_"

_LOG = _transformers.utils.logging.get_logger("transformers.integrations.comgra")


def wraps_in_ddp(args: Any) -> bool:
    """Whether the Trainer with ``args`` wraps the model in ``DistributedDataParallel``: a distributed run
    without FSDP or DeepSpeed, which shard the parameters (their ranks hold different shards, which the
    checks across ranks must not take for a desync).

    >>> from types import SimpleNamespace as Args
    >>> distributed = Args(value="distributed")
    >>> wraps_in_ddp(Args(parallel_mode=distributed, fsdp=None, deepspeed=None))
    True
    >>> wraps_in_ddp(Args(parallel_mode=distributed, fsdp=["full_shard"], deepspeed=None))
    False
    """
    mode = str(getattr(getattr(args, "parallel_mode", None), "value", ""))
    return mode == "distributed" and not getattr(args, "fsdp", None) and not getattr(args, "deepspeed", None)


class ComgraCallback(RecordingAccess, _transformers.TrainerCallback):
    """Records a ``Trainer`` run with NeuralDbg and analyses it when training ends (see the module
    docstring).

    ``path``: the group folder (default ``<output_dir>/comgra``); ``trial``: the trial's name (default: a
    time stamp); ``analyze``: analyse and log when training ends; other keyword arguments go to
    :class:`~comgra_ndbg.NeuralDbg` (``summaries=``, ``snapshots=``, ``modules=``, ...).
    """

    def __init__(self, path: str | Path | None = None, *, trial: str | None = None, analyze: bool = True,
                 **neuraldbg_options: Any) -> None:
        for taken in ("model", "optimizer", "path", "trial"):
            if taken in neuraldbg_options:
                raise InvalidArgumentError(f"ComgraCallback sets NeuralDbg's {taken}= itself from the Trainer; "
                                           f"leave it out")
        self._logged_at: dict[str, int] = {}  # log name -> the global step it was last recorded at
        self.recording = FrameworkRecording("transformers", path=path, trial=trial, kpi_prefix=KPI_PREFIX,
                                            analyze_at_end=analyze, options=neuraldbg_options)

    # ---- Trainer events -----------------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, model: nn.Module | None = None,
                       optimizer: Any = None, **kwargs: Any) -> None:
        if model is None:
            return
        if args.world_size > 1:  # every rank records its own folder; the Trainer wraps the model in DDP itself
            self.recording.options["ddp_wrapped"] = wraps_in_ddp(args)
        self.recording.start(model, optimizer, default_path=Path(args.output_dir) / "comgra")

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        if not logs or any(name.startswith(_EVAL_PREFIX) for name in logs):
            return  # an evaluation's logs: recorded by on_evaluate, as validation KPIs
        fresh = {name: value for name, value in logs.items() if self._logged_at.get(name) != state.global_step}
        self._logged_at.update(dict.fromkeys(fresh, state.global_step))  # one value per step (the first)
        self.recording.record_metrics(fresh)

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: dict | None = None, **kwargs: Any) -> None:
        if metrics:  # "epoch" is the training's, added to every log: recorded with the training logs
            self.recording.record_metrics({k: v for k, v in metrics.items() if k != "epoch"}, step_type=VALIDATION)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.recording.close()
        if args.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.barrier()  # every rank's recording is closed before process zero reads them all
        if not state.is_world_process_zero:
            return
        diagnosis = self.recording.analyse()
        if diagnosis is None:
            return
        line = summary_line(diagnosis)
        (_LOG.info if diagnosis.healthy else _LOG.warning)(line)
        top = diagnosis.top
        state.log_history.append({"comgra/failure_hypotheses": len(diagnosis.hypotheses),
                                  "comgra/top_hypothesis": top.sentence if top else "",
                                  "comgra/top_confidence": top.confidence if top else 0.0,
                                  "step": state.global_step})

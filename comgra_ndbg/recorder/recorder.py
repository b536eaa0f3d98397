"""The Recorder: explicit registration of tensors inside a training loop, written to an HDF5 recording.

This is the only code that runs inside the user's loop. It validates calls at the boundary, asks its
policies whether the step is recorded (a skipped step costs a few attribute checks), summarises tensors
(``reduce.Reducer``: compiled kernels on the host, fused reductions on other devices) and their gradients
(``gradients``: kept by autograd hooks, summarised when the backward pass ends), and hands plain numpy rows
to the store writer. Problems of its own (a full disk, a tensor it cannot summarise) never stop the training
run: each is logged in the recording and warned about per subject (``problems``); wrong calls raise typed
errors that say what to do (``validation``).

A step's type may be left open (``start_step(i, step_type=None)``) and decided at its end with
``decide_step(type, sample_categories=...)``; and a ``FlightRecorder`` keeps the last steps in RAM and
writes them only when a trigger fires. See ``policy`` and ``flight``.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from comgra_ndbg.errors import InvalidArgumentError, RecorderStateError, RecorderWarning
from comgra_ndbg.recorder.budget import DEFAULT_BYTE_BUDGET, ByteBudget, SnapshotBudget, as_byte_budget
from comgra_ndbg.recorder.dispatch import StepDispatcher
from comgra_ndbg.recorder.distributed import detect_rank, shared_trial_name
from comgra_ndbg.recorder.faults import FaultIsolation
from comgra_ndbg.recorder.flight import FlightRecorder
from comgra_ndbg.recorder.gradient_batch import GradientBatch
from comgra_ndbg.recorder.gradients import GradientRecording
from comgra_ndbg.recorder.kpis import KpiRecording
from comgra_ndbg.recorder.parameter_steps import ParameterSteps
from comgra_ndbg.recorder.parameters import ParameterTracker
from comgra_ndbg.recorder.plan import RegistrationPlan
from comgra_ndbg.recorder.policy import Decision, Policy, PolicySpec, as_policy
from comgra_ndbg.recorder.problems import ProblemLog
from comgra_ndbg.recorder.profiling import ProfileRecording
from comgra_ndbg.recorder.registration import AUTO, TensorRegistration
from comgra_ndbg.recorder.retroactive import RetroactiveDecision
from comgra_ndbg.recorder.snapshot import DeferredSnapshot
from comgra_ndbg.recorder.step_record import StepRecord, SummaryRows
from comgra_ndbg.recorder.structure import StructureTracker
from comgra_ndbg.recorder.tiers import Tiers, TierState, as_tiers
from comgra_ndbg.recorder.validation import (check_group_path, check_hyperparameters, check_name,
                                             check_parameter_groups, check_settings, check_step)
from comgra_ndbg.stats.bounds import DEFAULT_SATURATION_MARGIN
from comgra_ndbg.stats.reducer import Reducer
from comgra_ndbg.store import schema
from comgra_ndbg.store.ranks import CONFIG_DDP_WRAPPED, rank_directory
from comgra_ndbg.store.writer import RecordingWriter, check_trial_name

__all__ = ["Recorder", "RecorderWarning", "AUTO"]  # RecorderWarning lives in errors.py: the store reports too

_LOG = logging.getLogger("comgra_ndbg")

_SKIP = Decision(False, "", "never")


class Recorder(TensorRegistration, GradientRecording, RetroactiveDecision, ParameterSteps, KpiRecording,
               FaultIsolation, ProfileRecording):
    """Records registered tensors, their gradients, tracked parameters and their updates, per step.

    ``path`` is a group folder; the trial's recording goes to ``path/trial``. ``summaries`` and
    ``snapshots`` are policies or their shorthands: an int k (every k steps), a list of steps, True/False,
    or a ``Policy``. ``enabled=False`` turns every method into an immediate return. ``flight_recorder``
    keeps the last steps in RAM and writes them when a trigger fires. ``hyperparameters`` (a dict of
    numbers, strings, booleans) are stored with the recording (``Recording.hyperparameters``), so a sweep
    (:func:`comgra_ndbg.sweep.analyze_many`) can set them beside each run's diagnosis. ``parameter_groups``
    are prefixes of parameter names: the explorer draws the parameter nodes each is the first to match in
    one box (Comgra's ``prefixes_for_grouping_module_parameters_visually``). ``profile=True`` (or a
    ``ProfileConfig``) records each step's wall time and process memory, and per-layer time, memory and FLOPs
    of the modules given to :meth:`profile_module` at its own policy (``docs/profiling.md``).

    ``byte_budget`` bounds what snapshots write (``recorder/budget.py``, ``docs/recording.md``): a
    ``ByteBudget``, an int (bytes per run), or None for no bound. The default, 256 MiB per run and 1 MiB per
    snapshot step, changes nothing for small models; on large ones snapshots are sub-sampled and thinned out,
    summaries are always kept, and what was dropped is in the recording's log (category ``budget``).

    ``detail`` says how completely tracked parameters are summarised (``recorder/tiers.py``): ``"full"``
    (the default) summarises every value, gradient and update at every recorded step; ``"tiered"`` (or a
    ``Tiers``) takes sentinel rows of values and updates (norm, extremes,
    non-finite counts) between complete ones every ``full_every``-th step and at once, for every parameter,
    when a sentinel moves.

    ``mode="w-"`` (default) refuses an existing trial; ``mode="w"`` with ``overwrite=True`` replaces it;
    ``mode="a"`` continues it (killed or finished) after its last recorded step: steps up to that one are
    not recorded again (``resume_after``), so a run restarted from a checkpoint just calls its loop.

    Under ``torch.distributed`` (more than one process, ``recorder/distributed.py``) each rank records
    ``path/trial/rank<r>/`` with its rank and world size in the config, without any collective call;
    ``per_rank=False`` records to ``path/trial`` as a single process would (then give each rank its own
    trial). ``ddp_wrapped`` says whether this rank's model is wrapped in ``DistributedDataParallel``
    (``NeuralDbg`` fills it in) for the cross-rank checks of the analysis.

    >>> import tempfile, torch
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     with Recorder(folder, trial="demo") as rec:
    ...         for step in range(3):
    ...             with rec.step(step):
    ...                 _ = rec.register_tensor("x", torch.full((4, 2), float(step)), role="input")
    ...     from comgra_ndbg import open_recording
    ...     open_recording(folder).summary("x", "value", "mean")[1].tolist()
    [0.0, 1.0, 2.0]
    """

    def __init__(
        self,
        path: str | Path,
        trial: str | None = None,
        *,
        enabled: bool = True,
        mode: str = "w-",
        overwrite: bool = False,
        summaries: PolicySpec = 1,
        snapshots: PolicySpec = 10,
        num_samples: int = 8,
        max_elements: int = 4096,
        record_updates: bool = True,
        saturation_margin: float = DEFAULT_SATURATION_MARGIN,
        flush_every_seconds: float = 5.0,
        flush_every_steps: int | None = None,
        flight_recorder: FlightRecorder | None = None,
        per_rank: bool = True,
        ddp_wrapped: bool | None = None,
        hyperparameters: dict[str, Any] | None = None,
        parameter_groups: Sequence[str] = (),
        profile: Any = None,
        byte_budget: ByteBudget | int | None = DEFAULT_BYTE_BUDGET,
        detail: str | Tiers = "full",
    ) -> None:
        self.enabled = bool(enabled)
        self._closed = False
        if not self.enabled:
            return
        path = check_group_path(path)
        flush_every_seconds = check_settings(num_samples=num_samples, max_elements=max_elements,
                                             saturation_margin=saturation_margin, record_updates=record_updates,
                                             flush_every_seconds=flush_every_seconds,
                                             flush_every_steps=flush_every_steps)
        if flight_recorder is not None and not isinstance(flight_recorder, FlightRecorder):
            raise InvalidArgumentError(f"flight_recorder must be a FlightRecorder, got "
                                       f"{type(flight_recorder).__name__}")
        budget = as_byte_budget(byte_budget)
        tiers = as_tiers(detail)
        if trial is not None and trial != "":
            check_trial_name(trial)
        if not isinstance(per_rank, bool) or not isinstance(ddp_wrapped, (bool, type(None))):
            raise InvalidArgumentError(f"per_rank must be True or False and ddp_wrapped True, False or None, got "
                                       f"{per_rank!r} and {ddp_wrapped!r}")
        self.rank_info = detect_rank() if per_rank else None
        if not trial and self.rank_info is not None:  # every rank must pick the same name, without talking
            trial = shared_trial_name(self.rank_info)
        self.trial = trial or time.strftime("trial-%Y%m%d-%H%M%S-") + f"{time.time_ns() // 1000 % 1000000:06d}"
        self.path = Path(path) / self.trial
        if self.rank_info is not None:
            self.path = rank_directory(self.path, self.rank_info.rank, world_size=self.rank_info.world_size)
        self.summary_policy: Policy = as_policy(summaries, name="summaries")
        self.snapshot_policy: Policy = as_policy(snapshots, name="snapshots")
        self.num_samples = num_samples
        self.max_elements = max_elements
        self.record_updates = record_updates
        self.flush_every_seconds = flush_every_seconds
        self.flush_every_steps = flush_every_steps
        self.flight_recorder = flight_recorder
        config = dict(summaries=repr(self.summary_policy), snapshots=repr(self.snapshot_policy),
                      num_samples=num_samples, max_elements=max_elements, record_updates=record_updates,
                      saturation_margin=saturation_margin, flight_recorder=repr(flight_recorder),
                      byte_budget=repr(budget), detail=repr(tiers or "full"),
                      hyperparameters=check_hyperparameters(hyperparameters),
                      parameter_groups=check_parameter_groups(parameter_groups))
        if self.rank_info is not None:
            config.update(self.rank_info.as_config())
        if ddp_wrapped is not None:
            config[CONFIG_DDP_WRAPPED] = ddp_wrapped
        self._problems = ProblemLog(self._add_log)
        self._init_profile(profile)
        self._writer = RecordingWriter(self.path, self.trial, mode=mode, overwrite=overwrite, config=config,
                                       report=self._problems.warn)
        existing = self._writer.existing
        self.catalog = existing.catalog
        self.resume_after: int | None = existing.last_step  # steps up to this one are already recorded
        if existing.live:
            self._writer.add_log(-1 if existing.last_step is None else existing.last_step, schema.LOG_RESUMED, "",
                                 f"continued by a new writer after step {existing.last_step} "
                                 f"({'killed' if existing.killed else 'closed'} before)", {"mode": mode})
        self._saturation_margin = saturation_margin
        self._values = Reducer(saturation_margin)
        self._grads = Reducer(saturation_margin)
        self._updates = Reducer(saturation_margin)
        self._parameters = ParameterTracker(self.catalog)
        self._structure = StructureTracker(self.catalog)
        self._seen_steps: set[int] = set()
        self._replayed = False  # the open step was recorded before the trial was continued (mode="a")
        self._last_step: int | None = None
        self._last_step_type = "default"
        self._last_flush = time.monotonic()
        self._steps_since_flush = 0
        self._noted: set[str] = set()
        self._token = 0
        self._hooks: list[Any] = []
        self._budget = None if budget is None else SnapshotBudget(budget)
        self._dispatcher = StepDispatcher(self._writer, self.catalog, flight_recorder, self._trigger_failed,
                                          self._budget)
        if budget is not None:  # to the library's logger: a training script's own output stays its own
            _LOG.info("%s: %s", self.trial, budget.describe())
        self._grad_batch = GradientBatch(self._flush_gradients)
        self._tier_state = None if tiers is None else TierState(tiers)
        if tiers is not None:
            _LOG.info("%s: %s", self.trial, tiers.describe())
        self._series_of_parameters: dict[tuple[str, int], np.ndarray] = {}
        self._known_tensors: dict[str, tuple[str, str, int, int]] = {}  # name -> (role, node, tensor, value series)
        self._gradient_layouts: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}  # (kind, keys) -> (series, iterations)
        self._plans: dict[str, RegistrationPlan] = {}  # name -> how its last registration was recorded (``plan``)
        self._reset_step_state()

    # ---- lifecycle -------------------------------------------------------------------------------------
    def _reset_step_state(self) -> None:
        self._grad_batch.clear()
        for handle in self._hooks:  # a leaf, or a graph node kept across steps, would otherwise keep it for good
            handle.remove()
        self._hooks = []
        if len(self._values) or len(self._grads) or len(self._updates):  # left by a step that failed midway
            self._values = Reducer(self._saturation_margin)
            self._grads = Reducer(self._saturation_margin)
            self._updates = Reducer(self._saturation_margin)
        self._structure.clear()
        self._step_open = False
        self._step = -1
        self._step_type: str | None = None
        self._iteration = 0
        self._iterations_started = 0
        self._iteration_open = False
        self._names: set[str] = set()
        self._step_names: set[str] = set()  # every name registered in the step (add_dependency checks them)
        self._batch_size: int | None = None
        self._summary_decision = _SKIP
        self._snapshot_decision = _SKIP
        self._forced = False
        self._tiered = False  # parameter values and updates follow the tiers this step (``tiers``)
        self._complete = False  # ... and are summarised completely
        self._start_values: Reducer | None = None  # the complete values of a tiered step, queued at its start
        self._start_rows: list[int] = []  # ... at these rows
        self._start_sentinels: np.ndarray | None = None  # the sentinel rows of a tiered step's start values
        self._tier_reason = ""  # why a tiered step's sentinels called for complete statistics
        self._summarize = False  # compute summaries this step (policy, forced, or flight recorder)
        self._snapshot = False  # compute snapshots this step
        self._deferring = False  # snapshots wait for decide_step's sample choice
        self._sample_positions: np.ndarray | None = None
        self._sample_categories: np.ndarray | None = None
        self._value_keys: list[tuple[int, int, int]] = []  # (series, iteration, row in the reducer)
        self._value_blocks: list[tuple[np.ndarray, list[int]]] = []  # (series, rows in the reducer), iteration 0
        self._grad_keys: dict[tuple[int, int], int] = {}  # (tensor, iteration) -> row in the reducer
        self._grad_snaps: dict[tuple[int, int], Any] = {}  # (tensor, iteration) -> snapshot
        self._set_grads: dict[tuple[int, int], tuple[torch.Tensor | None, int]] = {}  # (gradient, version) so far
        self._set_grad_bytes = 0
        self._parameter_grads: dict[int, int] = {}  # tensor id -> row in the reducer (gradients_in_hook)
        self._parameter_grad_snaps: dict[int, Any] = {}
        self._deferred_values: list[DeferredSnapshot] = []
        self._deferred_grads: list[DeferredSnapshot] = []
        self._rows: list[SummaryRows] = []
        self._snaps: list[tuple[int, int, Any]] = []
        self._kpis: list[tuple[Any, ...]] = []  # (kpi id, value) or (kpi id, value, step type id)
        self._grad_kinds: list[str] = []

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.close()

    def close(self) -> None:
        """Finish an open step, write everything buffered, consolidate the trial into one file, and remove
        every hook the recorder added. Idempotent. The file is ``<path>/<trial>/recording.h5``."""
        if not self.enabled or self._closed:
            return
        if self._step_open:
            if self._step_type is None:
                self._guard("deciding the open step", partial(self.decide_step, self._last_step_type))
            self.finish_step()
        self._profile_close()
        if self._budget is not None and self._budget.skipped + self._budget.dropped + self._budget.shrunk:
            self._writer.add_log(-1 if self._last_step is None else self._last_step, schema.LOG_BUDGET, "snapshots",
                                 self._budget.report(), self._budget.detail())
        self._closed = True
        self._guard("closing the recording", lambda: self._writer.close(self.catalog))
        self._parameters.close()
        self._problems.warn_recurring()

    def flush(self) -> None:
        """Write everything buffered as a new segment now: when it returns, those steps are on disk and
        readable by other processes."""
        if not self.enabled or self._closed:
            return
        self._flush(wait=True)

    def _flush(self, *, wait: bool) -> None:
        self._guard("flushing", lambda: self._writer.flush(self.catalog, wait=wait))
        self._last_flush = time.monotonic()
        self._steps_since_flush = 0

    # ---- steps -----------------------------------------------------------------------------------------
    @contextmanager
    def step(self, step: int, step_type: str | None = "default") -> Iterator[Recorder]:
        """``with rec.step(i):`` — start_step on entry, finish_step on exit (also after an exception, so
        what was recorded before the failure, e.g. the first NaN, is kept)."""
        self.start_step(step, step_type)
        try:
            yield self
        finally:
            if self.enabled and self._step_open:
                if self._step_type is None:
                    self.decide_step(self._last_step_type)
                self.finish_step()

    def start_step(self, step: int, step_type: str | None = "default") -> None:
        """Begin training step ``step`` (an int, unique within the trial) of type ``step_type``.

        ``step_type=None`` leaves the type open: the step is recorded tentatively if any type could be
        recorded now, and ``decide_step(type)`` settles it before ``finish_step()``.
        """
        if not self.enabled:
            return
        self._check_open_recorder("start_step")
        if self._step_open:
            raise RecorderStateError(f"start_step({step}) while step {self._step} is still open; call finish_step() "
                                     f"at the end of each step")
        step = check_step(step)
        if step in self._seen_steps:
            raise RecorderStateError(f"step {step} was already started once in this trial; step numbers must be "
                                     f"unique (use a global step counter, not the batch index of an epoch)")
        if step_type is not None and (not isinstance(step_type, str) or not step_type):
            raise InvalidArgumentError(f"step_type must be a non-empty str (or None to decide it at the end of the "
                                       f"step), got {step_type!r}")
        if step_type is not None:
            check_name(step_type, "step types")
        self._seen_steps.add(step)
        self._replayed = self.resume_after is not None and step <= self.resume_after
        self._step_open = True
        self._before_step = (self._last_step, self._last_step_type)  # what discard_step() puts back
        self._step = self._last_step = step
        self._step_type = step_type
        if step_type is not None:
            self._last_step_type = step_type
        self._token += 1
        self._summary_decision = self.summary_policy.decide(step, step_type)
        self._snapshot_decision = self.snapshot_policy.decide(step, step_type)
        if self._snapshot_decision.record and self._budget is not None and not self._budget.admit():
            self._snapshot_decision = _SKIP  # the budget's back-off: this snapshot is not taken
        self._forced = self._dispatcher.is_forced(step)
        if self._replayed:
            self._note_once("replayed", f"trial {self.trial!r} was continued after step {self.resume_after}: steps "
                                        f"up to it are already in the recording and are not recorded again (from "
                                        f"step {step} on)")
            self._summary_decision = self._snapshot_decision = _SKIP
            self._forced = self._summarize = self._snapshot = self._deferring = False
            self._parameters.unwatch()
            return
        self._profile_start(step, step_type)
        flight = self.flight_recorder is not None
        self._summarize = self._summary_decision.record or self._forced or flight
        self._snapshot = self._snapshot_decision.record or self._forced or flight
        self._deferring = self._snapshot and step_type is None
        if self._summarize or self._snapshot:
            self._guard("recording parameters", self._start_parameters)
        else:
            self._parameters.unwatch()  # a skipped step's backward pass pays nothing for them

    def start_iteration(self) -> int:
        """Begin the next iteration (forward pass) of a multi-iteration step; returns its index.

        Tensors registered before the first call belong to iteration 0, those after ``finish_iteration`` to
        the last iteration.
        """
        if not self.enabled:
            return 0
        self._check_step_open("start_iteration")
        if self._iteration_open:
            raise RecorderStateError(f"start_iteration() while iteration {self._iteration} of step {self._step} is "
                                     f"open; call finish_iteration() first")
        if self._iterations_started:
            self._iteration += 1
            self._names = set()
        self._iterations_started += 1
        self._iteration_open = True
        return self._iteration

    def finish_iteration(self) -> None:
        """End the current iteration."""
        if not self.enabled:
            return
        self._check_step_open("finish_iteration")
        if not self._iteration_open:
            raise RecorderStateError(f"finish_iteration() without start_iteration() in step {self._step}; call "
                                     f"start_iteration() at the beginning of each forward pass")
        self._iteration_open = False

    @property
    def current_step(self) -> int | None:
        """The open step, or None between steps."""
        return self._step if self.enabled and self._step_open else None

    @property
    def is_recording(self) -> bool:
        """Whether the open step computes summaries or snapshots (False on skipped steps)."""
        return self.enabled and self._step_open and (self._summarize or self._snapshot)

    @property
    def byte_budget(self) -> ByteBudget | None:
        """The bound on snapshot bytes this recording keeps (``byte_budget=``), or None when unbounded."""
        budget = getattr(self, "_budget", None)
        return None if budget is None else budget.budget

    @property
    def halt_request(self) -> tuple[int, str] | None:
        """``(step, reason)`` of the first flight-recorder trigger with ``halt=True`` that fired (its steps
        are on disk by then), or None: the training loop should stop."""
        return self._dispatcher.halt if self.enabled else None

    @property
    def last_record(self) -> tuple[StepRecord, dict[str, float]] | None:
        """The last finished step's statistics (its ``StepRecord``, written or only kept by the flight
        recorder) and KPIs, or None; a step the policies skipped leaves the one before."""
        return self._dispatcher.last if self.enabled else None

    @property
    def last_kpis(self) -> tuple[int, dict[str, float]] | None:
        """The last finished step and its own KPIs, also when the policies summarised nothing of it, or None."""
        return getattr(self, "_last_kpis", None) if self.enabled else None

    # ---- finishing a step --------------------------------------------------------------------------------
    def finish_step(self) -> None:
        """End the step: derive parameter updates, collect every statistic in one host copy, and write."""
        if not self.enabled:
            return
        self._check_open_recorder("finish_step")
        if not self._step_open:
            raise RecorderStateError("finish_step() without start_step(); call start_step(step) at the beginning of "
                                     "each training step")
        if self._step_type is None:
            raise RecorderStateError(f"step {self._step} was started without a step type; call "
                                     f"decide_step(step_type) before finish_step()")
        if self._replayed:
            self._token += 1
            self._reset_step_state()
            return
        type_id = self.catalog.step_type_id(self._step_type)
        record = None
        urgent = False
        if self._summarize or self._snapshot:
            record = self._guard("finishing the step", partial(self._build_record, type_id))
        kpis = self._guard("recording KPIs", partial(self._write_kpis, type_id)) or {}
        self._last_kpis = (self._step, kpis)
        write_summary = self._summary_decision.record or self._forced
        write_snapshot = self._snapshot_decision.record or self._forced
        if record is not None:
            written = self._guard("writing the step", partial(self._dispatcher.dispatch, record, kpis, write_summary,
                                                              write_snapshot))
            self._steps_since_flush += 1 if written else 0
            if self._dispatcher.flush_now:  # a trigger fired: its steps go to disk before the next step
                self._dispatcher.flush_now = False
                urgent = True
        elif not (write_summary or write_snapshot):
            self._parameters.forget_gradients()
        self.summary_policy.commit(self._step, self._step_type, write_summary and record is not None)
        self.snapshot_policy.commit(self._step, self._step_type, write_snapshot and record is not None)
        self._profile_finish()
        self._token += 1
        self._reset_step_state()
        if urgent:
            self._flush(wait=True)
        elif self._flush_due():  # periodic: written on a worker thread while training goes on
            self._flush(wait=False)
        else:
            self._writer.poll()  # a background write that failed is reported now

    def discard_step(self) -> None:
        """Drop the open step without writing any of it (values, gradients, updates, KPIs); its step number
        may be started again. For a step that turned out not to be one: ``NeuralDbg`` discards the passes of
        a model run inside another model's update (a GAN's discriminator during the generator's step)."""
        if not self.enabled:
            return
        self._check_step_open("discard_step()")
        self._structure.rollback()
        self._seen_steps.discard(self._step)
        self._last_step, self._last_step_type = self._before_step
        self._parameters.release()
        self._parameters.forget_gradients()
        self._profile_discard()
        self._token += 1
        self._reset_step_state()

    def _build_record(self, type_id: int) -> StepRecord:
        if len(self._grad_batch):
            self._flush_gradients()
        pending = (self._grad_keys or self._grad_snaps or self._deferred_grads or self._parameter_grads
                   or self._parameter_grad_snaps)
        if pending or (not self._grad_kinds and self._parameters.has_fresh_gradients()):
            kind = schema.KIND_GRAD if not self._grad_kinds else self._grad_kinds[-1]
            self._collect_gradients(kind)
        self._guard("discovering the dependency graph", self._discover_graph)
        self._finish_parameters()
        self._collect_values()
        reasons = [d.reason for d in (self._summary_decision, self._snapshot_decision) if d.record]
        if self._tier_reason:
            reasons.append(self._tier_reason)
        if self._forced:
            reasons.insert(0, self._dispatcher.forced_reason(self._step))
        rows = SummaryRows.join(self._rows)
        self._check_overflow(rows)
        return StepRecord(self._step, type_id, self._iteration + 1, "; ".join(dict.fromkeys(reasons)), time.time(),
                          rows, self._snaps)

    def _flush_due(self) -> bool:
        if self.flush_every_steps is not None and self._steps_since_flush >= self.flush_every_steps:
            return True
        return time.monotonic() - self._last_flush >= self.flush_every_seconds

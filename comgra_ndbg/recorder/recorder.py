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
import weakref
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from comgra_ndbg.errors import InvalidArgumentError, RecorderWarning
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
from comgra_ndbg.recorder.policy import Policy, PolicySpec, as_policy
from comgra_ndbg.recorder.problems import ProblemLog
from comgra_ndbg.recorder.sentinel_steps import SentinelSteps
from comgra_ndbg.recorder.profiling import ProfileRecording
from comgra_ndbg.recorder.registration import AUTO, TensorRegistration
from comgra_ndbg.recorder.retroactive import RetroactiveDecision
from comgra_ndbg.recorder.step_record import StepRecord
from comgra_ndbg.recorder.structure import StructureTracker
from comgra_ndbg.recorder.taps import GradientTaps
from comgra_ndbg.recorder.tiers import Tiers, TierState, as_tiers
from comgra_ndbg.recorder.step_cycle import StepCycle
from comgra_ndbg.recorder.validation import (check_group_path, check_hyperparameters, check_parameter_groups,
                                             check_settings)
from comgra_ndbg.stats import backend, kernels
from comgra_ndbg.stats.bounds import DEFAULT_SATURATION_MARGIN
from comgra_ndbg.stats.reducer import Reducer
from comgra_ndbg.store import schema
from comgra_ndbg.store.ranks import CONFIG_DDP_WRAPPED, rank_directory
from comgra_ndbg.store.writer import DEFAULT_MAX_FILE_BYTES, RecordingWriter, check_max_file_bytes, check_trial_name

__all__ = ["Recorder", "RecorderWarning", "AUTO"]  # RecorderWarning lives in errors.py: the store reports too

_LOG = logging.getLogger("comgra_ndbg")


class Recorder(StepCycle, TensorRegistration, GradientRecording, GradientTaps, RetroactiveDecision, ParameterSteps,
               SentinelSteps, KpiRecording, FaultIsolation, ProfileRecording):
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

    ``max_file_bytes`` caps the array bytes of one merged file (default 256 MiB; None for no cap): merging
    segment files holds their smaller tables in memory, so a recording larger than the cap ends as several
    files of about that size, read exactly like one (``docs/format.md``, "Size cap").

    ``detail`` says at which recorded steps tracked parameters' updates are measured (``recorder/tiers.py``):
    ``"full"`` (the default) at every one; ``"tiered"`` (or a ``Tiers``) at the first steps, every
    ``full_every``-th step, snapshot steps and where a parameter, its ``requires_grad`` or an optimizer's
    setting changed (a global optimizer pre-hook watches the settings while the recorder is open). Values
    and gradients are summarised at every recorded step either way.

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
        max_file_bytes: int | None = DEFAULT_MAX_FILE_BYTES,
    ) -> None:
        self.enabled = bool(enabled)
        self._closed = False
        self.current_step: int | None = None
        """The open step, or None between steps (an attribute, not a property: hooks read it several times a
        step)."""
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
        check_max_file_bytes(max_file_bytes)
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
                      byte_budget=repr(budget), detail=repr(tiers or "full"), max_file_bytes=max_file_bytes,
                      hyperparameters=check_hyperparameters(hyperparameters),
                      parameter_groups=check_parameter_groups(parameter_groups))
        if self.rank_info is not None:
            config.update(self.rank_info.as_config())
        if ddp_wrapped is not None:
            config[CONFIG_DDP_WRAPPED] = ddp_wrapped
        self._problems = ProblemLog(self._add_log)
        self._init_profile(profile)
        self._writer = RecordingWriter(self.path, self.trial, mode=mode, overwrite=overwrite, config=config,
                                       report=self._problems.warn, max_file_bytes=max_file_bytes)
        existing = self._writer.existing
        self.catalog = existing.catalog
        self.resume_after: int | None = existing.last_step  # steps up to this one are already recorded
        if existing.live:
            self._writer.add_log(-1 if existing.last_step is None else existing.last_step, schema.LOG_RESUMED, "",
                                 f"continued by a new writer after step {existing.last_step} "
                                 f"({'killed' if existing.killed else 'closed'} before)", {"mode": mode})
        self._saturation_margin = saturation_margin
        self._reducer = Reducer(saturation_margin)  # a step's values, gradients and updates (``step_rows``)
        self._parameters = ParameterTracker(self.catalog)
        self.gradient_scale: torch.Tensor | None = None
        """The scale the running backward pass's gradients carry (a ``GradScaler``'s, set by ``NeuralDbg``):
        the registered tensors' gradients are divided by it, into the units of the parameters' gradients."""
        self.on_parameters_replaced: Callable[[], None] | None = None
        """Called at a step's start after a tracked module got a new parameter object (``NeuralDbg``'s own
        lists of the model's parameters follow it)."""
        self._structure = StructureTracker(self.catalog)
        self._seen_steps: set[int] = set()
        self._replayed = False  # the open step was recorded before the trial was continued (mode="a")
        self._known_kpis: dict[str, int] = {}  # KPI name -> id, for names record_kpi checked before
        self._last_step: int | None = None
        self._last_step_type = "default"
        self._last_flush = time.monotonic()
        self._steps_since_flush = 0
        self._noted: set[str] = set()
        self._token = 0
        self._skipped_steps: list[tuple] = []  # steps of skip_step not handed to the writer yet
        self._hooks: list[Any] = []
        self._budget = None if budget is None else SnapshotBudget(budget)
        self._dispatcher = StepDispatcher(self._writer, self.catalog, flight_recorder, self._trigger_failed,
                                          self._budget)
        if budget is not None:  # to the library's logger: a training script's own output stays its own
            _LOG.info("%s: %s", self.trial, budget.describe())
        self._grad_batch = GradientBatch(self._flush_gradients)
        self._taps: Any = None  # the C++ gradient taps (``native``) once their module is loaded
        self._tap_keys: list[tuple[tuple[int, int], bool]] = []  # per tap armed: ((tensor id, iteration), batched)
        self._tap_arrays = tuple(np.zeros(0, np.int64) for _ in range(3))  # addresses, sizes, batches (``taps``)
        self._taps_compiled = False  # compiled autograd ran over taps: Python hooks from then on (``_end_taps``)
        self._polled_task = -2  # the backward pass whose end last read the parameters' gradients (``polled``)
        self._tier_state = None if tiers is None else TierState(tiers)
        self._tier_hook = None if tiers is None else _optimizer_pre_hook(self)
        self._tier_stepped = 0  # ``ParameterSteps._tier_optimizer_step``
        self._sentinels_on = False  # sentinel steps may run (``use_sentinels``): gradients are watched too
        self._sentinel_inputs: list[tuple[int, int]] = []  # (series, row in ``_values``) of its inputs
        self._sentinel_step: int | None = None  # the sentinel step open (``open_sentinel``), if any
        # a sentinel step's series ids and iterations, per layout of its rows
        self._sentinel_series: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        if tiers is not None:
            _LOG.info("%s: %s", self.trial, tiers.describe())
        self._series_of_parameters: dict[tuple[str, int], np.ndarray] = {}
        self._known_tensors: dict[str, tuple[str, str, int, int]] = {}  # name -> (role, node, tensor, value series)
        self._gradient_layouts: dict[tuple, tuple] = {}  # (kind, keys) -> (rows, (series, iterations, index))
        self._value_layouts: tuple[list, tuple] | None = None  # the last value keys and their layout (``gradients``)
        self._plans: dict[str, RegistrationPlan] = {}  # name -> how its last registration was recorded (``plan``)
        self._reset_step_state()
        if kernels.AVAILABLE:  # loaded (or, once per machine, built) here rather than inside the first step
            self._guard("loading the statistics kernels", backend.entries)

    # ---- lifecycle -------------------------------------------------------------------------------------
    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.close()

    def close(self) -> None:
        """Finish an open step, write everything buffered, consolidate the trial into one file, and remove
        every hook the recorder added. Idempotent. The file is ``<path>/<trial>/recording.h5``."""
        if not self.enabled or self._closed:
            return
        self._guard("writing skipped steps", self._write_skipped)
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
        self._drop_taps()
        if self._tier_hook is not None:
            self._tier_hook.remove()
            self._tier_hook = None
        self._problems.warn_recurring()

    def flush(self) -> None:
        """Write everything buffered as a new segment now: when it returns, those steps are on disk and
        readable by other processes."""
        if not self.enabled or self._closed:
            return
        self._write_skipped()
        self._flush(wait=True)

    def _flush(self, *, wait: bool) -> None:
        self._guard("flushing", lambda: self._writer.flush(self.catalog, wait=wait))
        self._last_flush = time.monotonic()
        self._steps_since_flush = 0

    # ---- state -----------------------------------------------------------------------------------------
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
        if self.enabled and self._skipped_steps:
            self._write_skipped()
        return getattr(self, "_last_kpis", None) if self.enabled else None


def _optimizer_pre_hook(recorder: Recorder) -> Any:
    """A global pre-hook of every optimizer's ``step()`` for the tiers (``TierState.settings_jumped``); it
    holds the recorder weakly (and goes with it), and a failure in it is logged, never raised into the
    training loop."""
    ref = weakref.ref(recorder)

    def hook(optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        rec = ref()
        if rec is not None and rec.enabled and not rec._closed:
            rec._guard("watching an optimizer's settings", partial(rec._tier_optimizer_step, optimizer))

    handle = register_optimizer_step_pre_hook(torch.compiler.disable(hook))  # untraced in a compiled step
    weakref.finalize(recorder, handle.remove)  # a recorder dropped without close() takes its hook with it
    return handle

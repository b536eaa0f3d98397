"""NeuralDbg: record an unchanged training loop through hooks, then ask why it failed.

>>> import tempfile, torch
>>> from torch import nn
>>> torch.manual_seed(0) and None
>>> model, criterion = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)), nn.CrossEntropyLoss()
>>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
>>> with tempfile.TemporaryDirectory() as folder:
...     with NeuralDbg(model, folder, trial="demo", loss=criterion) as dbg:
...         for step in range(3):
...             optimizer.zero_grad()
...             loss = criterion(model(torch.randn(16, 4)), torch.randint(0, 2, (16,)))
...             loss.backward()
...             optimizer.step()
...     from comgra_ndbg import open_recording
...     with open_recording(folder) as recording:
...         print(recording.steps.tolist(), [n for n in recording.nodes if not n.endswith(".parameters")])
[0, 1, 2] ['input', 'model.0', 'model.1', 'model.2', 'model', 'target', 'loss']

How it sees the loop (see ``docs/neuraldbg.md``): the model's forward pre-hook opens a step, or a new
iteration of the open step; a step ends when the next training forward pass finds the parameters changed
(the optimizer stepped) or, after a backward pass, the gradients cleared — or, exactly, at the
``optimizer=``'s step post-hook. Forward passes without gradients (``torch.no_grad()``, inference mode) or
in ``model.eval()`` are evaluation passes: they never open a training step, and each run of them is filed
as cheap summaries of step type ``eval`` at the training step it follows (``instrument/evaluation.py``).
Chosen modules' outputs are registered with the :class:`~comgra_ndbg.recorder.Recorder` under their
module path, parameters are tracked with their gradients read where each backward pass ends (no hook per
parameter), updates are derived when the step ends, and the tensor ``backward()`` is called on is the loss
(``comgra_ndbg.instrument.loss``).
"""
from __future__ import annotations

import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from comgra_ndbg.errors import InvalidArgumentError, RecorderStateError, RecordingExistsError
from comgra_ndbg.graph.eager import unwrap_compiled
from comgra_ndbg.instrument import patches
from comgra_ndbg.instrument.breakpoints import Breakpoints
from comgra_ndbg.instrument.halting import Halting, halting_flight_recorder
from comgra_ndbg.instrument.hooks import ROOT, ModuleHooks, ModulePattern, node_name, select_modules
from comgra_ndbg.instrument.structure import ModelStructure
from comgra_ndbg.instrument.checkpoint import Burst, HiddenCall, RecomputedGradients
from comgra_ndbg.instrument.compile_cache import evict_compiled_code
from comgra_ndbg.instrument.evaluation import EVAL, EvalRecording
from comgra_ndbg.instrument.invariants import LoopInvariants
from comgra_ndbg.instrument.light_steps import LightSteps
from comgra_ndbg.instrument.loss import LossCapture
from comgra_ndbg.instrument.outputs import OutputRegistration
from comgra_ndbg.instrument.steps import StepDetection, watch_callback
from comgra_ndbg.instrument.stuck_steps import StuckSteps
from comgra_ndbg.recorder import native
from comgra_ndbg.recorder.distributed import detect_rank, is_ddp_wrapped, shared_trial_name, unwrap_ddp
from comgra_ndbg.recorder.recorder import Recorder, RecorderWarning
from comgra_ndbg.recorder.tiers import FULL_EVERY
from comgra_ndbg.recorder.validation import check_step

if TYPE_CHECKING:  # the analysis is imported when a diagnosis is asked for, not by a recording
    from comgra_ndbg.analysis.events import CausalChain, CausalLink, Diagnosis, Event, Hypothesis

__all__ = ["Explanations", "NeuralDbg"]

PARAMETER_SUFFIX = ".parameters"
"""Parameters of module ``model.p`` form node ``model.p.parameters`` (``parameters`` cannot be a child's name)."""


class NeuralDbg(StepDetection, LightSteps, StuckSteps, OutputRegistration, LossCapture, RecomputedGradients,
                LoopInvariants, Breakpoints, Halting, EvalRecording):
    """Instruments ``model`` with hooks and records every training step of the loop that uses it.

    ``path`` is the group folder (default: ``runs`` in the working directory, the new trial's absolute path
    printed); the recording is ``path/trial``. ``optimizer`` ends each step at its ``step()`` (exact step
    boundaries). The tensor ``backward()`` is called on, when it was computed from the model's output, is
    recorded as node ``loss`` and KPI ``loss`` (what the analysis reads for loss spikes and divergence);
    ``loss=criterion_module`` takes the criterion's output (and its target) instead. ``modules`` chooses the
    modules whose outputs are recorded (path patterns such as ``"blocks.*"`` or module classes; default:
    every leaf module). ``summaries``, ``snapshots``, ``flight_recorder`` and ``recorder_options`` go to the
    :class:`Recorder`; among them ``byte_budget`` (default 256 MiB of snapshots per run, 1 MiB per step; None
    for no bound) keeps large models' recordings small (``docs/recording.md``, "Byte budget").
    ``detail="tiered"`` (default) measures everything — module outputs, their gradients, parameter updates —
    at the first 32 steps, every 40th step and the one after it, at snapshot steps (every 40th) and for 2 steps after
    something moved; the *sentinel steps* between record every parameter's value and gradient, the model's
    inputs and the KPIs, which the tiers watch for what moved (``recorder/tiers.py``,
    ``recorder/sentinel_steps.py``). ``detail=Tiers(sentinels=False)`` records module outputs at every step,
    ``detail="full"`` every update of every step too (``docs/recording.md``, "Statistic tiers").

    ``resume=True`` continues an existing trial (killed or finished; checkpoint-restart training): steps are
    numbered on from its last recorded step, or from ``first_step`` (the step the restarted run begins
    with; steps already in the recording are not recorded again). A model without trainable parameters
    (a frozen backbone) has no optimizer step to see: each training forward pass is then one step, unless
    ``optimizer=`` says when steps end.

    ``invariants=True`` checks the training loop itself at every step — gradients carried over without
    ``zero_grad()``, parameters outside the optimizer, steps that change nothing, the model's train/eval
    mode, BatchNorm on one sample, unused parameters, half-precision ``eps`` — and records the learning
    rate of every param group as KPI ``lr/<group>`` (``docs/diagnosis.md``, "Loop invariants"). A loop
    whose steps never end (``no_step_end``) is reported once and then recorded pass by pass, each training
    pass with a backward call a step of its own; ``invariants=False`` leaves out that split with the report,
    so the loop is recorded as step detection alone finds it: all its passes in one open step.

    ``record_eval=True`` records evaluation passes (no gradients, or ``model.eval()`` with no optimizer step
    following): each run of them (a validation loop) becomes KPIs of step type ``eval_step_type`` at the
    training step it follows — per chosen module, the share of non-finite outputs, their mean absolute value
    and root mean square — and non-finite evaluation outputs are reported as a loop invariant. It never
    changes the training steps, their numbering or their results (``instrument/evaluation.py``).

    ``halt_on`` (flight-recorder triggers, or ``"nonfinite"`` / ``"loss_spike"``) stops training when one
    fires, after writing the steps before it, recording ``halt_delay`` steps more and printing the diagnosis:
    ``halt_mode="raise"`` raises ``TrainingHalted``, ``"flag"`` sets :attr:`should_stop`
    (``instrument/halting.py``). :meth:`break_at`, :meth:`step_through` and :meth:`on` stop or call back
    inside the loop (``instrument/breakpoints.py``).

    ``profile=True`` (or a ``ProfileConfig``) profiles every module of the model at its own adaptive
    frequency — forward and backward time, saved activation bytes, allocator deltas on CUDA, FLOPs — and
    records each step's wall time and process memory (``docs/profiling.md``); off by default, and then it
    installs nothing.

    A ``DistributedDataParallel`` model is recorded under the names of the module it wraps (alike on ranks
    with and without the wrapper), and under ``torch.distributed`` each rank records ``path/trial/rank<r>/``
    with whether its model was wrapped, for the checks across ranks (``docs/neuraldbg.md``, "Distributed
    data parallel").

    Hooks are installed here and removed by :meth:`close` (or leaving the ``with`` block); the model then
    computes exactly as before.
    """

    def __init__(
        self,
        model: nn.Module,
        path: str | Path | None = None,
        *,
        trial: str | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        loss: nn.Module | None = None,
        modules: Sequence[ModulePattern] | None = None,
        summaries: Any = 1,
        snapshots: Any = FULL_EVERY,
        flight_recorder: Any = None,
        step_type: str = "train",
        enabled: bool = True,
        resume: bool = False,
        first_step: int | None = None,
        invariants: bool = True,
        halt_on: Sequence[Any] | None = None,
        halt_mode: str = "raise",
        halt_delay: int = 2,
        profile: Any = None,
        record_eval: bool = True,
        eval_step_type: str = EVAL,
        detail: Any = "tiered",
        **recorder_options: Any,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise InvalidArgumentError(f"NeuralDbg(model) needs a torch.nn.Module, got {type(model).__name__}")
        if optimizer is not None and not callable(getattr(optimizer, "register_step_post_hook", None)):
            raise InvalidArgumentError(f"optimizer= needs a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if loss is not None and not isinstance(loss, nn.Module):
            raise InvalidArgumentError(f"loss= takes the criterion module the loop calls (e.g. nn.CrossEntropyLoss()), "
                                       f"got {type(loss).__name__}; for a function (F.cross_entropy, your own) leave "
                                       f"loss= out: the tensor backward() is called on is recorded as the loss")
        if not isinstance(step_type, str) or not step_type:
            raise InvalidArgumentError(f"step_type must be a non-empty str, got {step_type!r}")
        if not isinstance(resume, bool):
            raise InvalidArgumentError(f"resume must be True or False, got {resume!r}")
        if not isinstance(invariants, bool):
            raise InvalidArgumentError(f"invariants must be True or False, got {invariants!r}")
        if not isinstance(record_eval, bool):
            raise InvalidArgumentError(f"record_eval must be True or False, got {record_eval!r}")
        if not isinstance(eval_step_type, str) or not eval_step_type or eval_step_type == step_type:
            raise InvalidArgumentError(f"eval_step_type must be a non-empty str other than the training steps' type "
                                       f"{step_type!r}, got {eval_step_type!r}")
        if first_step is not None:
            check_step(first_step)
        if resume:
            if recorder_options.get("mode", "a") != "a":
                raise InvalidArgumentError("resume=True continues the trial (mode='a'); do not pass another mode")
            recorder_options["mode"] = "a"
        self.model = model
        self.step_type = step_type
        self.enabled = bool(enabled)
        self._closed = False
        self._handles: list[Any] = []
        self._init_halting(halt_mode, halt_delay)
        flight_recorder = halting_flight_recorder(flight_recorder, halt_on)
        if not self.enabled:
            self._init_breakpoints([])
            self.recorder = Recorder("", enabled=False)
            self.path: Path | None = None
            return
        ddp = recorder_options.pop("ddp_wrapped", None)  # a framework that wraps the model itself knows better
        ddp = is_ddp_wrapped(model) if ddp is None else bool(ddp)
        self._root = unwrap_ddp(unwrap_compiled(model))  # names alike on ranks with and without DDP
        chosen = select_modules(self._root, modules)
        self._init_breakpoints(chosen)
        announce = path is None
        if announce:
            path = Path.cwd() / "runs"  # absolute: the printed path still works after a chdir, from anywhere
            ranked = detect_rank() if recorder_options.get("per_rank", True) else None
            trial = trial or (shared_trial_name(ranked, prefix="ndbg") if ranked is not None else
                              time.strftime("ndbg-%Y%m%d-%H%M%S-") + f"{time.time_ns() // 1000 % 1000000:06d}")
        try:
            self.recorder = Recorder(path, trial, summaries=summaries, snapshots=snapshots,
                                     flight_recorder=flight_recorder, ddp_wrapped=ddp, profile=profile,
                                     detail=detail, **recorder_options)
        except RecordingExistsError as error:
            if resume or "already has a recording" not in str(error):
                raise
            raise RecordingExistsError(f"{error} (NeuralDbg(..., resume=True) continues it)") from None
        self.path = self.recorder.path
        self.recorder.use_sentinels()
        if announce:
            budget = self.recorder.byte_budget
            print(f"comgra_ndbg: recording to {self.path}" + (f" ({budget.describe()})" if budget else ""))
        self.recorder.track_module(ROOT, self._root, node_suffix=PARAMETER_SUFFIX, gradients_in_hook=True)
        self.recorder.poll_parameter_gradients()  # taken where each backward pass ends (``_after_backward``)
        self._parameters = [p for p in self._root.parameters() if p.requires_grad]
        self._parameter_ids = {id(p) for p in self._root.parameters()}
        self._owners: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # optimizer -> (groups, owns)
        self.recorder.on_parameters_replaced = self._parameters_replaced
        self._own_steps = self._foreign_steps = 0  # optimizer steps in the open step: ours, others'
        self._parameter_names = {node_name(name) for name, _ in self._root.named_parameters()}
        self._root_selected = any(p == "" for p, _ in chosen)
        self._init_eval(record_eval, eval_step_type)
        self._hooks = ModuleHooks(chosen, self._on_output)
        self._hooks.bind(self._on_tap_grad)
        resumed = self.recorder.resume_after
        self._next_step = first_step if first_step is not None else (0 if resumed is None else resumed + 1)
        self._first_step = self._next_step
        self._steps_by_pass = optimizer is None and not self._parameters  # a frozen model: one pass, one step
        self._pass_open = False  # a training forward pass (an iteration) is running
        self._iteration = 0
        self._training_pass = False  # the last forward pass was a training pass
        self._evaluation_passes = 0  # forward passes without gradients or in eval mode (not recorded)
        self._compiled_pass = False  # ... and ran compiled code
        self._hidden_pass = False  # ... and hid some module outputs from autograd (frozen, checkpointed)
        self._declared_edges = False  # the open step's edges come from structure passes, not from autograd
        self._pass_args: tuple[tuple, dict] | None = None
        self._pass_inputs: list[tuple[str, torch.Tensor]] = []  # input_names of a recorded pass
        self._counts: dict[str, int] = {}
        self._module_nodes: dict[str, str] = {}  # module path -> its node name
        self._call_names: dict[tuple[str, int], str] = {}  # (node name, k) -> the name of the module's k-th call
        self._outputs_seen = 0
        self._output_names: list[str] = []
        self._eager_names: list[str] = []  # module outputs of this pass registered eagerly (not compiled)
        self._input_names: list[str] = []
        self._structures: dict[tuple[str, ...], ModelStructure] = {}
        self._hidden_calls: list[HiddenCall] = []  # module calls of the open step whose outputs autograd hid
        self._bursts: dict[Any, Burst] = {}  # checkpoint recompute node -> its module calls
        self._taps: dict[tuple[str, int], list[tuple[str, int]]] = {}  # (path, leaf) -> (name, iteration)
        self._tensor_handles: list[Any] = []
        self._criterion = loss
        self._losses: list[torch.Tensor] = []
        self._loss_shapes_checked = False  # the loss module's prediction and target shapes (``_check_loss_shapes``)
        self._loss_graphs_read = 0  # backward calls whose loss graph was read (``_check_loss_graph``)
        self._model_outputs: list[torch.Tensor] = []  # a training pass's outputs, until the next backward call
        self._outside_checked = False  # the model's graph was walked for parameters it does not hold
        self._loss_kpi: int | None = None  # the catalog's id of the loss KPI, once recorded
        self._loss_sources: dict[tuple[Any, int], tuple[str, int]] = {}  # output (grad_fn, nr) -> (name, iteration)
        self._backward_seen = False
        self._scaled_backward = False  # a GradScaler scaled a backward call of the open step
        self._callback_queued = False
        self._backward_compiled = False  # compiled autograd ran a backward pass our Python hook saw (``_on_backward``)
        self._gradients_read = False  # the engine's callback read the parameters' gradients (``_after_backward``)
        self._parameter_mark = 0
        self._grad_mark: tuple = ((), ())  # steps.gradient_fingerprint after the last backward pass
        # the recorder's C++ part, for the fingerprint and version sum of the step detection (chosen once, so
        # marks compared with each other are of one kind: a module built later is not taken up by this
        # instance), the watch on the output's backward passes, the output flags and the consumed gradients
        self._native_marks = native.taps_module()
        self._backward_watch = None if self._native_marks is None else self._native_marks.BackwardWatch(
            watch_callback(self))
        self._warned: set[str] = set()
        self._init_stuck_steps()
        self._init_invariants(invariants)
        self._init_light_steps(optimizer)
        disable = torch.compiler.disable
        self._handles.append(model.register_forward_pre_hook(disable(self._before_forward), with_kwargs=True))
        self._handles.append(model.register_forward_hook(disable(self._after_forward), with_kwargs=True))
        if loss is not None:
            self._handles.append(loss.register_forward_hook(disable(self._after_loss)))
        if optimizer is not None:
            self._handles.append(optimizer.register_step_post_hook(disable(self._after_optimizer_step)))
        self._evicted = evict_compiled_code(self._root) > 0  # code traced without the hooks just added
        if self._evicted or unwrap_compiled(model) is not model:
            self._hooks.pin()  # compiled code guards on the hooks: never take them out
        patches.attach(self)
        self.recorder.profile_module(ROOT, self._root)  # after the step hooks: a profiled pass sees its step open

    def _parameters_replaced(self) -> None:
        """A module of the model got a new parameter object (``module.weight = nn.Parameter(...)``), seen by the
        recorder at a step's start: the step detection, the light steps and the loop invariants follow the
        parameters the model holds now (the invariants start over: what they kept was about the old ones)."""
        self._parameters = [p for p in self._root.parameters() if p.requires_grad]
        self._parameter_ids = {id(p) for p in self._root.parameters()}
        self._owners = weakref.WeakKeyDictionary()
        self._light_probe = self._light_grads = self._probe_last = self._probe_before = None
        if self._inv:
            self._inv_close()
            self._init_invariants(True)

    # ---- lifecycle -------------------------------------------------------------------------------------
    def __enter__(self) -> NeuralDbg:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.close()

    def close(self) -> None:
        """Finish the open step, remove every hook, and close the recording. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if not self.enabled:
            return
        try:
            if self._light:  # first: an evaluation run is filed at the step it follows, this one
                self._safely("finishing a light step", self._end_light_step)
            self._safely("recording an evaluation run", self._eval_file)
            if self.recorder.current_step is not None:
                if self._inv:
                    self._safely("checking loop invariants", self._stuck_at_close)
                self._safely("finishing the last step", self._end_step)
            if self._next_step == self._first_step:
                other_updates = getattr(self, "_inv_copy_steps", 0)
                self._warn_once("no step", _why_no_step(self._evaluation_passes, other_updates))
        finally:
            self._hooks.remove()
            for handle in self._handles + self._tensor_handles:
                handle.remove()
            self._handles, self._tensor_handles = [], []
            if self._backward_watch is not None:
                self._backward_watch.reset()
            self._taps, self._losses, self._loss_sources, self._pass_args, self._pass_inputs = {}, [], {}, None, []
            self._inv_close()
            self._close_breakpoints()
            patches.detach(self)
            self.recorder.close()
        self._run_pending(can_raise=False)

    @property
    def steps(self) -> int:
        """Training steps seen so far."""
        return self._next_step - self._first_step if self.enabled else 0

    # ---- analysis ----------------------------------------------------------------------------------------
    def diagnose(self) -> Diagnosis:
        """The analysis (``comgra_ndbg.analyze``) of everything recorded so far, also stored with the
        recording for the GUI."""
        if not self.enabled or self.path is None:
            raise RecorderStateError("this NeuralDbg is disabled (enabled=False): nothing was recorded to analyse")
        from comgra_ndbg.analysis.api import analyze

        self.recorder.flush()
        return analyze(self.path)

    def explain_failure(self) -> Explanations:
        """The explanation sentences, best first: one per failure hypothesis, or one saying none was found.
        ``explanations[0]`` is the best; ``print(explanations)`` prints them numbered, one per line."""
        diagnosis = self.diagnose()
        return Explanations([h.sentence for h in diagnosis.hypotheses] or [diagnosis.explain()],
                            numbered=bool(diagnosis.hypotheses), text=diagnosis.explain(), diagnosis=diagnosis)

    def get_causal_hypotheses(self) -> tuple[Hypothesis, ...]:
        """Ranked hypotheses, best first; empty for a healthy run."""
        return self.diagnose().hypotheses

    def trace_causal_chain(self, failure_type: str) -> CausalChain | None:
        """The causal chain of the best hypothesis of ``failure_type`` (e.g. ``"vanishing"``; a longer name
        such as ``"vanishing_gradients"`` matches too), or None when the run shows no such failure."""
        from comgra_ndbg.analysis.hypotheses import TYPE_TEXT

        if not any(_is_type(failure_type, known) for known in TYPE_TEXT):
            raise InvalidArgumentError(f"unknown failure type {failure_type!r}; failure types are {sorted(TYPE_TEXT)}")
        return next((h.chain for h in self.get_causal_hypotheses() if _is_type(failure_type, h.type)), None)

    def detect_coupled_failures(self) -> tuple[CausalLink, ...]:
        """Causal links between events of different families."""
        return self.diagnose().coupled

    @property
    def events(self) -> tuple[Event, ...]:
        """Every semantic event found so far, in step order."""
        return self.diagnose().events

    # ---- fault isolation ---------------------------------------------------------------------------------
    def _safely(self, what: str, fn: Callable[..., Any], *args: Any) -> None:
        """``fn(*args)``, a failure logged and warned about instead of raised. The hooks every training step
        runs catch the same way inline, a call less each."""
        try:
            fn(*args)
        except Exception as error:  # a recording problem must never break the training loop
            self.recorder._warn(what, error)  # logged in the recording, warned about per part with counts

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(f"comgra_ndbg: {message}", RecorderWarning, stacklevel=3)


class Explanations(tuple):
    """Explanation sentences of a diagnosis, best first: a tuple of ``str`` (``explanations[0]`` is the best
    sentence) whose ``str()`` numbers them one per line — or is ``text``, the diagnosis' own explanation with
    each remedy under its sentence, when given. In a Jupyter notebook they show as the ``diagnosis``' table
    (or an HTML list without one).

    >>> explanations = Explanations(["Dead units originated in 'fc'.", "Loss spike at step 3."], numbered=True)
    >>> print(explanations[0])
    Dead units originated in 'fc'.
    >>> print(explanations)
    1. Dead units originated in 'fc'.
    2. Loss spike at step 3.
    """

    numbered: bool
    text: str | None
    diagnosis: Diagnosis | None

    def __new__(cls, sentences: Sequence[str], *, numbered: bool = True, text: str | None = None,
                diagnosis: Diagnosis | None = None) -> Explanations:
        self = super().__new__(cls, sentences)
        self.numbered, self.text, self.diagnosis = numbered, text, diagnosis
        return self

    def _repr_html_(self) -> str:
        """In a Jupyter notebook: the diagnosis' table when known, else the sentences as a numbered list."""
        if self.diagnosis is not None:
            return self.diagnosis._repr_html_()
        import html

        tag = "ol" if self.numbered else "ul"
        return f"<{tag}>" + "".join(f"<li>{html.escape(sentence)}</li>" for sentence in self) + f"</{tag}>"

    def __str__(self) -> str:
        if self.text is not None:
            return self.text
        if not self.numbered:
            return "\n".join(self)
        return "\n".join(f"{i + 1}. {sentence}" for i, sentence in enumerate(self))


def _is_type(asked: str, known: str) -> bool:
    """Whether the failure type asked for names ``known`` (``vanishing_gradients`` names ``vanishing``)."""
    return asked == known or asked.startswith(known + "_")


def _why_no_step(evaluation_passes: int, other_updates: int = 0) -> str:
    """The warning for a ``NeuralDbg`` closed without a training step: what it saw, and what to change
    (``other_updates``: steps of optimizers holding none of the model's parameters after its backward passes)."""
    if other_updates:
        return (f"NeuralDbg recorded no training step: the model's backward passes were followed by {other_updates} "
                f"step(s) of optimizers that hold none of its parameters, and none that holds them ever stepped; "
                f"build the optimizer from the parameters of the model that is trained (the recording's log says "
                f"more)")
    if evaluation_passes:
        return (f"NeuralDbg recorded no training step: the model's {evaluation_passes} forward pass(es) ran without "
                f"gradients (torch.no_grad(), inference mode) or in model.eval(), which are evaluation passes; train "
                f"with model.train() and gradients enabled inside the with-block")
    return ("NeuralDbg recorded no training step: the model it wraps never ran its forward() inside the with-block; "
            "a step starts at a forward pass of that module, so wrap the module the loop calls (not a part or a "
            "copy of it) and call it as model(inputs)")

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
in ``model.eval()`` are evaluation passes and are not recorded. Chosen modules' outputs are registered
with the :class:`~comgra_ndbg.recorder.Recorder` under their module path, parameters are tracked with
their gradients reduced in post-accumulate-grad hooks, and updates are derived when the step ends.
"""
from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn

from comgra_ndbg.analysis.api import analyze
from comgra_ndbg.analysis.events import CausalChain, CausalLink, Diagnosis, Event, Hypothesis
from comgra_ndbg.analysis.hypotheses import TYPE_TEXT
from comgra_ndbg.errors import InvalidArgumentError, RecorderStateError, RecordingExistsError
from comgra_ndbg.graph.eager import unwrap_compiled
from comgra_ndbg.recorder.hooks import (INPUT, ROOT, CompiledStructure, ModuleHooks, ModulePattern, discover_compiled,
                                        from_compiled_code, input_names, node_name, output_names, select_modules,
                                        tensor_leaves)
from comgra_ndbg.recorder.grad_hook import on_gradient
from comgra_ndbg.recorder.recorder import Recorder, RecorderWarning
from comgra_ndbg.recorder.validation import check_step

__all__ = ["NeuralDbg"]

PARAMETER_SUFFIX = ".parameters"
"""Parameters of module ``model.p`` form node ``model.p.parameters`` (``parameters`` cannot be a child's name)."""
TARGET, LOSS = "target", "loss"


class NeuralDbg:
    """Instruments ``model`` with hooks and records every training step of the loop that uses it.

    ``path`` is the group folder (default: a new ``runs/ndbg-<time>`` folder, printed); the recording is
    ``path/trial``. ``optimizer`` ends each step at its ``step()`` (exact step boundaries); ``loss`` is the
    criterion module the loop calls, recorded as node ``loss`` and KPI ``loss`` (what the analysis reads
    for loss spikes and divergence). ``modules`` chooses the modules whose outputs are recorded (path
    patterns such as ``"blocks.*"`` or module classes; default: every leaf module). ``summaries``,
    ``snapshots``, ``flight_recorder`` and ``recorder_options`` go to the :class:`Recorder`.

    ``resume=True`` continues an existing trial (killed or finished; checkpoint-restart training): steps are
    numbered on from its last recorded step, or from ``first_step`` (the step the restarted run begins
    with; steps already in the recording are not recorded again). A model without trainable parameters
    (a frozen backbone) has no optimizer step to see: each training forward pass is then one step, unless
    ``optimizer=`` says when steps end.

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
        snapshots: Any = 10,
        flight_recorder: Any = None,
        step_type: str = "train",
        enabled: bool = True,
        resume: bool = False,
        first_step: int | None = None,
        **recorder_options: Any,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise InvalidArgumentError(f"NeuralDbg(model) needs a torch.nn.Module, got {type(model).__name__}")
        if optimizer is not None and not callable(getattr(optimizer, "register_step_post_hook", None)):
            raise InvalidArgumentError(f"optimizer= needs a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if loss is not None and not isinstance(loss, nn.Module):
            raise InvalidArgumentError(f"loss= needs the criterion module the loop calls (e.g. nn.CrossEntropyLoss()), "
                                       f"got {type(loss).__name__}; a plain function cannot be hooked")
        if not isinstance(step_type, str) or not step_type:
            raise InvalidArgumentError(f"step_type must be a non-empty str, got {step_type!r}")
        if not isinstance(resume, bool):
            raise InvalidArgumentError(f"resume must be True or False, got {resume!r}")
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
        if not self.enabled:
            self.recorder = Recorder("", enabled=False)
            self.path: Path | None = None
            return
        self._root = unwrap_compiled(model)
        chosen = select_modules(self._root, modules)
        announce = path is None
        if announce:
            path = Path("runs")
            trial = trial or time.strftime("ndbg-%Y%m%d-%H%M%S-") + f"{time.time_ns() // 1000 % 1000000:06d}"
        try:
            self.recorder = Recorder(path, trial, summaries=summaries, snapshots=snapshots,
                                     flight_recorder=flight_recorder, **recorder_options)
        except RecordingExistsError as error:
            if resume or "already has a recording" not in str(error):
                raise
            raise RecordingExistsError(f"{error} (NeuralDbg(..., resume=True) continues it)") from None
        self.path = self.recorder.path
        if announce:
            print(f"comgra_ndbg: recording to {self.path}")
        self.recorder.track_module(ROOT, self._root, node_suffix=PARAMETER_SUFFIX, gradients_in_hook=True)
        self._parameters = [p for p in self._root.parameters() if p.requires_grad]
        self._parameter_names = {node_name(name) for name, _ in self._root.named_parameters()}
        self._root_selected = any(p == "" for p, _ in chosen)
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
        self._pass_args: tuple[tuple, dict] | None = None
        self._counts: dict[str, int] = {}
        self._outputs_seen = 0
        self._output_names: list[str] = []
        self._eager_names: list[str] = []  # module outputs of this pass registered eagerly (not compiled)
        self._input_names: list[str] = []
        self._structures: dict[tuple[str, ...], CompiledStructure] = {}
        self._taps: dict[tuple[str, int], list[tuple[str, int]]] = {}  # (path, leaf) -> (name, iteration)
        self._tensor_handles: list[Any] = []
        self._losses: list[torch.Tensor] = []
        self._backward_seen = False
        self._callback_queued = False
        self._parameter_mark = 0
        self._grad_mark: tuple = ()
        self._warned: set[str] = set()
        disable = torch.compiler.disable
        self._handles.append(model.register_forward_pre_hook(disable(self._before_forward), with_kwargs=True))
        self._handles.append(model.register_forward_hook(disable(self._after_forward), with_kwargs=True))
        if loss is not None:
            self._handles.append(loss.register_forward_hook(disable(self._after_loss)))
        if optimizer is not None:
            self._handles.append(optimizer.register_step_post_hook(disable(self._after_optimizer_step)))

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
            if self.recorder.current_step is not None:
                self._safely("finishing the last step", self._finish_step)
            if self._next_step == self._first_step:
                self._warn_once("no step", _why_no_step(self._evaluation_passes))
        finally:
            self._hooks.remove()
            for handle in self._handles + self._tensor_handles:
                handle.remove()
            self._handles, self._tensor_handles = [], []
            self._taps, self._losses, self._pass_args = {}, [], None
            self.recorder.close()

    @property
    def steps(self) -> int:
        """Training steps seen so far."""
        return self._next_step - self._first_step if self.enabled else 0

    # ---- step boundaries ---------------------------------------------------------------------------------
    def _before_forward(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if self._closed or self._hooks.collecting_now:
            return
        self._hooks.capture = False
        self._training_pass = (torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
                               and self._root.training)
        if self._training_pass:
            self._safely("starting a forward pass", self._begin_pass, args, kwargs)
        else:
            self._evaluation_passes += 1

    def _begin_pass(self, args: tuple, kwargs: dict) -> None:
        rec = self.recorder
        if self._pass_open:  # the last pass raised before its end
            rec.finish_iteration()
            self._pass_open = False
        if rec.current_step is not None and self._optimizer_stepped():
            self._finish_step()
        if rec.current_step is None:
            rec.start_step(self._next_step, self.step_type)
            self._next_step += 1
            self._parameter_mark = self._parameter_version()
            self._backward_seen = False
        self._iteration = rec.start_iteration()
        self._pass_open = True
        self._callback_queued = False
        self._compiled_pass = False
        self._counts, self._outputs_seen, self._output_names, self._eager_names = {}, 0, [], []
        capture = rec.is_recording
        self._pass_args = (args, kwargs) if capture else None
        self._input_names = []
        if capture:
            for name, tensor in input_names(args, kwargs):
                rec.register_tensor(name, tensor, role="input", node=INPUT)
                self._input_names.append(name)
        self._hooks.capture = capture

    def _optimizer_stepped(self) -> bool:
        """Whether the open step is over: parameters changed, or gradients were cleared after a backward (a
        model without trainable parameters: any earlier pass ends it)."""
        if self._steps_by_pass:
            return True
        if self._parameter_version() != self._parameter_mark:
            return True
        return self._backward_seen and self._grad_fingerprint() != self._grad_mark

    def _parameter_version(self) -> int:
        return sum(p._version for p in self._parameters)

    def _grad_fingerprint(self) -> tuple:
        return tuple(None if p.grad is None else (id(p.grad), p.grad._version) for p in self._parameters)

    def _after_forward(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        if self._closed or self._hooks.collecting_now or not self._pass_open:
            return
        self._safely("finishing a forward pass", self._end_pass, output)

    def _end_pass(self, output: Any) -> None:
        rec = self.recorder
        try:
            if self._hooks.capture:
                stashed = self._hooks.drain()
                if stashed:
                    self._register_compiled(stashed, output)
                elif not self._root_selected:
                    self._register_outputs("", list(tensor_leaves(output)), "output")
                if not self._outputs_seen and self._hooks.installed > self._root_selected:
                    self._warn_once("no output", "no chosen module reported its output in this forward pass: if the "
                                    "model was compiled and called before NeuralDbg hooked it, torch.compile does not "
                                    "see the new hooks (call torch.compiler.reset() first, or create NeuralDbg before "
                                    "the first call); otherwise check modules=")
            self._watch_backward(output)
        finally:
            self._hooks.capture = False
            self._pass_args = None
            rec.finish_iteration()
            self._pass_open = False

    def _watch_backward(self, output: Any) -> None:
        for _, tensor in tensor_leaves(output):
            if tensor.requires_grad and tensor.grad_fn is not None:
                self._tensor_handles.append(on_gradient(tensor, self._on_backward))
                return

    def _on_backward(self, grad: torch.Tensor) -> None:
        if not self._callback_queued and not self._closed:
            self._callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._after_backward)

    def _after_backward(self) -> None:
        self._callback_queued = False
        self._backward_seen = True
        self._grad_mark = self._grad_fingerprint()

    def _after_optimizer_step(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        if not self._closed and self.recorder.current_step is not None and not self._pass_open:
            self._safely("finishing the step", self._finish_step)

    def _finish_step(self) -> None:
        rec = self.recorder
        try:
            if self._pass_open:
                rec.finish_iteration()
                self._pass_open = False
            if self._losses:
                rec.record_kpi(LOSS, torch.stack(self._losses).mean())
            rec.finish_step()
        finally:
            for handle in self._tensor_handles:
                handle.remove()
            self._tensor_handles, self._taps, self._losses = [], {}, []
            self._backward_seen = False

    # ---- module outputs ------------------------------------------------------------------------------------
    def _on_output(self, path: str, output: Any) -> None:
        """Forward hook of a chosen module, eager: register its output now."""
        leaves = list(tensor_leaves(output))
        if any(from_compiled_code(tensor) for _, tensor in leaves):
            self._hooks.stash.append((path, output, ()))  # a compiled region's output: registered with the rest
            return
        self._safely("recording a module output", self._register_outputs, path, leaves,
                     "output" if path == "" else "intermediate")

    def _register_outputs(self, path: str, leaves: list[tuple[str, torch.Tensor]], role: str) -> None:
        node = node_name(path)
        for name, tensor in output_names(node, leaves, self._counts):
            self.recorder.register_tensor(name, tensor, role=role, node=node, module=node)
            self._eager_names.append(name)
            self._outputs_seen += path != ""
            if path == "":
                self._output_names.append(name)

    def _register_compiled(self, stashed: list[tuple[str, Any, tuple[int, ...]]], output: Any) -> None:
        """Register what a compiled forward pass stashed, detached, with the edges of an eager pass."""
        rec = self.recorder
        self._compiled_pass = True
        rec._declare_all_edges()
        key = tuple(path for path, _, _ in stashed)
        structure = self._structures.get(key)
        if structure is None:
            structure = self._structures[key] = self._discover()
        iteration = self._iteration
        # Eagerly registered outputs count too: with only some submodules compiled, the eager pass's edges
        # are the only link between them and the compiled region's outputs (registered detached).
        known = self._parameter_names | set(self._input_names) | set(self._eager_names)
        items = [(path, list(tensor_leaves(out)), tapped) for path, out, tapped in stashed]
        if not self._root_selected:
            items.append(("", list(tensor_leaves(output)), ()))
        for path, leaves, tapped in items:
            node = node_name(path)
            for leaf, (name, tensor) in enumerate(output_names(node, leaves, self._counts)):
                rec.register_tensor(name, tensor.detach(), role="output" if path == "" else "intermediate",
                                    node=node, module=node, bounds=structure.bounds.get(name))
                known.add(name)
                self._outputs_seen += path != ""
                if path == "":
                    self._output_names.append(name)
                if not tensor.requires_grad:
                    continue
                if leaf in tapped:
                    self._taps.setdefault((path, leaf), []).append((name, iteration))
                else:
                    self._tensor_handles.append(on_gradient(tensor, partial(self._on_grad, name, iteration,
                                                                            not self._compiled_pass)))
        for edge in structure.edges:
            if edge.source in known and edge.target in known:
                rec.add_dependency(edge.source, edge.target, discovered=True)

    def _discover(self) -> CompiledStructure:
        """Edges of a compiled model, from one eager pass on this pass's inputs (no graph if that fails)."""
        if self._pass_args is None:
            return CompiledStructure()
        args, kwargs = self._pass_args
        try:
            return discover_compiled(self._root, args, kwargs, self._hooks, root_output=not self._root_selected)
        except Exception as error:  # no graph is better than a broken training run
            self._warn_once("discovery", f"discovering the dependency graph of the compiled model failed "
                                         f"({type(error).__name__}: {error}); it is recorded without edges")
            return CompiledStructure()

    def _on_tap_grad(self, path: str, leaf: int, grad: torch.Tensor) -> None:
        pending = self._taps.get((path, leaf))
        if pending:
            name, iteration = pending.pop()  # backward meets a module's calls in reverse order
            self._on_grad(name, iteration, False, grad)

    def _on_grad(self, name: str, iteration: int, deferred: bool, grad: torch.Tensor) -> None:
        """``deferred`` for eager passes: summarised with the other gradients when the backward pass ends."""
        if not self._closed and self.recorder.current_step is not None:
            self._safely("recording a gradient", partial(self.recorder.record_gradient, name, grad,
                                                         iteration=iteration, deferred=deferred))

    # ---- the loss ----------------------------------------------------------------------------------------
    def _after_loss(self, module: nn.Module, args: tuple, output: Any) -> None:
        if (self._closed or self._hooks.collecting_now or not self._training_pass or not torch.is_grad_enabled()
                or not isinstance(output, torch.Tensor) or self.recorder.current_step is None):
            return
        self._safely("recording the loss", self._record_loss, args, output)

    def _record_loss(self, args: tuple, output: torch.Tensor) -> None:
        """The loss value (KPI, every step) and, on recorded steps, the loss and target tensors."""
        rec = self.recorder
        self._losses.append(output.detach().float().mean())
        if not rec.is_recording:
            return
        target = args[1] if len(args) > 1 and isinstance(args[1], torch.Tensor) and not args[1].requires_grad else None
        [(name, _)] = output_names(LOSS, [("", output)], self._counts)
        sources = list(self._output_names)
        if target is not None:
            [(target_name, _)] = output_names(TARGET, [("", target)], self._counts)
            rec.register_tensor(target_name, target, role="target", node=TARGET)
            sources.append(target_name)
        if not self._compiled_pass:
            rec.register_tensor(name, output, role="loss", node=LOSS)
            return
        rec.register_tensor(name, output.detach(), role="loss", node=LOSS)  # autograd would see the whole region
        for source in sources:
            rec.add_dependency(source, name, discovered=True)
        if output.requires_grad:
            self._tensor_handles.append(on_gradient(output, partial(self._on_grad, name, self._iteration, False)))

    # ---- analysis ----------------------------------------------------------------------------------------
    def diagnose(self) -> Diagnosis:
        """The analysis (``comgra_ndbg.analyze``) of everything recorded so far, also stored with the
        recording for the GUI."""
        if not self.enabled or self.path is None:
            raise RecorderStateError("this NeuralDbg is disabled (enabled=False): nothing was recorded to analyse")
        self.recorder.flush()
        return analyze(self.path)

    def explain_failure(self) -> str:
        """One sentence per failure hypothesis, best first, or a line saying none was found."""
        return self.diagnose().explain()

    def get_causal_hypotheses(self) -> tuple[Hypothesis, ...]:
        """Ranked hypotheses, best first; empty for a healthy run."""
        return self.diagnose().hypotheses

    def trace_causal_chain(self, failure_type: str) -> CausalChain | None:
        """The causal chain of the best hypothesis of ``failure_type`` (e.g. ``"vanishing"``; a longer name
        such as ``"vanishing_gradients"`` matches too), or None when the run shows no such failure."""
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
        try:
            fn(*args)
        except Exception as error:  # a recording problem must never break the training loop
            self.recorder._warn(what, error)  # logged in the recording, warned about per part with counts

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(f"comgra_ndbg: {message}", RecorderWarning, stacklevel=3)


def _is_type(asked: str, known: str) -> bool:
    """Whether the failure type asked for names ``known`` (``vanishing_gradients`` names ``vanishing``)."""
    return asked == known or asked.startswith(known + "_")


def _why_no_step(evaluation_passes: int) -> str:
    """The warning for a ``NeuralDbg`` closed without a training step: what it saw, and what to change."""
    if evaluation_passes:
        return (f"NeuralDbg recorded no training step: the model's {evaluation_passes} forward pass(es) ran without "
                f"gradients (torch.no_grad(), inference mode) or in model.eval(), which are evaluation passes; train "
                f"with model.train() and gradients enabled inside the with-block")
    return ("NeuralDbg recorded no training step: the model it wraps never ran its forward() inside the with-block; "
            "a step starts at a forward pass of that module, so wrap the module the loop calls (not a part or a "
            "copy of it) and call it as model(inputs)")

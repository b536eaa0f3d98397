"""Breakpoints and hooks: stop inside the recorded training loop, or call the user's code there.

``Breakpoints`` is a mixin of ``NeuralDbg`` and works on its state. ``break_at(module, when=, at=,
action=)`` adds one forward hook to the module (after the recording's own, so the output is recorded
first); in a training pass it checks the condition (``conditions``) on each tensor of the module's output
(``at="forward"``), or hangs a gradient hook on them and checks their gradients in ``backward()``
(``at="backward"``). When it holds, the action runs right there, inside the forward or backward pass:
``"pdb"`` opens the debugger with ``module``, ``inputs``, ``output``, ``grad`` and ``step`` in scope,
``"raise"`` raises :class:`~comgra_ndbg.errors.BreakpointHit`, a function is called with a
:class:`LayerCall`. ``on(event, fn)`` calls ``fn`` after each chosen module's forward (``after_layer``,
with its output's summary statistics), at the end of each step (``after_step``, with the step's recorded
summaries and KPIs) and before each step's first forward pass (``before_step``, with the step number).

Nothing here runs inside the recorder's fault isolation: the user's code (a callback, a condition
function) may raise, and its exception reaches the training loop as it is. The recording stays intact:
step-end callbacks run between steps (a finished step is written before they run), and a pass a
breakpoint stops is finished with the step when training goes on or the block ends. Evaluation passes
(``no_grad``, ``eval()``) and the structure pass never fire breakpoints.
"""
from __future__ import annotations

import difflib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase
from functools import cached_property, partial
from typing import Any

import numpy as np
import torch
from torch import nn

from comgra_ndbg.errors import BreakpointHit, InvalidArgumentError, UnknownModuleError, UnknownSeriesError
from comgra_ndbg.graph.eager import unwrap_compiled
from comgra_ndbg.instrument.conditions import Condition, parse_condition
from comgra_ndbg.instrument.hooks import ROOT, node_name, tensor_leaves
from comgra_ndbg.recorder.grad_hook import on_gradient
from comgra_ndbg.stats.reducer import summarize
from comgra_ndbg.stats.statistics import STATISTICS, derive, derive_one, merge_groups

__all__ = ["Breakpoint", "Breakpoints", "EVENTS", "LayerCall", "StepSummaries", "debug_layer", "interactive",
           "step_summaries"]

EVENTS = ("after_layer", "after_step", "before_step")
ACTIONS = ("pdb", "raise")
Action = str | Callable[["LayerCall"], Any]


@dataclass(frozen=True)
class LayerCall:
    """One call of a module in a training pass, as a breakpoint action or an ``after_layer`` hook sees it.

    ``path`` is the module's path inside the model (``""``: the model), ``inputs`` its forward arguments,
    ``output`` what it returned; for ``at="backward"``, ``grad`` is the gradient that reached the output
    tensor named in ``reason``. ``summaries`` (``after_layer``) maps each output tensor's name to its
    summary statistics (``comgra_ndbg.stats.statistics.STATISTICS``, as the recording holds them)."""

    step: int | None
    path: str
    module: nn.Module
    inputs: tuple
    output: Any
    at: str = "forward"
    grad: torch.Tensor | None = None
    reason: str = ""
    summaries: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def node(self) -> str:
        """The module's node name in the recording (``model.blocks.2``)."""
        return node_name(self.path)


@dataclass(frozen=True)
class StepSummaries:
    """What an ``after_step`` hook receives: the step's recorded summaries, merged over its iterations, and
    its KPIs. ``rows`` holds the sufficient statistics per ``(tensor name, kind)``; :meth:`stat` derives one
    statistic, :attr:`summaries` all of them (``(name, kind) -> statistic -> value``), on demand, so a hook
    that reads one number pays for one. On a step the policies skipped ``rows`` is empty (``recorded`` is
    False) and ``kpis`` still holds the step's KPIs, which are recorded every step."""

    step: int
    rows: dict[tuple[str, str], np.ndarray]
    kpis: dict[str, float]

    @property
    def recorded(self) -> bool:
        """Whether the step's summaries were taken (False on a step the summary policy skipped)."""
        return bool(self.rows)

    @cached_property
    def summaries(self) -> dict[tuple[str, str], dict[str, float]]:
        """Every statistic of every recorded tensor of the step."""
        if not self.rows:
            return {}
        derived = derive(np.stack(list(self.rows.values())))
        return {key: {stat: float(values[i]) for stat, values in derived.items()} for i, key in enumerate(self.rows)}

    def stat(self, name: str, statistic: str, kind: str = "value") -> float:
        """One statistic of one recorded tensor, e.g. ``stat("model.0", "abs_max", "grad")``."""
        if not self.rows:
            raise UnknownSeriesError(f"step {self.step} has no summaries: the summary policy skipped it; check "
                                     f"info.recorded first, or summarise every step (NeuralDbg(..., summaries=1), "
                                     f"the default); info.kpis holds the step's KPIs either way")
        row = self.rows.get((name, kind))
        if row is None or statistic not in STATISTICS:
            names = sorted({n for n, _ in self.rows})
            close = difflib.get_close_matches(name, names, n=3)
            raise UnknownSeriesError(f"step {self.step} has no summary {statistic!r} of {name!r} ({kind}); "
                                     f"recorded tensors: {close or names[:12]}; statistics: {sorted(STATISTICS)}")
        return float(derive_one(row[None], statistic)[0])


def step_summaries(step: int, series: np.ndarray, rows: np.ndarray, kpis: dict[str, float],
                   name_of: Callable[[int], tuple[str, str]]) -> StepSummaries:
    """The :class:`StepSummaries` of summary ``rows`` (one per ``series`` id and iteration), the iterations of
    a series merged; ``name_of(series id)`` is its ``(tensor name, kind)``.

    >>> from comgra_ndbg.store.schema import FIELD, identity_row
    >>> row = identity_row(); row[[FIELD["count"], FIELD["min"], FIELD["max"]]] = 2, -3.0, 1.0
    >>> step_summaries(4, np.array([7]), row[None], {"loss": 0.5}, lambda sid: ("fc", "grad")).stat("fc", "abs_max",
    ...                                                                                              "grad")
    3.0
    """
    if not len(series):
        return StepSummaries(step, {}, dict(kpis))
    ids, merged = merge_groups(np.asarray(series), np.asarray(rows))
    return StepSummaries(step, {name_of(sid): merged[i] for i, sid in enumerate(ids.tolist())}, dict(kpis))


def debug_layer(call: LayerCall) -> None:
    """The ``"pdb"`` action: the debugger, in a frame holding ``module``, ``inputs``, ``output``, ``grad``,
    ``step`` and ``call``; ``c`` continues training."""
    module, inputs, output, grad, step = call.module, call.inputs, call.output, call.grad, call.step  # noqa: F841
    print(f"comgra_ndbg: breakpoint at {call.node!r} ({call.at}) in step {step}: {call.reason}. In scope: module, "
          f"inputs, output, grad, step, call; 'c' continues training.")
    import pdb  # with bdb, cmd and code: imported when a breakpoint is reached

    pdb.Pdb().set_trace(sys._getframe())


class Breakpoint:
    """A breakpoint set by ``break_at`` or ``step_through``: ``hits`` counts how often it fired;
    ``remove()`` takes it out."""

    def __init__(self, paths: Sequence[str], condition: Condition, at: str, action: Action,
                 owner: list[Breakpoint]) -> None:
        self.paths, self.condition, self.at, self.action = tuple(paths), condition, at, action
        self.hits = 0
        self._owner = owner

    def remove(self) -> None:
        """Stop this breakpoint (idempotent)."""
        if self in self._owner:
            self._owner.remove(self)

    def __repr__(self) -> str:
        shown = ", ".join(repr(p) for p in self.paths[:3]) + (" …" if len(self.paths) > 3 else "")
        return f"Breakpoint({shown}, when={self.condition.text!r}, at={self.at!r}, hits={self.hits})"


class Breakpoints:
    """Breakpoints and hooks of ``NeuralDbg`` (see the module docstring); not used on its own."""

    def _init_breakpoints(self, chosen: Sequence[tuple[str, nn.Module]]) -> None:
        self._breakpoints: list[Breakpoint] = []
        self._callbacks: dict[str, list[Callable[..., Any]]] = {event: [] for event in EVENTS}
        self._chosen_paths = [path for path, _ in chosen]
        self._layer_handles: dict[str, Any] = {}
        self._pending: list[Callable[[], Any]] = []  # user code to run at the next step boundary

    # ---- public API ----------------------------------------------------------------------------------------
    def break_at(self, module: str | nn.Module, *, when: str | Callable[[torch.Tensor], Any] = "always",
                 at: str = "forward", action: Action | None = None) -> Breakpoint:
        """Stop at ``module`` (a path inside the model such as ``"blocks.2"``, a node name ``"model.blocks.2"``,
        an ``fnmatch`` pattern ``"blocks.*"`` or the module itself) in each training pass where ``when``
        holds for a tensor of its output (``at="forward"``) or for the gradient reaching it
        (``at="backward"``). ``action``: ``"pdb"`` (the default when a person can type into it: stdin is a
        terminal, or a notebook open in Jupyter), ``"raise"`` (:class:`BreakpointHit`; the default otherwise)
        or a function of a :class:`LayerCall`."""
        condition = parse_condition(when)
        if at not in ("forward", "backward"):
            raise InvalidArgumentError(f"at= is 'forward' (the module's output) or 'backward' (its gradient), "
                                       f"got {at!r}")
        paths = self._resolve_modules(module)
        return self._add_breakpoint(paths, condition, at, _check_action(action))

    def step_through(self, action: Action | None = None) -> Breakpoint:
        """Pause after each chosen module's forward pass (the modules of ``modules=``), in call order:
        ``action`` as for :meth:`break_at` (``"pdb"`` by default when interactive)."""
        return self._add_breakpoint(self._chosen_paths, parse_condition("always"), "forward", _check_action(action))

    def on(self, event: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Call ``fn`` at ``event``: ``"after_layer"`` with a :class:`LayerCall` (after each chosen module's
        forward in a training pass, its output's summaries in ``summaries``), ``"after_step"`` with the
        step's :class:`StepSummaries` once the step is written, ``"before_step"`` with the number of the
        step about to start. Returns ``fn``; ``fn``'s exceptions reach the training loop."""
        if event not in EVENTS:
            close = difflib.get_close_matches(str(event), EVENTS, n=1)
            raise InvalidArgumentError(f"unknown event {event!r}{f' (did you mean {close[0]!r}?)' if close else ''}; "
                                       f"events are {list(EVENTS)}")
        if not callable(fn):
            raise InvalidArgumentError(f"on({event!r}, fn) needs a function, got {type(fn).__name__}")
        self._callbacks[event].append(fn)
        if event == "after_layer" and self.enabled:
            for path in self._chosen_paths:
                self._install_layer_hook(path)
        return fn

    @property
    def breakpoints(self) -> tuple[Breakpoint, ...]:
        """The breakpoints in effect."""
        return tuple(self._breakpoints)

    # ---- setting up ----------------------------------------------------------------------------------------
    def _resolve_modules(self, module: str | nn.Module) -> list[str]:
        root = unwrap_compiled(self.model)
        named = dict(root.named_modules())
        if isinstance(module, nn.Module):
            found = [path for path, m in named.items() if m is module]
            if not found:
                raise UnknownModuleError(f"break_at got a {type(module).__name__} that is not part of the model; pass "
                                         f"one of its modules or a path such as {next(iter(named), '')!r}")
            return found[:1]
        if not isinstance(module, str):
            raise InvalidArgumentError(f"break_at takes a module path (str, e.g. 'blocks.2') or a module of the "
                                       f"model, got {type(module).__name__}")
        for name in (module, module[len(ROOT) + 1:] if module.startswith(ROOT + ".") else None):
            if name is not None and name in named:
                return [name]
        if any(c in module for c in "*?["):
            matched = [path for path in named if fnmatchcase(path, module)]
            if matched:
                return matched
        paths = [path for path in named if path]
        close = difflib.get_close_matches(module, paths, n=3, cutoff=0.5)
        hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
        raise UnknownModuleError(f"the model has no module {module!r}; {hint}module paths are {paths[:12]}"
                                 f"{' …' if len(paths) > 12 else ''} ('' is the model itself)")

    def _add_breakpoint(self, paths: Sequence[str], condition: Condition, at: str, action: Action) -> Breakpoint:
        point = Breakpoint(paths, condition, at, action, self._breakpoints)
        self._breakpoints.append(point)
        if self.enabled:
            for path in paths:
                self._install_layer_hook(path)
        return point

    def _install_layer_hook(self, path: str) -> None:
        if self._closed or path in self._layer_handles:
            return
        module = self._root.get_submodule(path)
        hook = torch.compiler.disable(partial(self._on_layer, path))
        self._layer_handles[path] = module.register_forward_hook(hook)

    # ---- in the training pass ------------------------------------------------------------------------------
    def _on_layer(self, path: str, module: nn.Module, args: tuple, output: Any) -> None:
        if self._closed or not self._pass_open or self._hooks.collecting_now:
            return
        step = self.recorder.current_step
        if self._callbacks["after_layer"] and path in self._chosen_paths:
            call = LayerCall(step, path, module, args, output, summaries=self._layer_summaries(path, output))
            for fn in list(self._callbacks["after_layer"]):
                fn(call)
        for point in [p for p in self._breakpoints if path in p.paths]:
            call = LayerCall(step, path, module, args, output, at=point.at)
            for suffix, tensor in tensor_leaves(output):
                if point.at == "backward":
                    if tensor.requires_grad:
                        watch = partial(self._on_layer_grad, point, call, node_name(path) + suffix)
                        self._tensor_handles.append(on_gradient(tensor, watch))
                    continue
                reason = point.condition.check(tensor)
                if reason is not None:
                    self._fire(point, replace(call, reason=f"{node_name(path) + suffix}: {reason}"))
                    break

    def _on_layer_grad(self, point: Breakpoint, call: LayerCall, name: str, grad: torch.Tensor) -> None:
        if self._closed or point not in self._breakpoints:
            return
        reason = point.condition.check(grad)
        if reason is not None:
            self._fire(point, replace(call, grad=grad, reason=f"gradient of {name}: {reason}"))

    def _fire(self, point: Breakpoint, call: LayerCall) -> None:
        point.hits += 1
        action = point.action
        if callable(action):
            action(call)
        elif action == "raise":
            raise BreakpointHit(f"breakpoint at {call.node!r} ({call.at}, when {point.condition.text!r}) hit in step "
                                f"{call.step}: {call.reason}", module=call.module, path=call.path, step=call.step,
                                at=call.at, inputs=call.inputs, output=call.output, grad=call.grad, reason=call.reason)
        else:
            debug_layer(call)

    def _layer_summaries(self, path: str, output: Any) -> dict[str, dict[str, float]]:
        summaries = {}
        for suffix, tensor in tensor_leaves(output):
            try:
                with torch.no_grad():
                    row = summarize(tensor.detach(), batched=tensor.dim() >= 2)
            except Exception as error:  # a tensor the recorder cannot summarise is left out, as when recording
                self.recorder._warn("summarising a module output for an after_layer hook", error)
                continue
            summaries[node_name(path) + suffix] = {stat: float(v[0]) for stat, v in derive(row[None]).items()}
        return summaries

    # ---- at step boundaries ----------------------------------------------------------------------------------
    def _step_finished(self, step: int) -> None:
        """Called once step ``step`` is written: queue the ``after_step`` hooks with its summaries."""
        self._finished = step
        if not self._callbacks["after_step"]:
            return
        last = self.recorder.last_record
        if last is not None and last[0].step == step:
            record, kpis = last
            catalog = self.recorder.catalog

            def name_of(sid: int) -> tuple[str, str]:
                tensor, kind = catalog.series[sid]
                return catalog.tensors[tensor].name, kind

            info = step_summaries(step, record.rows.series, record.rows.data, kpis, name_of)
        else:
            own = self.recorder.last_kpis
            info = StepSummaries(step, {}, dict(own[1]) if own is not None and own[0] == step else {})
        self._pending.extend(partial(fn, info) for fn in self._callbacks["after_step"])

    def _run_pending(self, *, can_raise: bool = True) -> None:
        """Run the queued user hooks, oldest first (their exceptions propagate), then act on a halt request."""
        while self._pending:
            self._pending.pop(0)()
        if self._halt is None and self.enabled and self.recorder.halt_request is not None:  # (checked at every step)
            self._act_on_halt(can_raise=can_raise)

    def _before_step(self) -> None:
        """Before a training pass: the ``before_step`` hooks when it opens a new step."""
        if self._callbacks["before_step"] and self.recorder.current_step is None and not self._closed:
            for fn in list(self._callbacks["before_step"]):
                fn(self._next_step)

    def _close_breakpoints(self) -> None:
        for handle in self._layer_handles.values():
            handle.remove()
        self._layer_handles = {}


def interactive() -> bool:
    """Whether a person can type into the debugger: stdin is a terminal, or this is a Jupyter kernel whose
    frontend answers input requests (a notebook open in Jupyter, JupyterLab, VS Code). A notebook executed
    as a batch job (nbclient, papermill) sends none, and a debugger there would fail on its first prompt."""
    if sys.stdin is not None and sys.stdin.isatty():
        return True
    ipython = sys.modules.get("IPython")  # imported already in any kernel; never imported here
    shell = ipython.get_ipython() if ipython is not None else None
    kernel = getattr(shell, "kernel", None)
    return bool(getattr(kernel, "_allow_stdin", False))


def _check_action(action: Action | None) -> Action:
    if action is None:
        return "pdb" if interactive() else "raise"
    if callable(action) or action in ACTIONS:
        return action
    raise InvalidArgumentError(f"action= is 'pdb', 'raise' or a function of a LayerCall, got {action!r}")

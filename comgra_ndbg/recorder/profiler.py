"""Per-layer profiling inside the training loop: forward and backward time, saved activation bytes,
allocator deltas and FLOPs per module, and process memory per step.

Every module of a profiled model gets a forward pre-hook and a forward hook that return at once unless the
open step is profiled (the profiler's own policy; see ``profile_config``), so an unprofiled step pays two
attribute checks per module call, and a recorder without ``profile=`` installs nothing. On a profiled step:

- forward time: a clock mark at each hook; a call's exclusive time is its time minus its profiled children's;
- backward time: the forward hook walks the autograd nodes the call created (sequence numbers after the
  call began, not yet claimed by an inner module) and hooks each: the node's own run time is the module's
  backward time, so the modules' figures never overlap;
- saved bytes: a saved-tensor pack hook, active during the root's forward, counts each storage autograd keeps
  once, for the innermost module running (parameters left out: they are no activation memory);
- allocator deltas (CUDA): allocated and peak bytes around each call (the peak statistics are reset per call);
- FLOPs: on the second profiled step of each step type, ``torch.utils.flop_counter`` counts every op of the
  forward pass for the innermost module running.

Times of CUDA events are read only once the device has passed them (``EventClock``), at a later step or at
``close()``: the training step never waits. Any failure inside a hook ends profiling of that step and is
reported; the forward and backward passes go on unchanged.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from comgra_ndbg.instrument.hooks import tensor_leaves
from comgra_ndbg.recorder.profile_config import (CudaMemory, EventClock, HostClock, ModuleFlops, NoDeviceMemory,
                                                 ProfileConfig, rss_bytes)
from comgra_ndbg.store import schema

__all__ = ["ModuleProfiler"]

_F = schema.PROFILE_FIELD
_NO_SEQUENCE = 2**63  # AccumulateGrad nodes carry UINT64_MAX: parameters' gradient sinks, no module's work


class _Frame:
    """One module call in progress."""

    __slots__ = ("index", "call", "alloc0", "peak", "sequence")

    def __init__(self, index: int, call: int, alloc0: float, sequence: int) -> None:
        self.index, self.call, self.alloc0, self.peak, self.sequence = index, call, alloc0, alloc0, sequence


class _StepProfile:
    """What one profiled step measured so far."""

    def __init__(self, step: int, count_flops: bool) -> None:
        self.step = step
        self.count_flops = count_flops
        self.calls: list[list[Any]] = []  # [module index, start mark, end mark, parent call or -1]
        self.spans: list[tuple[int, Any, Any]] = []  # backward: (module index, start mark, end mark)
        self.stack: list[_Frame] = []
        self.saved: dict[int, float] = {}
        self.allocated: dict[int, float] = {}
        self.peak: dict[int, float] = {}
        self.flops: dict[int, float] = {}
        self.claimed: set[int] = set()
        self.nodes: list[Any] = []  # the hooked autograd nodes, alive until the step ends (ids stay unique)
        self.storages: set[int] = set()  # counted already, or a parameter's
        self.contexts: list[Any] = []  # saved-tensor hooks and the FLOP counter, entered at the outermost call
        self.saved_unknown = False  # a pass ran under someone else's saved-tensor hooks: bytes not counted

    def marks(self) -> list[Any]:
        """Every clock mark taken (calls cut short by an exception have no end mark)."""
        ends = [c[2] for c in self.calls if c[2] is not None]
        return [c[1] for c in self.calls] + ends + [m for s in self.spans for m in s[1:]]

    def release(self) -> None:
        """Forget the autograd nodes and storages (the step is over; only the marks are still needed)."""
        self.nodes.clear()
        self.claimed.clear()
        self.storages.clear()


class ModuleProfiler:
    """Profiles the modules given to :meth:`attach` on the steps its policy picks; the recorder calls
    :meth:`start_step`, :meth:`finish_step`, :meth:`discard` and :meth:`close`. ``report(what, error)`` hears
    of its own failures. ``clock`` and ``memory`` default to the device of the first attached module's
    parameters (CUDA events and allocator counters on a GPU, ``perf_counter`` on the host)."""

    def __init__(self, config: ProfileConfig, report: Callable[[str, BaseException], None], *,
                 clock: Any = None, memory: Any = None) -> None:
        self.config = config
        self.policy = config.policy()
        self._report = report
        self._clock, self._memory = clock, memory
        self.names: list[str] = []
        self._roots: list[nn.Module] = []
        self._root_indices: set[int] = set()
        self._handles: list[Any] = []
        self._current: _StepProfile | None = None
        self._pending: list[_StepProfile] = []
        self._decided = False
        self._profiled: dict[Any, int] = {}  # step type -> profiled steps so far
        self._step_started = 0.0
        self._steps_seen = 0
        self._probe = torch.zeros((), requires_grad=True)  # a view of it reads autograd's sequence counter

    # ---- attaching -----------------------------------------------------------------------------------------
    def attach(self, name: str, module: nn.Module) -> None:
        """Hook ``module`` and every module inside it, named ``name`` and ``name.<path>``."""
        if self._clock is None:
            device = next((p.device for p in module.parameters()), torch.device("cpu"))
            cuda = device.type == "cuda"
            self._clock = EventClock() if cuda else HostClock()
            self._memory = CudaMemory(device) if cuda else NoDeviceMemory()
        self._roots.append(module)
        self._root_indices.add(len(self.names))
        for path, sub in module.named_modules():
            index = len(self.names)
            self.names.append(f"{name}.{path}" if path else name)
            self._handles.append(sub.register_forward_pre_hook(self._make_pre(index)))
            self._handles.append(sub.register_forward_hook(self._make_post(index)))

    def _make_pre(self, index: int) -> Callable[..., None]:
        def pre(module: nn.Module, args: Any) -> None:
            if not torch.compiler.is_compiling() and self._current is not None:  # compiled code: no guard on it
                self._guarded(self._enter, index)
        return pre

    def _make_post(self, index: int) -> Callable[..., None]:
        def post(module: nn.Module, args: Any, output: Any) -> None:
            if not torch.compiler.is_compiling() and self._current is not None:  # compiled code: no guard on it
                self._guarded(self._leave, index, output)
        return post

    def remove(self) -> None:
        """Remove every hook (idempotent)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._roots.clear()

    def _guarded(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except Exception as error:  # a profiling problem ends the step's profile, never the training step
            profile, self._current = self._current, None
            if profile is not None:
                _unwind(profile)
            self._report("profiling modules", error)

    # ---- module calls ---------------------------------------------------------------------------------------
    def _enter(self, index: int) -> None:
        profile = self._current
        if profile.stack and index in self._root_indices and profile.stack[0].index == index:
            _unwind(profile)  # a pass cut short by an exception (a breakpoint's BreakpointHit) and run again
        if not profile.stack:
            if _in_backward():  # an activation checkpoint's recomputation: no forward call of the step
                return
            self._open_contexts(profile)
        memory = self._memory
        alloc0 = math.nan
        if memory.available:
            peak = memory.peak()
            for frame in profile.stack:
                frame.peak = max(frame.peak, peak)
            memory.reset_peak()
            alloc0 = memory.allocated()
        sequence = -1
        if self.config.backward and torch.is_grad_enabled():
            sequence = self._probe.view_as(self._probe).grad_fn._sequence_nr()
        frame = _Frame(index, len(profile.calls), alloc0, sequence)
        parent = profile.stack[-1].call if profile.stack else -1
        profile.stack.append(frame)
        profile.calls.append([index, None, None, parent])
        profile.calls[-1][1] = self._clock.mark()  # last: the profiler's own work stays outside the call

    def _leave(self, index: int, output: Any) -> None:
        end = self._clock.mark()
        profile = self._current
        while profile.stack and profile.stack[-1].index != index:  # a call whose forward raised and was caught
            profile.stack.pop()
        if not profile.stack:
            return
        frame = profile.stack.pop()
        profile.calls[frame.call][2] = end
        memory = self._memory
        if memory.available:
            peak = max(frame.peak, memory.peak())
            profile.allocated[index] = profile.allocated.get(index, 0.0) + memory.allocated() - frame.alloc0
            profile.peak[index] = max(profile.peak.get(index, -math.inf), peak - frame.alloc0)
            if profile.stack:
                profile.stack[-1].peak = max(profile.stack[-1].peak, peak)
        if frame.sequence >= 0:
            self._claim_nodes(profile, index, output, frame.sequence)
        if not profile.stack:
            _unwind(profile)

    def _open_contexts(self, profile: _StepProfile) -> None:
        """Enter the saved-tensor hooks and the FLOP counter for the outermost call's pass."""
        if self.config.saved_tensors and torch.is_grad_enabled():
            if _other_saved_hooks():  # e.g. the model runs inside checkpoint(): ours would take its tensors
                profile.saved_unknown = True
            else:
                hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
                hooks.__enter__()
                profile.contexts.append(hooks)
        if profile.count_flops:
            counter = ModuleFlops(self.add_flops)
            counter.__enter__()
            profile.contexts.append(counter)

    def add_flops(self, flops: float) -> None:
        """FLOPs of one op, for the innermost module running (called by the FLOP counter)."""
        profile = self._current
        if profile is not None and profile.stack:
            index = profile.stack[-1].index
            profile.flops[index] = profile.flops.get(index, 0.0) + flops

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        profile = self._current
        if profile is None or not profile.stack:
            return tensor
        try:
            storage = tensor.untyped_storage()
            key = storage.data_ptr()
            if key and key not in profile.storages:
                profile.storages.add(key)
                index = profile.stack[-1].index
                profile.saved[index] = profile.saved.get(index, 0.0) + storage.nbytes()
        except (RuntimeError, NotImplementedError):  # sparse, nested or storage-less tensors: not counted
            return tensor
        return tensor

    def _claim_nodes(self, profile: _StepProfile, index: int, output: Any, sequence: int) -> None:
        """Hook the autograd nodes created since the call began that no inner module claimed."""
        frontier = [t.grad_fn for _, t in tensor_leaves(output) if t.grad_fn is not None]
        seen: set[int] = set()
        while frontier:
            node = frontier.pop()
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            number = node._sequence_nr()
            if number <= sequence or number >= _NO_SEQUENCE:
                continue
            if id(node) not in profile.claimed:
                profile.claimed.add(id(node))
                profile.nodes.append(node)
                self._time_node(profile, index, node)
            frontier.extend(following for following, _ in node.next_functions)

    def _time_node(self, profile: _StepProfile, index: int, node: Any) -> None:
        clock, cell = self._clock, [None]

        def before(grad_outputs: Any) -> None:
            try:
                cell[0] = clock.mark()
            except Exception:  # noqa: BLE001 - the backward pass goes on; this node goes untimed
                cell[0] = None

        def after(grad_inputs: Any, grad_outputs: Any) -> None:
            if cell[0] is not None:
                try:
                    profile.spans.append((index, cell[0], clock.mark()))
                except Exception:  # noqa: BLE001 - as above
                    cell[0] = None

        node.register_prehook(before)
        node.register_hook(after)

    # ---- steps ------------------------------------------------------------------------------------------------
    def start_step(self, step: int, step_type: str | None) -> None:
        """Decide whether the step's modules are profiled, and start its wall-time clock."""
        self._step_started = time.perf_counter()
        self._steps_seen += 1
        decision = self.policy.decide(step, step_type)
        self._decided = True
        self._current = None
        if decision.record and self._handles:
            # FLOPs on the second profiled step of a type: the first pays one-off work (NeuralDbg's structure
            # pass runs the model twice there)
            count = self.config.flops and self._profiled.get(step_type, 0) == 1
            self._current = _StepProfile(step, count)
            # parameters (and views of them, such as a Linear's weight.t()) are no activation memory
            self._current.storages.update(p.untyped_storage().data_ptr() for root in self._roots
                                          for p in root.parameters())

    def finish_step(self, step: int, step_type: str, writer: Any) -> None:
        """End the step: its process row, its profile (written once its device marks are ready)."""
        elapsed = time.perf_counter() - self._step_started
        profile, self._current = self._current, None
        if profile is not None:
            _unwind(profile)
            profile.release()
            self._profiled[step_type] = self._profiled.get(step_type, 0) + 1
            self._pending.append(profile)
        if self._decided:
            self.policy.commit(step, step_type, profile is not None)
            self._decided = False
        if (self._steps_seen - 1) % self.config.memory_every == 0:
            memory = self._memory or NoDeviceMemory()
            writer.add_process(step, np.array([elapsed, rss_bytes(), memory.allocated(), memory.peak(),
                                               float(profile is not None)]))
        self._write_ready(writer)

    def discard(self) -> None:
        """Drop the open step's profile (the recorder discarded the step)."""
        profile, self._current = self._current, None
        if profile is not None:
            _unwind(profile)
        self._decided = False

    def close(self, writer: Any) -> None:
        """Wait for the device marks of every pending profile and write them; remove the hooks."""
        self.remove()
        for profile in self._pending:  # backward marks may sit on another stream: wait for each
            for mark in profile.marks():
                self._clock.wait(mark)
        self._write_ready(writer, wait=True)

    def _write_ready(self, writer: Any, *, wait: bool = False) -> None:
        waiting = []
        for profile in self._pending:
            if wait or all(self._clock.ready(mark) for mark in profile.marks()):
                names, rows = self.rows(profile)
                if names:
                    writer.add_profile(profile.step, names, rows)
            else:
                waiting.append(profile)
        self._pending = waiting

    def rows(self, profile: _StepProfile) -> tuple[list[str], np.ndarray]:
        """Module names and rows of ``schema.PROFILE_FIELDS`` of a finished profile."""
        count = len(self.names)
        data = np.zeros((count, len(schema.PROFILE_FIELDS)))
        used = np.zeros(count, bool)
        seconds = self._clock.seconds
        inclusive = [seconds(start, end) if end is not None else None for _, start, end, _ in profile.calls]
        children = np.zeros(len(profile.calls))
        for k in reversed(range(len(profile.calls))):  # children come after their parent
            if inclusive[k] is None:  # cut short by an exception: only its finished children's time is known
                inclusive[k] = float(children[k])
            parent = profile.calls[k][3]
            if parent >= 0:
                children[parent] += inclusive[k]
        for k, (index, _, _, _) in enumerate(profile.calls):
            used[index] = True
            data[index, _F["calls"]] += 1
            data[index, _F["forward_inclusive"]] += inclusive[k]
            data[index, _F["forward_time"]] += inclusive[k] - children[k]
        for index, start, end in profile.spans:
            used[index] = True
            data[index, _F["backward_time"]] += seconds(start, end)
        for field, values in (("saved_bytes", profile.saved), ("allocated_delta", profile.allocated),
                              ("peak_delta", profile.peak), ("flops", profile.flops)):
            for index, value in values.items():
                data[index, _F[field]] = value
        if not self._memory.available:
            data[:, [_F["allocated_delta"], _F["peak_delta"]]] = math.nan
        if profile.saved_unknown or not self.config.saved_tensors:
            data[:, _F["saved_bytes"]] = math.nan
        if profile.count_flops:  # the FLOP counter's dispatch overhead distorts that step's times
            data[:, [_F["forward_time"], _F["forward_inclusive"], _F["backward_time"]]] = math.nan
        else:
            data[:, _F["flops"]] = math.nan
        chosen = np.flatnonzero(used)
        return [self.names[i] for i in chosen], data[chosen]


def _in_backward() -> bool:
    """Whether the autograd engine is running a backward pass on this thread (a checkpoint recomputes there)."""
    graph_id = getattr(torch._C, "_current_graph_task_id", None)
    return graph_id is not None and graph_id() != -1


def _other_saved_hooks() -> bool:
    """Whether saved-tensor hooks of someone else are active (or cannot be told): then the profiler pushes none,
    since the innermost hooks take every saved tensor and activation checkpointing depends on its own."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    return top is None or top(False) is not None


def _unpack(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def _unwind(profile: _StepProfile) -> None:
    """Leave the contexts the outermost call entered, innermost first (also after a forward that raised)."""
    while profile.contexts:
        profile.contexts.pop().__exit__(None, None, None)
    profile.stack.clear()

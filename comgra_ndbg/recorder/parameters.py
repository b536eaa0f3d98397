"""Tracked parameters: their values at the start of a step, fresh gradients, and updates (ΔW).

Gradients are taken only from parameters that received one since the last look (a hook on each
parameter, attached while steps are recorded and removed when one is skipped, marks them), so a step
without a backward pass never re-records the previous step's leftover gradient. A step's first take
returns ``.grad``, everything accumulated so far; later takes of the same step (one gradient set per loss)
return what the backward passes since the previous take added, which the same hook keeps from then on,
so a second set is not the sum of both. Updates are ``W_end - W_start`` of the step, from a copy taken at
its start (only on steps that record); on the host the copy is made in the same pass that summarises the
value, and the update is summarised from the parameter and the copy without materialising
``W_end - W_start``.

With ``on_gradient``, the hook hands each accumulated gradient to that callback at once instead of marking
it fresh: for loops that clear ``.grad`` (``optimizer.zero_grad()`` at the top) before the recorder gets to
read it, as ``NeuralDbg`` does. A caller that knows where each backward pass ends (``NeuralDbg``, from the
autograd engine's callback) sets :attr:`ParameterTracker.polled` instead: no hook per parameter (each one a
call from C++ into Python per parameter per backward pass), and ``changed_gradients`` reads every ``.grad``
that is not the one it read last (a weak reference, so a freed gradient whose address a new one reuses is
not taken for it) or that changed in place.
"""
from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

import numpy as np
import torch

from comgra_ndbg.recorder import native
from comgra_ndbg.recorder.grad_hook import dynamo_loaded, untraced
from comgra_ndbg.recorder.validation import summarizable
from comgra_ndbg.recorder.step_record import shared
from comgra_ndbg.stats import kernels
from comgra_ndbg.stats.host import lean_flags
from comgra_ndbg.stats.reducer import Reducer
from comgra_ndbg.store.catalog import Catalog, ModuleInfo, TensorInfo

__all__ = ["ParameterTracker", "optimizer_holds"]

_DATA_PTR, _STRIDE, _IS_NEG = torch.Tensor.data_ptr, torch.Tensor.stride, torch.Tensor.is_neg
_PLACE = attrgetter("shape", "dtype", "is_cpu")
_VERSION, _REQUIRES_GRAD, _DTYPE = attrgetter("_version"), attrgetter("requires_grad"), attrgetter("dtype")
_NUMEL = torch.Tensor.numel


@dataclass
class _Tracked:
    name: str
    parameter: torch.nn.Parameter
    tensor_id: int
    fresh: bool = False
    handed_over: bool = False  # its gradients go to an ``on_gradient`` callback, never through ``take_gradients``
    receiver: Callable[[int, torch.Tensor], None] | None = None  # that callback
    incoming: torch.Tensor | None = None  # what backward passes added since the step's first take
    handed: tuple[int, int] | None = None  # (id, version) of the ``.grad`` last handed over in this step
    seen: tuple[Any, int] | None = None  # (weak reference, version) of the ``.grad`` last read, ``polled``


@dataclass
class ParameterTracker:
    """The parameters of every module given to ``Recorder.track_module``."""

    catalog: Catalog
    tracked: list[_Tracked] = field(default_factory=list)
    modules: set[str] = field(default_factory=set)
    _buffers: list[torch.Tensor] | None = None
    _scratch: list[torch.Tensor] | None = None
    _layout: _HostLayout | None = None
    _layout_key: tuple[list, ...] | None = None
    _native_layout: Any = None  # ``_layout_key`` held and compared in C++ (``native.Layout``), when loaded
    _grad_arrays: tuple[np.ndarray, np.ndarray] | None = None  # addresses and sizes for the packed takes
    _poller: Any = None  # ``changed_gradients`` of a polled tracker in C++ (``native.Polled``), from a step's start
    _poller_stale = True  # parameters were tracked or replaced since the poller was built
    _captured: bool = False
    _versions: list[int] | None = None  # each parameter's version counter at ``capture()``
    _step_hooks: list[Any] = field(default_factory=list)
    _marks: Any = None  # the C++ marks (``native``) standing in for the Python hooks while watching, if loaded
    _marks_compiled: bool = False  # compiled autograd ran over the marks (it calls no C++ hook): Python hooks
    _watching: bool = False
    # tracked module -> its path; parameters assigned to one of them since the last ``resync`` (see ``track``)
    _owners: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary)
    _assigned: list[tuple[str, torch.nn.Parameter]] = field(default_factory=list)
    _registration: Any = None  # the handle of the global parameter-registration hook
    per_pass: bool = False  # the step's first take is done: the hooks keep what later passes add
    _marked: bool = False  # a hook marked a parameter fresh (or kept its pass's gradient) since the last take
    polled: bool = False  # handed-over gradients are read by ``changed_gradients``, with no hook (module doc)
    _handing_over: bool = False  # a parameter is tracked with ``on_gradient``
    _names: dict[str, torch.nn.Parameter] | None = None
    _params: list[torch.nn.Parameter] | None = None  # ``parameters()``, kept until ``track`` or ``close``
    _ids: list[int] | None = None  # ``tensor_ids()``, likewise
    # optimizer -> (its param groups' sizes, whether they hold a tracked parameter): ``holds``
    _holders: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary)

    def track(self, name: str, module: torch.nn.Module, *, node_suffix: str = "",
              on_gradient: Callable[[int, torch.Tensor], None] | None = None,
              node_prefixes: Sequence[str] = ()) -> list[tuple[str, ValueError]]:
        """Add every parameter of ``module`` as tensor ``name.<path>`` in node ``name.<owning module>`` (plus
        ``node_suffix``), or in node ``prefix`` for the first of ``node_prefixes`` that ``name.<path>``
        starts with. ``on_gradient(tensor id, grad)``, if given, receives each gradient as it is
        accumulated, and ``take_gradients`` no longer returns it. Returns the parameters left out, with why:
        those without readable values (on the meta device), which would fail every step's passes over the
        parameters and take the other tensors' rows with them."""
        self.modules.add(name)
        left_out = []
        for path, sub in module.named_modules():
            own = sum(p.numel() for p in sub.parameters(recurse=False))
            self.catalog.add_module(ModuleInfo(_join(name, path), type(sub).__name__, own))
            self._owners[sub] = _join(name, path)
        if self._registration is None:  # a parameter assigned later (a head re-initialised): ``resync``
            self._registration = torch.nn.modules.module.register_module_parameter_registration_hook(
                _note_assigned(weakref.ref(self)))
        for path, parameter in module.named_parameters():
            owner = _join(name, path.rpartition(".")[0])
            full = _join(name, path)
            try:
                summarizable(parameter)
            except ValueError as why:
                left_out.append((full, why))
                continue
            node = next((prefix for prefix in node_prefixes if full.startswith(prefix)), owner)
            tid = self.catalog.tensor_id(full)
            if tid is None:
                tid = self.catalog.add_tensor(TensorInfo(
                    name=full, node=node + node_suffix, role="parameter", module=owner,
                    dtype=str(parameter.dtype).replace("torch.", ""), shape=tuple(parameter.shape), batched=False))
            entry = _Tracked(full, parameter, tid, handed_over=on_gradient is not None, receiver=on_gradient)
            self._handing_over = self._handing_over or on_gradient is not None
            self._poller_stale = True
            self.tracked.append(entry)
            if self._watching:
                self._step_hooks += self._hooks_of([entry])
        self._buffers = None
        self._names = self._params = self._ids = None
        self._holders = weakref.WeakKeyDictionary()
        return left_out

    def resync(self) -> list[tuple[str, torch.nn.Parameter | None, torch.nn.Parameter]]:
        """Take the parameters assigned to tracked modules since the last call (``module.weight =
        nn.Parameter(...)``: a head re-initialised, a layer pruned or resized) in place of the ones they
        replaced, so that the recording follows the tensors the model uses; returns (name, old, new) of each,
        old None for a parameter the module did not have when it was tracked, which is not recorded (the
        step's rows and the tiers keep one row per tracked parameter). Called at the start of a step."""
        if not self._assigned:
            return []
        assigned, self._assigned = self._assigned, []
        by_name = {t.name: t for t in self.tracked}
        changed: list[tuple[str, torch.nn.Parameter | None, torch.nn.Parameter]] = []
        for full, parameter in assigned:
            entry = by_name.get(full)
            if entry is None:
                changed.append((full, None, parameter))
                continue
            if entry.parameter is parameter:
                continue
            try:
                summarizable(parameter)
            except ValueError:
                continue  # (moved to the meta device: the old tensor's rows stay the last)
            changed.append((full, entry.parameter, parameter))
            entry.parameter = parameter
            self._poller_stale = True
            entry.fresh, entry.incoming, entry.handed, entry.seen = False, None, None, None
        if any(old is not None for _, old, _ in changed):
            self._buffers = self._scratch = None
            self._layout = self._layout_key = self._native_layout = None
            self._captured = False
            self._names = self._params = self._ids = None
            self._holders = weakref.WeakKeyDictionary()
            if self._watching:
                self.unwatch()
                self.watch()
        return changed

    def watch(self) -> None:
        """Mark parameters that receive a gradient from now until ``unwatch()`` as fresh, and hand over the
        gradients of those tracked with ``on_gradient``.

        The hooks see each backward pass's gradient before it is accumulated into ``.grad`` (or, handing
        over, the accumulated ``.grad``); they stay attached from one recorded step to the next and are
        removed when a step is skipped, so a step the policies skip pays nothing for them in its backward
        pass.
        """
        if self._watching:
            return
        self._watching = True
        module = None if self._marks_compiled else native.taps_module()
        if module is not None:
            self._marks = module.Marks()
        self._step_hooks = self._hooks_of(self.tracked)
        if self._marks is not None and not self._marks.watched():  # every gradient is handed over or polled
            self._marks = None

    def _hooks_of(self, entries: list[_Tracked]) -> list[Any]:
        """Each entry's hook: the handover, else its mark (C++, in ``_marks``, when the module is loaded), else
        a Python hook that marks it."""
        marks, index = self._marks, {id(t): i for i, t in enumerate(self.tracked)} if self._marks else {}
        hooks = []
        for t in entries:
            if not t.parameter.requires_grad or (t.handed_over and self.polled):
                continue
            if t.handed_over:
                hand_over = _hand_over(t, t.receiver)  # (compiled autograd would trace it where dynamo is loaded)
                hooks.append(t.parameter.register_post_accumulate_grad_hook(untraced(hand_over) if dynamo_loaded()
                                                                            else hand_over))
            elif marks is None or not marks.watch(t.parameter, index[id(t)]):
                hooks.append(t.parameter.register_hook(_mark_fresh(t, self)))
        return hooks

    def unwatch(self) -> None:
        for handle in self._step_hooks:
            handle.remove()
        self._step_hooks = []
        if self._marks is not None:
            self._marks.unwatch()
            self._marks = None
        self._watching = False

    def names(self) -> dict[str, torch.nn.Parameter]:
        """Every tracked parameter by name (the same dict until ``track`` or ``close``; do not change it)."""
        if self._names is None:
            self._names = {t.name: t.parameter for t in self.tracked}
        return self._names

    def parameters(self) -> list[torch.nn.Parameter]:
        """Every tracked parameter, in ``tensor_ids()`` order (the same list until ``track`` or ``close``; do
        not change it)."""
        if self._params is None:
            self._params = [t.parameter for t in self.tracked]
        return self._params

    def values(self) -> list[tuple[int, torch.Tensor]]:
        """(tensor id, detached value) of every tracked parameter."""
        return [(t.tensor_id, t.parameter.detach()) for t in self.tracked]

    def holds(self, optimizer: Any) -> bool:
        """Whether ``optimizer``'s param groups hold a tracked parameter (cached while their sizes stay)."""
        return optimizer_holds(optimizer, lambda: {id(t.parameter) for t in self.tracked}, self._holders)

    def marks(self) -> list[tuple[int, int, bool]]:
        """(version counter, storage address, requires_grad) of every tracked parameter: what an in-place
        change, a replaced ``.data`` or a frozen layer moves (``tiers``)."""
        params = self.parameters()
        return list(zip(map(_VERSION, params), map(_DATA_PTR, params), map(_REQUIRES_GRAD, params)))

    def tensor_ids(self) -> list[int]:
        """The tensor ids of the tracked parameters, in the order of ``values()`` and ``capture()`` (the same
        list until ``track`` or ``close``; do not change it)."""
        if self._ids is None:
            self._ids = [t.tensor_id for t in self.tracked]
        return self._ids

    def capture(self, reducer: Reducer | None = None) -> Sequence[int]:
        """Copy every parameter now, so updates can be measured against this point.

        With ``reducer``, each value's summary is queued in the same pass as its copy (one read of the
        parameter on the host); returns the row indices of those summaries, in ``tensor_ids()`` order.
        Without, CPU parameters are copied with numpy (several times faster on the host than
        ``torch._foreach_copy_``), other devices with the fused foreach copy.
        """
        params = self.parameters()
        if not params:
            return []
        if self._buffers is None or not self._same_layout(params):
            self._buffers = [torch.empty_like(p, memory_format=torch.contiguous_format) for p in params]
            self._scratch = None
            self._layout_key, self._layout = _layout_key(params), _HostLayout.of(params, self._buffers)
            self._native_layout = _native_layout(params)
        self._captured = True
        self._versions = list(map(_VERSION, params))
        if reducer is not None:
            layout = self._layout if kernels.AVAILABLE else None
            if layout is not None:
                return reducer.add_addressed(layout.dtype, layout.addresses, layout.sizes, params,
                                             copies=layout.copies)
            return reducer.add_many(params, copies=self._buffers)
        params = [p.detach() for p in params]
        if _on_host(params):
            for buffer, param in zip(self._buffers, params):
                np.copyto(buffer.numpy(), param.numpy())
        else:
            torch._foreach_copy_(self._buffers, params)
        return []

    def summarize_values(self, reducer: Reducer) -> Sequence[int]:
        """Queue the summary of every parameter's value (no copy); returns the row indices, in
        ``tensor_ids()`` order. One kernel call by address while the parameters are where ``capture()`` last
        found them."""
        params = self.parameters()
        layout = self._layout if kernels.AVAILABLE else None
        if layout is not None and self._same_layout(params):
            return reducer.add_addressed(layout.dtype, layout.addresses, layout.sizes, params)
        return reducer.add_many([p.detach() for p in params])

    def summarize_with_gradients(self, reducer: Reducer, grads: list[torch.Tensor]) -> range | None:
        """Queue the summaries of every parameter's value and then of ``grads`` (one per tracked parameter, in
        ``tensor_ids()`` order) in one kernel call; returns their row indices, values first. None, and nothing
        queued, when that does not apply: no compiled kernels, no host layout (parameters on a device, of
        several dtypes, or never captured), parameters not where ``capture()`` last found them, or a gradient
        that is not a contiguous host array of its parameter's dtype and size. The caller then queues them
        apart."""
        layout = self._layout if kernels.AVAILABLE else None
        if layout is None or len(grads) != len(layout.size_list):
            return None
        params = self.parameters()
        if not self._same_layout(params):
            return None
        if (set(map(_DTYPE, grads)) != {params[0].dtype} or list(map(_NUMEL, grads)) != layout.size_list
                or not all(lean_flags(grads))):
            return None
        addresses = layout.addresses_twice
        addresses[len(grads):] = list(map(_DATA_PTR, grads))
        return reducer.add_addressed(layout.dtype, addresses, layout.sizes_twice, params + grads)

    def _same_layout(self, params: list[torch.nn.Parameter]) -> bool:
        """Whether ``params`` are where the last layout found them (``_layout_key`` unchanged)."""
        if self._native_layout is not None:
            return self._native_layout.same(params)
        return self._layout_key is not None and _layout_key(params) == self._layout_key

    @property
    def captured(self) -> bool:
        """Whether a copy taken by ``capture()`` awaits its updates."""
        return self._captured and self._buffers is not None

    def summarize_updates(self, reducer: Reducer) -> Sequence[int]:
        """Queue the summary of every ΔW since ``capture()`` without materialising it; returns the row
        indices, in ``tensor_ids()`` order."""
        if not self.captured:
            return []
        params = self.parameters()
        layout = self._layout if kernels.AVAILABLE else None
        if layout is not None and self._same_layout(params):  # no parameter moved during the step
            return reducer.add_addressed(layout.dtype, layout.addresses, layout.sizes, params,
                                         starts=self._buffers, start_addresses=layout.copies)
        return reducer.add_many(params, starts=self._buffers)

    def update_pairs(self) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
        """(tensor id, parameter now, its copy from ``capture()``) of every parameter, for snapshots of ΔW
        that need only a few of its elements; empty when nothing was captured."""
        if not self.captured:
            return []
        return [(t.tensor_id, t.parameter.detach(), b) for t, b in zip(self.tracked, self._buffers)]

    def update_mask(self) -> np.ndarray:
        """Which parameters have an update in this step, in ``tensor_ids()`` order: those that require grad
        and those that changed since ``capture()`` (a parameter updated by hand, an EMA copy). A frozen
        parameter that did not move has none: its all-zero ΔW would say nothing and look like a dead one."""
        params = self.parameters()
        if False not in list(map(_REQUIRES_GRAD, params)):  # the usual model: every parameter trains
            return shared(len(params), True)
        versions = self._versions or [None] * len(params)
        return np.array([p.requires_grad or p._version != version for p, version in zip(params, versions)], dtype=bool)

    def scratch(self) -> list[torch.Tensor]:
        """Buffers like the start-of-step copies, for updates computed in full (the sentinels of
        ``stats/sentinels.py``); allocated once per layout of the parameters."""
        if self._scratch is None:
            self._scratch = [torch.empty_like(b) for b in self._buffers]
        return self._scratch

    def release(self) -> None:
        """End the capture: the next updates need a new ``capture()``."""
        self._captured = False

    def has_fresh_gradients(self) -> bool:
        if self._marks is not None:
            return self._marks.has_fresh()
        return self._marked and any(t.fresh for t in self.tracked)

    def take_gradients(self) -> list[tuple[int, torch.Tensor]]:
        """(tensor id, gradient) of parameters that received one since the last call: ``.grad`` at the
        step's first call, the sum of the backward passes since the previous call after it."""
        out = []
        per_pass = self.per_pass
        if self._marks is not None:
            fresh, incoming = self._marks.take()
            tracked = self.tracked
            for i, kept in zip(fresh, incoming):
                t = tracked[i]
                grad = kept if per_pass else t.parameter.grad
                if grad is not None:
                    out.append((t.tensor_id, grad.detach() if grad.requires_grad else grad))
        if not self._marked:  # no Python hook marked a parameter since the last take
            self.per_pass = True
            return out
        self._marked = False
        for t in self.tracked:
            if t.fresh:
                grad = t.incoming if per_pass else t.parameter.grad
                if grad is not None:
                    out.append((t.tensor_id, grad.detach() if grad.requires_grad else grad))
            t.fresh = False
            t.incoming = None
        self.per_pass = True
        return out

    def take_gradients_packed(self) -> tuple[list[int], list[torch.Tensor], tuple[np.ndarray, ...] | None]:
        """``take_gradients`` as (tensor ids, gradients, packed): ``packed`` is ``(dtype, addresses, sizes)`` for
        ``Reducer.add_addressed`` when the C++ marks took every gradient and each is a lean host array of one
        float dtype (checked there, in one pass), else None."""
        marks = self._marks
        if marks is None or self._marked:
            gradients = self.take_gradients()
            return [tid for tid, _ in gradients], [grad for _, grad in gradients], None
        arrays = self._arrays()
        fresh, grads, code = marks.take_packed(*arrays)
        self.per_pass = True
        ids = self.tensor_ids()
        return ids if len(fresh) == len(ids) else [ids[i] for i in fresh], grads, _packed(code, len(grads), arrays)

    def _arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Addresses and sizes, room for every tracked parameter, for the C++ side's packed takes."""
        arrays = self._grad_arrays
        if arrays is None or len(arrays[0]) < len(self.tracked):
            arrays = self._grad_arrays = (np.zeros(len(self.tracked), np.int64), np.zeros(len(self.tracked), np.int64))
        return arrays

    def forget_gradients(self) -> None:
        """Start a step: earlier gradients are not its own, and its first take reads ``.grad`` (``polled``:
        the gradients there now are the ones ``changed_gradients`` passes over)."""
        polled = self.polled
        if self._marks is not None:
            if self._marks.compiled():  # compiled autograd called none of them: Python hooks from now on
                self._marks_compiled = True
                self.unwatch()
                self.watch()
            else:
                self._marks.forget()
        poller = self._polling() if polled else None
        if poller is not None:
            poller.forget()
        if not ((polled and poller is None) or self._marked or (self._handing_over and poller is None)):
            self.per_pass = self._marked = False  # no Python hook set anything to forget
            return
        for t in self.tracked:
            t.fresh = False
            t.incoming = None
            t.handed = None
            if polled and poller is None:
                grad = t.parameter.grad
                t.seen = None if grad is None else (weakref.ref(grad), grad._version)
        self.per_pass = self._marked = False

    def _polling(self) -> Any:
        """The C++ poller of the handed-over parameters, built again at a step's start after ``track`` or
        ``resync`` changed them; None without the module."""
        if self._poller_stale:
            module = native.taps_module()  # (while a background build runs: asked again at the next step)
            self._poller = None if module is None else module.Polled()
            if self._poller is not None:
                self._poller_stale = False
                for i, t in enumerate(self.tracked):
                    if t.handed_over:
                        self._poller.watch(t.parameter, i)
        return self._poller

    def changed_gradients_packed(self, *, unread: bool = False
                                 ) -> tuple[list[int], list[torch.Tensor], tuple[np.ndarray, ...] | None]:
        """``changed_gradients`` as (tensor ids, gradients, packed), ``packed`` as ``take_gradients_packed``
        gives it: ``(dtype, addresses, sizes)`` when the C++ poller read them and each is a lean host array of
        one float dtype, else None."""
        poller = self._poller if self.polled else None
        if poller is None:
            changed = self.changed_gradients(unread=unread)
            return [tid for tid, _ in changed], [grad for _, grad in changed], None
        arrays = self._arrays()
        index, grads, code = poller.changed(unread, False, *arrays)
        ids = self.tensor_ids()  # (the poller answers in the order it watches them: ascending)
        return ids if len(index) == len(ids) else [ids[i] for i in index], grads, _packed(code, len(grads), arrays)

    def changed_gradients(self, *, unread: bool = False, force: bool = False) -> list[tuple[int, torch.Tensor]]:
        """(tensor id, ``.grad``) of the handed-over parameters whose ``.grad`` was replaced or changed in
        place since a backward pass of this step handed it over (clipped, unscaled by a ``GradScaler``); each
        is marked handed over again. ``polled``: of those whose ``.grad`` is not the one read last, or changed
        in place since — what each backward pass accumulated, and what was done to it after; ``unread``
        only of those not read in this step yet (at its end a ``.grad`` zeroed in place is no gradient of
        it); ``force``: every handed-over ``.grad`` of a ``polled`` tracker, changed or not (a ``GradScaler``
        unscales in place without moving the version counter)."""
        if self.polled:
            if self._poller is not None:
                index, grads, _ = self._poller.changed(unread, force, *self._arrays())
                ids = self.tensor_ids()
                return [(ids[i], grad) for i, grad in zip(index, grads)]
            return _read_changed(self.tracked, unread, force)
        changed = []
        for t in self.tracked:
            grad = t.parameter.grad
            if t.handed is not None and grad is not None and (id(grad), grad._version) != t.handed:
                t.handed = (id(grad), grad._version)
                changed.append((t.tensor_id, grad.detach() if grad.requires_grad else grad))
        return changed

    def close(self) -> None:
        """Remove every hook this tracker added and drop the parameter references."""
        self.unwatch()
        self._poller, self._poller_stale = None, True
        if self._registration is not None:
            self._registration.remove()
            self._registration = None
        self._assigned.clear()
        self.tracked.clear()
        self._buffers = self._scratch = None
        self._names = self._params = self._ids = None


@dataclass(frozen=True)
class _HostLayout:
    """Where the kernels find every parameter and its start-of-step copy, when all of them are contiguous
    host arrays of one float dtype: computed once, reused while ``_layout_key`` stays the same."""

    dtype: np.dtype
    addresses: np.ndarray
    sizes: np.ndarray
    copies: np.ndarray
    size_list: list[int]  # ``sizes`` as ints
    sizes_twice: np.ndarray  # ``sizes`` twice over: the values, then the gradients
    addresses_twice: np.ndarray  # ``addresses``, then room for the gradients' (``summarize_with_gradients``)

    @staticmethod
    def of(params: list[torch.nn.Parameter], buffers: list[torch.Tensor]) -> _HostLayout | None:
        dtype = params[0].dtype
        if dtype not in (torch.float32, torch.float64) or not all(
                p.dtype == dtype and p.is_cpu and p.is_contiguous() and not p.is_neg() and p.numel() for p in params):
            return None
        sizes = np.array([p.numel() for p in params], dtype=np.int64)
        addresses = np.array([p.data_ptr() for p in params], dtype=np.int64)
        return _HostLayout(np.dtype(np.float32 if dtype == torch.float32 else np.float64), addresses, sizes,
                           np.array([b.data_ptr() for b in buffers], dtype=np.int64), sizes.tolist(),
                           np.concatenate((sizes, sizes)), np.concatenate((addresses, np.zeros_like(addresses))))


def optimizer_holds(optimizer: Any, ids: Callable[[], set[int]], cache: weakref.WeakKeyDictionary) -> bool:
    """Whether ``optimizer``'s param groups hold a parameter whose ``id`` is in ``ids()``; ``cache`` keeps the
    answer per optimizer while its groups keep their sizes, so a step pays one tuple of lengths."""
    key = tuple(len(group["params"]) for group in optimizer.param_groups)
    cached = cache.get(optimizer)
    if cached is None or cached[0] != key:
        wanted = ids()
        cached = (key, any(id(p) in wanted for group in optimizer.param_groups for p in group["params"]))
        cache[optimizer] = cached
    return cached[1]


def _note_assigned(tracker: Callable[[], ParameterTracker | None]) -> Callable[..., None]:
    """The global parameter-registration hook of a tracker (held weakly): notes a parameter assigned to a
    module it tracks, for ``resync`` at the next step; changes nothing."""
    def hook(module: torch.nn.Module, name: str, parameter: torch.nn.Parameter | None) -> None:
        owner = tracker()
        if owner is None or parameter is None:
            return
        path = owner._owners.get(module)
        if path is not None:
            owner._assigned.append((_join(path, name), parameter))
    return hook


def _layout_key(params: list[torch.nn.Parameter]) -> tuple[list, ...]:
    """What must stay the same for a cached layout (and the copies) to remain valid: a parameter whose
    ``.data`` was replaced, moved, cast, reshaped, re-strided or made a negative view changes it. Each
    property is read for all parameters in one C-level pass (no Python call per parameter): this runs
    twice per recorded step."""
    return (list(map(_DATA_PTR, params)), list(map(_STRIDE, params)), list(map(_IS_NEG, params)),
            list(map(_PLACE, params)))


def _packed(code: int, count: int, arrays: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, ...] | None:
    """``(dtype, addresses, sizes)`` of ``count`` gradients the C++ side packed into ``arrays`` with dtype
    ``code``, for ``Reducer.add_addressed``; None where it packed none (a refusal, or no gradient)."""
    if code < 0 or not count:
        return None
    return native.KERNEL_DTYPES[code], arrays[0][:count], arrays[1][:count]


def _native_layout(params: list[torch.nn.Parameter]) -> Any:
    """``_layout_key`` of ``params`` as the C++ ``Layout`` compares it, or None without the module (or for a
    tensor without strides)."""
    module = native.taps_module()
    if module is None:
        return None
    try:
        return module.Layout(params)
    except (ValueError, TypeError):
        return None


def _on_host(tensors: list[torch.Tensor]) -> bool:
    """Whether numpy can work on every tensor directly (CPU, a numpy dtype, no conjugate/negative view)."""
    return all(t.device.type == "cpu" and t.dtype in (torch.float32, torch.float64) for t in tensors)


def _read_changed(tracked: list[_Tracked], unread: bool, force: bool = False) -> list[tuple[int, torch.Tensor]]:
    """``changed_gradients`` of a ``polled`` tracker: every read gradient is remembered as read. A parameter
    that does not require grad is passed over: no backward pass writes its ``.grad``, so what it holds is left
    from before it was frozen (zeroed in place by ``zero_grad(set_to_none=False)`` at every step), not a
    gradient of the step."""
    changed = []
    for t in tracked:
        if not t.handed_over or (unread and t.handed is not None) or not t.parameter.requires_grad:
            continue
        grad = t.parameter.grad
        if grad is None:
            continue
        seen, version = t.seen, grad._version
        if not force and seen is not None and seen[1] == version and seen[0]() is grad:
            continue
        t.seen, t.handed = (weakref.ref(grad), version), (id(grad), version)
        changed.append((t.tensor_id, grad.detach() if grad.requires_grad else grad))
    return changed


def _mark_fresh(entry: _Tracked, tracker: ParameterTracker) -> Any:
    def hook(grad: torch.Tensor) -> None:
        entry.fresh = True
        tracker._marked = True
        if tracker.per_pass:  # a later gradient set: keep this pass's own gradient (never changed in place)
            grad = grad.detach()
            entry.incoming = grad if entry.incoming is None else entry.incoming + grad

    return hook


def _hand_over(entry: _Tracked, on_gradient: Callable[[int, torch.Tensor], None]) -> Any:
    def hook(parameter: torch.Tensor) -> None:
        grad = parameter.grad
        if grad is not None:
            entry.handed = (id(grad), grad._version)
            on_gradient(entry.tensor_id, grad)

    return hook


def _join(prefix: str, path: str) -> str:
    return f"{prefix}.{path}" if path else prefix

"""Registering tensors in a step: validation at the call, the catalog entry, summary and snapshot, the
gradient hook (a mixin of ``Recorder``).

``register_tensor`` is the hot path: a known name costs a dict lookup and a fused reduction; the checks that
need more (names the file cannot hold, roles, nodes) run when a name is new. A tensor that cannot be
summarised (on the meta device, nested) is skipped alone and logged (``faults``).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from comgra_ndbg.errors import ComgraError, DuplicateTensorError, InvalidArgumentError, InvalidTensorError
from comgra_ndbg.graph import TensorEdge
from comgra_ndbg.recorder.plan import RegistrationPlan, make_plan, same_summary, work_tensor
from comgra_ndbg.recorder.snapshot import DeferredSnapshot
from comgra_ndbg.recorder.validation import check_bounds, check_name, summarizable
from comgra_ndbg.stats.bounds import saturation_bounds
from comgra_ndbg.store import schema
from comgra_ndbg.store.catalog import TensorInfo

__all__ = ["TensorRegistration", "AUTO"]

AUTO = "auto"


class TensorRegistration:
    """``register_tensor`` and ``add_dependency`` of ``Recorder``; not used on its own."""

    def register_tensor(
        self,
        name: str,
        tensor: torch.Tensor,
        *,
        role: str = "intermediate",
        node: str | None = None,
        batched: bool | None = None,
        bounds: tuple[float, float] | None | str = AUTO,
        module: str = "",
    ) -> torch.Tensor:
        """Record ``tensor`` under ``name`` in the current iteration; returns ``tensor`` unchanged.

        ``role`` is one of input, target, output, loss, parameter, intermediate. ``node`` groups several
        tensors into one graph node (default: the name). ``batched`` says whether dim 0 is the batch
        (default: yes if dim 0 matches the step's batch size, set by the first batched tensor). ``bounds``
        is the activation's output range for saturation statistics (default: known for tanh, sigmoid and
        softmax outputs; None for no saturation statistics). ``module`` is the path of the module that
        produced the tensor, if any. Its gradient is recorded, through a hook, when it requires one.
        """
        if not self.enabled:
            return tensor
        if not self._step_open:
            self._check_step_open(f"register_tensor({name!r})")
        plan = self._plans.get(name) if type(name) is str and bounds is AUTO else None
        if (plan is not None and self._summarize and not self._deferring and name not in self._names
                and plan.call == (role, node, batched, module)):
            if plan.view is not None and self._batch_size == plan.batch_before:
                last = self._last_viewed
                if (last is not None and tensor is last[0] and last[3] == self._iteration and not self._snapshot
                        and same_summary(plan, last[2]) and tensor._version == last[1]):
                    self._register_again(name, tensor, plan, last)
                    return tensor
                host = plan.view.view(tensor)  # ``plan.fits`` and the kernels' array, in C++
                if host is not None:
                    self._register_planned(name, tensor, plan, host)
                    return tensor
            if (isinstance(tensor, torch.Tensor) and not tensor.is_nested
                    and plan.key == (type(tensor.grad_fn), tensor.requires_grad, tensor.dtype, tensor.shape,
                                     self._batch_size, tensor.is_cpu, tensor.layout)
                    and (plan.convert or (tensor.is_contiguous() and not tensor.is_neg()))):  # ``plan.fits``, inline
                self._register_planned(name, tensor, plan)
                return tensor
        if not isinstance(tensor, torch.Tensor):
            raise InvalidTensorError(f"register_tensor({name!r}, ...) needs a torch.Tensor, got "
                                     f"{type(tensor).__name__}; convert it with torch.as_tensor(...) first")
        if not isinstance(name, str) or name not in self._known_tensors:
            check_name(name, "tensor names")
        if name in self._names:
            raise DuplicateTensorError(
                f"tensor {name!r} was already registered in iteration {self._iteration} of step {self._step}; "
                f"give each tensor its own name, or call start_iteration() between forward passes")
        if role not in schema.ROLES:
            raise InvalidArgumentError(f"role of {name!r} must be one of {list(schema.ROLES)}, got {role!r}")
        if bounds is not None and not (isinstance(bounds, str) and bounds == AUTO):
            bounds = check_bounds(name, bounds)
        self._step_names.add(name)
        if not (self._summarize or self._snapshot):
            self._names.add(name)
            return tensor
        self._names.add(name)
        try:
            self._record_tensor(name, tensor, role, node, batched, bounds, module)
        except ComgraError:
            self._names.discard(name)
            raise
        except Exception as error:  # a recorder problem must not break the training run
            self._skipped(name, "value", error)
        return tensor

    def _register_planned(self, name: str, tensor: torch.Tensor, plan: RegistrationPlan,
                          host: np.ndarray | None = None) -> None:
        """``register_tensor`` on a summary step along ``plan``: what ``_record_tensor`` does for a host tensor,
        without the decisions the plan holds (its snapshot too, on a snapshot step whose type is known).
        ``host``: the array the kernels read, from the plan's C++ view."""
        self._names.add(name)
        self._step_names.add(name)
        if plan.batch and self._batch_size is None:
            self._batch_size = plan.batch
        iteration = self._iteration
        try:
            if host is not None:
                row = self._reducer.add_viewed(host, plan.batch, plan.thresholds, plan.kernel)
            else:
                row = self._reducer.add_planned(work_tensor(tensor, plan) if plan.convert else tensor,
                                               plan.batch, plan.thresholds, plan.kernel, plan.work_dtype)
        except Exception as error:  # a recorder problem must not break the training run
            self._skipped(name, "value", error)
            return
        self._value_keys.append((plan.series_id, iteration, row))
        if host is not None:
            self._last_viewed = (tensor, tensor._version, plan, iteration, row)
        if self._snapshot:
            try:
                self._snaps.append((plan.series_id, iteration, self._take(tensor, plan.batched, plan.bounds)))
            except Exception as error:  # a recorder problem must not break the training run
                self._skipped(name, "value", error)
        structure = self._structure  # ``structure.add`` with the plan's key, inline: this runs for every tensor
        output_nr = tensor.output_nr
        structure.registered.append((name, iteration, tensor, (tensor.grad_fn, output_nr)))
        structure.keys.append((name, iteration, plan.structure_key, output_nr))
        structure.pending = True
        if plan.requires_grad:
            taps = self._taps  # ``_hook_gradient``'s C++ tap, inline; anything else goes through it
            if (taps is not None and plan.deferred and not self._taps_compiled
                    and taps.tap(tensor, len(self._tap_keys), plan.batched)):
                self._tap_keys.append(((plan.tensor_id, iteration), plan.batched))
            else:
                self._hook_gradient(tensor, plan.tensor_id, iteration, plan.batched, plan.deferred)

    def _register_again(self, name: str, tensor: torch.Tensor, plan: RegistrationPlan,
                        last: tuple[torch.Tensor, int, RegistrationPlan, int, int]) -> None:
        """``_register_planned`` of the tensor the last planned registration of this iteration summarised,
        unchanged since, under a plan that summarises it alike (``same_summary``): its value row is that
        registration's row, and its gradient's row will be too (``_grad_aliases``), in place of computing
        both again."""
        _, _, first, iteration, row = last
        self._names.add(name)
        self._step_names.add(name)
        self._value_keys.append((plan.series_id, iteration, row))
        self._structure.add(name, iteration, tensor, plan.structure_key)
        if plan.requires_grad:
            self._grad_aliases.append(((first.tensor_id, iteration), (plan.tensor_id, iteration)))

    def _record_tensor(self, name: str, tensor: torch.Tensor, role: str, node: str | None, batched: bool | None,
                       bounds: Any, module: str = "") -> None:
        call = (role, node, batched, module) if bounds is AUTO else None
        batch_before = self._batch_size
        known = self._known_tensors.get(name)
        if known is None or known[1] != (node or name):
            for text, what in ((node, "node names"), (module, "module paths")):
                if text:
                    check_name(text, what)
        tensor = summarizable(tensor)
        if batched is None:
            batched = (role != "parameter" and tensor.dim() >= 1
                       and (self._batch_size is None or tensor.shape[0] == self._batch_size))
        if batched and self._batch_size is None and tensor.dim() >= 1:
            self._batch_size = int(tensor.shape[0])
        if isinstance(bounds, str):
            bounds = saturation_bounds(tensor)
        node = node or name
        if known is None or known[0] != role or known[1] != node:
            tid = self._tensor_id(name, tensor, role, node, bool(batched), bounds, module)
            known = self._known_tensors[name] = (role, node, tid, self.catalog.series_id(tid, schema.KIND_VALUE))
        tid, sid = known[2], known[3]
        iteration = self._iteration
        if self._summarize:
            self._value_keys.append((sid, iteration, self._reducer.add(tensor, batched=bool(batched), bounds=bounds)))
        if self._snapshot:
            if self._deferring and batched:
                self._deferred_values.append(DeferredSnapshot(sid, iteration, tensor.detach().clone(), True, bounds))
            else:
                self._snaps.append((sid, iteration, self._take(tensor, bool(batched), bounds)))
        self._structure.add(name, iteration, tensor)
        deferred = not _compiled_region(tensor)
        if tensor.requires_grad:
            self._hook_gradient(tensor, tid, iteration, bool(batched), deferred)
        plan = None if call is None else make_plan(
            call, tensor, batch_before=batch_before, batched=bool(batched), bounds=bounds,
            saturation_margin=self._saturation_margin, tensor_id=tid, series_id=sid, deferred=deferred)
        if plan is None:
            self._plans.pop(name, None)
        else:
            self._plans[name] = plan

    def add_dependency(self, source: str, target: str, *, source_iteration: int | None = None,
                       target_iteration: int | None = None, discovered: bool = False) -> None:
        """Declare that ``target`` depends on ``source`` where autograd cannot see it (a detach, integer
        indices, a non-differentiable step). Both are tensor names; iterations default to the current one.
        ``discovered=True`` marks an edge that autograd did show, elsewhere (an eager pass over a compiled
        model): it counts as a forward edge, not a manual one.
        """
        if not self.enabled:
            return
        self._check_step_open(f"add_dependency({source!r}, {target!r})")
        for name in (source, target):
            check_name(name, "tensor names")
            if name not in self._step_names and self.catalog.tensor_id(name) is None:
                raise InvalidArgumentError(
                    f"add_dependency({source!r}, {target!r}): no tensor {name!r} was registered in this trial; "
                    f"register both tensors (register_tensor or track_module) before connecting them")
        iterations = [self._iteration if i is None else i for i in (source_iteration, target_iteration)]
        if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in iterations):
            raise InvalidArgumentError(f"iterations of add_dependency({source!r}, {target!r}) must be ints >= 0")
        if source == target and iterations[0] == iterations[1]:
            raise InvalidArgumentError(f"add_dependency({source!r}, {target!r}) connects a tensor to itself; connect "
                                       f"two tensors, or a tensor to itself in another iteration (source_iteration=, "
                                       f"target_iteration=)")
        self._structure.add_edge(TensorEdge(source, target, iterations[0], iterations[1]), discovered=discovered)

    def registered_node(self, grad_fn: object) -> str | None:
        """The node of the tensor registered in the open step that the autograd node ``grad_fn`` produced
        (as it was when registered), or None: puts a name on a node of the step's autograd graph before the
        backward pass discovers the dependency graph."""
        name = self._structure.name_of(grad_fn)
        tid = None if name is None else self.catalog.tensor_id(name)
        return None if tid is None else self.catalog.tensors[tid].node

    def _declare_all_edges(self) -> None:
        """This step's edges all come through ``add_dependency`` (NeuralDbg's eager pass over a partly
        compiled model): walking autograd would add shortcuts across the compiled region, whose backward is
        one opaque node."""
        self._structure.autograd = False

    def _tensor_id(self, name: str, tensor: torch.Tensor, role: str, node: str, batched: bool,
                   bounds: tuple[float, float] | None, module: str = "") -> int:
        tid = self.catalog.tensor_id(name)
        if tid is None:
            return self.catalog.add_tensor(TensorInfo(
                name=name, node=node, role=role, module=module, dtype=str(tensor.dtype).replace("torch.", ""),
                shape=tuple(tensor.shape), batched=batched, bounds=bounds))
        info = self.catalog.tensors[tid]
        if info.role != role or info.node != node:
            raise InvalidArgumentError(
                f"tensor {name!r} was first registered with role {info.role!r} in node {info.node!r}, now with role "
                f"{role!r} in node {node!r}; keep one role and node per name (or use a new name)")
        return tid


def _compiled_region(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` comes out of a ``torch.compile`` region, whose backward may write into the buffer
    of the gradient it receives (so that gradient must be summarised inside its hook)."""
    return tensor.grad_fn is not None and "CompiledFunction" in type(tensor.grad_fn).__name__

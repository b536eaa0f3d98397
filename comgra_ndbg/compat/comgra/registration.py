"""Comgra's tensor registration on the Recorder: names, roles, nodes, iterations and manual connections.

``Registrations`` is a mixin of ``ComgraRecorder`` and works on its step state. A Comgra registration
``(tensor_name, node_name, role_within_node)`` becomes a Recorder tensor in node ``node_name`` (default:
the tensor's name) whose label in that node is Comgra's role: the tensor is named ``tensor_name`` when no
role is given (Comgra's role is then the tensor's name), and ``node_name.role_within_node`` otherwise, so
``helper_partial_sums.final`` is the same series in every step however many iterations led to it, as
Comgra keys it.

As Comgra does, registering a floating-point tensor that does not require a gradient sets its
``requires_grad`` (only on steps that record), so that its gradient and its links in the dependency
graph exist; the parameters' gradients and the training are unchanged by it.
"""
from __future__ import annotations

from typing import Any

import torch

from comgra_ndbg.compat.comgra.checks import RECORDING_TYPES, check_tensor_name
from comgra_ndbg.errors import DuplicateTensorError, InvalidArgumentError, InvalidTensorError, RecorderStateError

__all__ = ["Registrations"]

_ROLES = ("input", "parameter", "target", "loss", "output")  # of is_input, is_parameter, ... is_output


class _Registered:
    """One registration of the open step: the Recorder's name, node, Comgra role and iterations."""

    __slots__ = ("tensor", "name", "node", "role", "iteration", "batched", "kind")

    def __init__(self, tensor: torch.Tensor, name: str, node: str, role: str, iteration: int, batched: bool,
                 kind: str) -> None:
        self.tensor, self.name, self.node, self.role = tensor, name, node, role
        self.iteration, self.batched, self.kind = iteration, batched, kind


class Registrations:
    """``register_tensor``, ``add_tensor_connection`` and ``detach_while_keeping_connection`` of
    ``ComgraRecorder`` (see the module docstring); not used on its own."""

    def _reset_step(self) -> None:
        self._recording = False
        self._offset = 0  # Recorder iteration = Comgra iteration + offset (1 once initial values came first)
        self._initial_values = False
        self._gradient_sets: list[str] = []
        self._by_tensor: dict[int, list[_Registered]] = {}  # id(tensor) -> its registrations in this step
        self._by_name: dict[str, _Registered] = {}  # Comgra tensor name -> its latest registration
        self._names: set[tuple[str, int]] = set()  # (Comgra tensor name, Comgra iteration)
        self._roles: set[tuple[str, str, int]] = set()  # (node, role, Comgra iteration)

    def register_tensor(self, tensor_name: str, tensor: torch.Tensor, index_of_batch_dimension: int | None = 0,
                        is_input: bool = False, is_parameter: bool = False, is_target: bool = False,
                        is_loss: bool = False, recording_type: str | None = None,
                        record_per_batch_index: bool | None = None, node_name: str | None = None,
                        role_within_node: str | None = None, is_initial_value: bool = False,
                        is_output: bool = False) -> None:
        """Record ``tensor`` in the current iteration (or, with ``is_initial_value=True`` before the first
        ``start_iteration()``, as a state's initial value). The ``is_*`` flags give its role (at most one;
        ``is_output`` is not in Comgra 0.11.5); ``node_name`` and ``role_within_node`` put several tensors
        into one node, each under its role."""
        if not self._recording:
            return
        check_tensor_name(tensor_name, node_name)
        if not isinstance(tensor, torch.Tensor):
            raise InvalidTensorError(f"register_tensor({tensor_name!r}, ...) needs a torch.Tensor, got "
                                     f"{type(tensor).__name__}")
        flags = [role for on, role in zip((is_input, is_parameter, is_target, is_loss, is_output), _ROLES) if on]
        if len(flags) > 1:
            raise InvalidArgumentError(f"register_tensor({tensor_name!r}): at most one of is_input, is_parameter, "
                                       f"is_target, is_loss and is_output may be True, got {flags}")
        role = flags[0] if flags else "intermediate"
        iteration = self._comgra_iteration(tensor_name, is_initial_value, is_parameter)
        batched = self._batched(tensor_name, tensor, role, index_of_batch_dimension, recording_type,
                                record_per_batch_index)
        node = node_name or tensor_name
        label = tensor_name if role_within_node is None else role_within_node
        if not isinstance(label, str) or not label:
            raise InvalidArgumentError(f"register_tensor({tensor_name!r}): role_within_node must be a non-empty str, "
                                       f"got {role_within_node!r}")
        if (tensor_name, iteration) in self._names:
            raise DuplicateTensorError(f"register_tensor({tensor_name!r}) twice in iteration {iteration} of step "
                                       f"{self.training_step}; give your tensors unique names per iteration")
        if (node, label, iteration) in self._roles:
            raise DuplicateTensorError(f"register_tensor({tensor_name!r}): node {node!r} already has a tensor with the "
                                       f"role {label!r} in iteration {iteration} of step {self.training_step}; give "
                                       f"each tensor of a node its own role_within_node")
        name = tensor_name if role_within_node is None else f"{node}.{role_within_node}"
        self._record(tensor, name, node, label, role, batched, tensor_name, iteration)
        if is_initial_value:
            self._initial_values = True

    def _comgra_iteration(self, tensor_name: str, is_initial_value: bool, is_parameter: bool) -> int:
        if is_initial_value:
            if self.iteration is not None:
                raise RecorderStateError(f"register_tensor({tensor_name!r}, is_initial_value=True) after "
                                         f"start_iteration(); register initial values after start_batch() and before "
                                         f"the first start_iteration()")
            return -1
        if self.iteration is None and not is_parameter:
            raise RecorderStateError(f"register_tensor({tensor_name!r}) before start_iteration(); call "
                                     f"start_iteration() first, or pass is_initial_value=True for a state's initial "
                                     f"value")
        return -1 if self.iteration is None else self.iteration

    def _batched(self, tensor_name: str, tensor: torch.Tensor, role: str, index: int | None,
                 recording_type: str | None, per_sample: bool | None) -> bool:
        """Whether the Recorder sees dim 0 as the batch; checks the batch dimension as Comgra does."""
        if recording_type is not None and recording_type not in RECORDING_TYPES:
            raise InvalidArgumentError(f"register_tensor({tensor_name!r}): recording_type must be None or one of "
                                       f"{list(RECORDING_TYPES)}, got {recording_type!r}")
        if role in ("loss", "parameter"):
            return False
        if recording_type in ("kpis", "kpis_and_svd"):
            self._warner.once(f"recording_type {recording_type}", f"recording_type={recording_type!r} has no "
                                                                  f"equivalent: snapshots keep element values too "
                                                                  f"(and no singular values are computed)")
        if index is None:
            if per_sample:
                raise InvalidArgumentError(f"register_tensor({tensor_name!r}): record_per_batch_index=True needs a "
                                           f"batch dimension, but index_of_batch_dimension is None")
            return False
        if recording_type == "single_value":
            raise InvalidArgumentError(f"register_tensor({tensor_name!r}): recording_type='single_value' is for "
                                       f"tensors without a batch dimension; pass index_of_batch_dimension=None")
        if isinstance(index, bool) or not isinstance(index, int) or not -tensor.dim() <= index < tensor.dim():
            raise InvalidArgumentError(f"register_tensor({tensor_name!r}): index_of_batch_dimension must be a "
                                       f"dimension of shape {tuple(tensor.shape)} (an int from {-tensor.dim()} to "
                                       f"{tensor.dim() - 1}), got {index!r}")
        if tensor.shape[index] != self.current_batch_size:
            raise InvalidArgumentError(f"register_tensor({tensor_name!r}): dimension {index!r} of shape "
                                       f"{tuple(tensor.shape)} must be the batch of {self.current_batch_size} "
                                       f"samples that start_batch() announced")
        index %= tensor.dim()  # a negative index, as Comgra takes it (the batch checked on tensor.shape[index])
        if per_sample is False:
            self._warner.once("per_sample", "record_per_batch_index=False has no equivalent: snapshots keep the values "
                                            "of the first max_num_batch_size_to_record samples of every batched "
                                            "tensor")
        if index != 0:
            self._warner.once("batch_index", "index_of_batch_dimension other than 0 has no equivalent: such a tensor "
                                             "is recorded as a whole, without per-sample statistics")
            return False
        return True

    def _record(self, tensor: torch.Tensor, name: str, node: str, label: str, role: str, batched: bool,
                tensor_name: str, iteration: int) -> None:
        if not tensor.requires_grad and (tensor.is_floating_point() or tensor.is_complex()):
            try:
                tensor.requires_grad_(True)
            except RuntimeError:  # an inference-mode tensor: recorded without its gradient
                pass
        self._names.add((tensor_name, iteration))
        self._roles.add((node, label, iteration))
        ours = 0 if self.iteration is None else self.iteration + self._offset  # the Recorder's current iteration
        self.recorder.register_tensor(name, tensor, role=role, node=node, batched=batched)
        entry = _Registered(tensor, name, node, label, ours, batched, role)
        self._by_tensor.setdefault(id(tensor), []).append(entry)
        self._by_name[tensor_name] = entry

    # ---- connections -------------------------------------------------------------------------------------
    def add_tensor_connection(self, src: Any, sink: Any) -> None:
        """Declare that ``sink`` depends on ``src`` where autograd does not show it (a ``detach()``, a
        non-differentiable step). Each is a registered tensor, or the name of one (its latest iteration)."""
        if not self._recording:
            return
        source, target = self._find(src, "src"), self._find(sink, "sink")
        if source is None or target is None:
            self._warner.once("connection", "add_tensor_connection() to or from a tensor that was not registered has "
                                            "no equivalent: the connection is not recorded (register both tensors)")
            return
        if source is target:
            raise InvalidArgumentError(f"add_tensor_connection: src and sink are the same tensor {source.name!r}")
        self.recorder.add_dependency(source.name, target.name, source_iteration=source.iteration,
                                     target_iteration=target.iteration)

    def _find(self, obj: Any, which: str) -> _Registered | None:
        if isinstance(obj, str):
            found = self._by_name.get(obj)
            if found is None:
                raise InvalidArgumentError(f"add_tensor_connection: there is no tensor named {obj!r} for the {which} "
                                           f"in step {self.training_step}; register it first")
            return found
        if isinstance(obj, torch.Tensor):
            entries = self._by_tensor.get(id(obj))
            return entries[-1] if entries and entries[-1].tensor is obj else None
        if hasattr(obj, "tensor_name"):  # a Comgra TensorReference
            return self._find(obj.tensor_name, which)
        raise InvalidTensorError(f"add_tensor_connection: the {which} must be a tensor, the name of a registered "
                                 f"tensor or a TensorReference, got {type(obj).__name__}")

    def detach_while_keeping_connection(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor.detach()`` that requires a gradient, still linked to ``tensor`` in the dependency graph: the
        copy is recorded in ``tensor``'s node as role ``<role>__detached``, so what is computed from it
        depends on that node (for truncated backpropagation through time)."""
        result = tensor.detach()
        if result.is_floating_point() or result.is_complex():
            result.requires_grad = True
        if not self._recording:
            return result
        source = self._find(tensor, "src")
        if source is None:
            self._warner.once("connection", "add_tensor_connection() to or from a tensor that was not registered has "
                                            "no equivalent: the connection is not recorded (register both tensors)")
            return result
        label = f"{source.role}__detached"
        iteration = -1 if self.iteration is None else self.iteration
        count = sum(1 for node, role, it in self._roles if node == source.node and role.startswith(label)
                    and it == iteration)
        label = label if not count else f"{label}_{count + 1}"
        self._record(result, f"{source.node}.{label}", source.node, label, source.kind, source.batched,
                     f"{source.name}*{label}", iteration)
        target = self._by_tensor[id(result)][-1]
        self.recorder.add_dependency(source.name, target.name, source_iteration=source.iteration,
                                     target_iteration=target.iteration)
        return result

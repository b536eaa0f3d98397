"""Registration plans: what the first registration of a tensor name decided, reused while nothing changes.

A training loop registers the same names with the same arguments and tensors of the same kind at every
step. The general path of ``register_tensor`` validates the call, looks the name up in the catalog,
resolves ``batched`` and ``bounds`` and picks the reducer's route, which costs several times the summary
of a small activation. The first registration of a name on a step that summarises leaves a
:class:`RegistrationPlan`; later ones take the planned route when the call's arguments are the same and
the tensor matches the plan's signature: the same autograd node type (the saturation bounds and whether it
comes out of a compiled region follow from it), whether it requires grad, dtype and shape, a host tensor,
and the step's batch size as it was. Only calls with the default ``bounds`` are planned. Anything else takes
the general path, which makes a new plan.

The kernels read contiguous float32/float64 memory in place. A host tensor they cannot read so — integer
class targets and token ids, half precision, a transposed or otherwise strided view (attention heads
moved back), a lazily negated view — is planned as converting: it is summarised from its work view
(``stats.exact.work_view``: float64 for integers, float32 for half precision, contiguous), the very array
the general path hands the kernels, so both record the same row.

Where the recorder's C++ part is loaded (``recorder/native``), a plan also carries a ``HostView`` of its
tensor: one call checks a later tensor against the signature and returns the array the kernels read (a
float64 copy for integers and booleans), in place of the checks and conversions above; what it refuses
takes them.

>>> import torch
>>> x = torch.tanh(torch.ones(4, 3, requires_grad=True))
>>> plan = make_plan(("intermediate", None, None, ""), x, batch_before=None, batched=True,
...                  bounds=(-1.0, 1.0), saturation_margin=0.005, tensor_id=3, series_id=7, deferred=True)
>>> plan.batch, [round(t, 4) for t in plan.thresholds.tolist()], fits(plan, torch.tanh(torch.zeros(4, 3)), None)
(4, [-0.99, 0.99], False)
>>> fits(plan, torch.tanh(torch.zeros(4, 3, requires_grad=True)), None)
True
>>> targets = make_plan(("target", None, None, ""), torch.arange(4), batch_before=4, batched=True, bounds=None,
...                     saturation_margin=0.005, tensor_id=4, series_id=8, deferred=True)
>>> targets.convert, fits(targets, torch.arange(4), 4), fits(plan, torch.tanh(torch.ones(3, 4)).t(), None)
(True, True, False)
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch

from comgra_ndbg.recorder import native
from comgra_ndbg.stats import kernels
from comgra_ndbg.stats.bounds import saturation_thresholds
from comgra_ndbg.stats.exact import work_view
from comgra_ndbg.stats.host import NUMPY_DTYPE, lean

_WORK_DTYPE = np.dtype(np.float64)  # what ``work_view`` turns integers and booleans into
_HALF_DTYPE = np.dtype(np.float32)  # ... and half-precision floats

__all__ = ["RegistrationPlan", "make_plan", "fits", "plan_key", "same_summary", "work_tensor"]


class RegistrationPlan(NamedTuple):
    """The decisions of one name's registration and the signature under which they hold."""

    call: tuple[Any, ...]  # (role, node, batched, module) as register_tensor received them
    key: tuple[Any, ...]  # ``plan_key`` of the tensor it was made from: later tensors must match it
    requires_grad: bool
    batch_before: int | None  # the step's batch size when the name was registered
    batched: bool
    batch: int  # rows of the [batch, units] view the kernels read (0: batch-less)
    thresholds: np.ndarray | None  # the saturation thresholds of the resolved bounds, margin applied
    tensor_id: int
    series_id: int  # the value series
    deferred: bool  # its gradient is summarised when the backward pass ends (not a compiled region's)
    convert: bool  # summarised from its work view, not in place (see the module docstring)
    bounds: tuple[float, float] | None  # the resolved saturation bounds (per-sample statistics of snapshots)
    work_dtype: np.dtype  # the dtype of the array the kernel reads (the tensor's, or its work view's)
    kernel: Any  # ``kernels.summary_entry`` of that dtype, with or without thresholds
    structure_key: tuple[Any, ...]  # (ndim, dtype, requires_grad, grad_fn type): ``graph.cache.registration_key``
    view: Any = None  # the C++ ``HostView`` (``recorder/native``): ``fits`` and the kernels' array in one call
    summary_key: tuple[Any, ...] = ()  # what the value row and the gradient's route depend on (``same_summary``)


def plan_key(tensor: torch.Tensor, batch_size: int | None) -> tuple[Any, ...]:
    """What a plan's decisions rest on besides the call's arguments, read from ``tensor`` (not a nested
    tensor, which has no shape) registered while the step's batch size is ``batch_size``: the producing
    autograd function's type, whether it requires grad, dtype, shape, the batch size, and that it is a
    strided host tensor. ``register_tensor`` builds this very tuple inline on its hot path (and checks the
    rest as ``fits`` does)."""
    return (type(tensor.grad_fn), tensor.requires_grad, tensor.dtype, tensor.shape, batch_size, tensor.is_cpu,
            tensor.layout)


def make_plan(call: tuple[Any, ...], tensor: torch.Tensor, *, batch_before: int | None, batched: bool,
              bounds: tuple[float, float] | None, saturation_margin: float, tensor_id: int, series_id: int,
              deferred: bool) -> RegistrationPlan | None:
    """The plan of a registration that summarised ``tensor`` with these decisions, or None when the tensor is
    not one the planned route summarises (not a non-empty strided real host tensor)."""
    if (not kernels.AVAILABLE or not tensor.is_cpu or tensor.layout is not torch.strided or tensor.is_nested
            or tensor.is_complex() or tensor.is_conj() or tensor.is_quantized or tensor.numel() == 0):
        return None
    convert = not lean(tensor)
    dtype = NUMPY_DTYPE.get(tensor.dtype) if not convert else (
        _HALF_DTYPE if tensor.is_floating_point() and tensor.dtype not in NUMPY_DTYPE else
        NUMPY_DTYPE.get(tensor.dtype, _WORK_DTYPE))
    thresholds = None if bounds is None else saturation_thresholds(bounds, saturation_margin, dtype)
    batch = int(tensor.shape[0]) if batched and tensor.dim() else 0
    return RegistrationPlan(call, plan_key(tensor, batch_before), tensor.requires_grad, batch_before, bool(batched),
                            batch, thresholds, tensor_id, series_id, deferred, convert, bounds, dtype,
                            kernels.summary_entry(dtype, thresholds is not None),
                            (tensor.ndim, tensor.dtype, tensor.requires_grad, type(tensor.grad_fn)),
                            host_view(tensor, batch),
                            (batch, bool(batched), dtype.str,
                             None if thresholds is None else tuple(thresholds.tolist()), tensor.requires_grad,
                             deferred))


def host_view(tensor: torch.Tensor, batch: int) -> Any:
    """The C++ ``HostView`` of a plan made from ``tensor`` (its signature, and the ``[batch or 1, units]``
    array the kernels read: over its memory, or a float64 copy of integers and booleans), or None without the
    module, for a tensor it does not read (half precision, a strided view) or where it cannot tell tensors
    apart (a node of a custom autograd Function, told apart by its Python class)."""
    module = native.taps_module()
    if module is None:
        return None
    view = module.HostView(tensor, batch)
    return view if view.usable() else None


def work_tensor(tensor: torch.Tensor, plan: RegistrationPlan) -> torch.Tensor:
    """What a converting plan's kernel reads of ``tensor``: its work view (``stats.exact.work_view``) as a
    contiguous host tensor of ``plan.work_dtype``. numpy converts the dtypes it shares with torch in one
    pass, several times faster than torch's cast on a step's small tensors (a batch of class targets), to
    the same values: integers and booleans to float64 and half precision to float32 are exact either way."""
    if tensor.dtype in _NUMPY_CONVERTS and not tensor.is_neg():
        return torch.from_numpy(np.ascontiguousarray(tensor.detach().numpy(), dtype=plan.work_dtype))
    return work_view(tensor.detach()).contiguous()


_NUMPY_CONVERTS = frozenset((torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
                             torch.float16, torch.float32, torch.float64))


def fits(plan: RegistrationPlan, tensor: torch.Tensor, batch_size: int | None) -> bool:
    """Whether ``tensor``, registered while the step's batch size is ``batch_size``, takes ``plan``'s route
    (the call's arguments are compared by the caller): its ``plan_key`` is the plan's, and the kernels can
    read it in place unless the plan converts it."""
    return (not tensor.is_nested and plan.key == plan_key(tensor, batch_size)
            and (plan.convert or (tensor.is_contiguous() and not tensor.is_neg())))


def same_summary(plan: RegistrationPlan, other: RegistrationPlan) -> bool:
    """Whether ``plan`` and ``other`` summarise one tensor into the same value row and route its gradient
    alike (the same batch view, kernel dtype, saturation thresholds, gradient and its timing), so a tensor
    registered under both names needs its statistics computed once: a model's output is also the output of
    its last module, which NeuralDbg registers under both names at every step.

    >>> x = torch.tanh(torch.ones(4, 3, requires_grad=True))
    >>> a, b, c = (make_plan((role, None, None, ""), x, batch_before=None, batched=True, bounds=bounds,
    ...                      saturation_margin=0.005, tensor_id=i, series_id=i, deferred=True)
    ...            for i, (role, bounds) in enumerate((("intermediate", (-1.0, 1.0)), ("output", (-1.0, 1.0)),
    ...                                               ("output", None))))
    >>> same_summary(a, b), same_summary(a, c)
    (True, False)
    """
    return plan.summary_key == other.summary_key and bool(plan.summary_key)

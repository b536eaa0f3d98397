"""What the model's own ``train()`` would change, found without changing the model: a dry run on a shadow.

Some models do more in ``train()`` than set the mode. mmpretrain's and mmdetection's backbones freeze their
``frozen_stages`` and keep normalisation layers in ``eval()`` (``norm_eval``) there, because ``train()`` runs
at the start of every epoch and would otherwise undo both. A loop that never calls ``model.train()`` — a new
module is in training mode already, so nothing looks wrong — never runs that code, and the stage meant to
stay fixed trains.

:func:`pending_train_changes` tells whether the model is in the state its ``train()`` sets. Only when some
module of the model defines its own ``train`` (most models do not, and then nothing is done), it builds a
*shadow* of the module tree — each module a new object of the same class sharing the original's
attributes, its parameters and buffers replaced by meta tensors of the same shape, dtype and
``requires_grad``, its submodules by their shadows — calls ``train(True)`` on the shadow root and compares
the shadow's ``requires_grad`` flags and modes with the model's. A difference is what ``train()`` would
change and has not: the model's ``train()`` has not run since they were set otherwise.

No tensor element is read or allocated (meta tensors have no storage). Should the user's ``train()`` reach
the real model through an attribute the shadow shares (a plain list of submodules), every flag and mode it
changed is put back and the answer is None, as it is when the dry run raises.

>>> import torch
>>> from torch import nn
>>> class Staged(nn.Sequential):
...     def train(self, mode=True):
...         super().train(mode)
...         self[0].eval()
...         self[0].requires_grad_(False)
...         return self
>>> model = Staged(nn.Linear(2, 2), nn.Linear(2, 2))
>>> changes = pending_train_changes(model)
>>> changes.frozen, changes.to_eval, changes.owners
(['0.weight', '0.bias'], ['0'], ['Staged'])
>>> model[0].weight.requires_grad, model[0].training
(True, True)
>>> _ = model.train(); pending_train_changes(model).empty
True
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

__all__ = ["TrainChanges", "pending_train_changes", "train_owners"]


@dataclass(frozen=True)
class TrainChanges:
    """What ``model.train()`` would change: parameters it would freeze (``frozen``) or unfreeze, modules it
    would put in ``eval()`` (``to_eval``) or in ``train()``, each by its path in the model; ``owners``: the
    classes whose own ``train`` made the difference possible."""

    frozen: list[str] = field(default_factory=list)
    unfrozen: list[str] = field(default_factory=list)
    to_eval: list[str] = field(default_factory=list)
    to_train: list[str] = field(default_factory=list)
    owners: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        """Whether ``train()`` would change nothing."""
        return not (self.frozen or self.unfrozen or self.to_eval or self.to_train)


def train_owners(root: nn.Module) -> list[str]:
    """Names of the classes in ``root`` (itself included) that define their own ``train`` method, in
    module order, each once."""
    names = []
    for module in root.modules():
        kind = type(module)
        if kind.train is not nn.Module.train and kind.__name__ not in names:
            names.append(kind.__name__)
    return names


def pending_train_changes(root: nn.Module) -> TrainChanges | None:
    """What ``root.train(True)`` would change (see the module docstring): an empty :class:`TrainChanges`
    when no module defines its own ``train`` or it would change nothing, None when the dry run could not
    tell."""
    owners = train_owners(root)
    if not owners:
        return TrainChanges()
    modules = list(root.named_modules(remove_duplicate=True))
    flags = [(p, p.requires_grad) for p in root.parameters()]
    modes = [(m, m.training) for _, m in modules]
    try:
        shadows: dict[int, nn.Module] = {}
        shadow_root = _shadow(root, shadows)
        shadow_root.train(True)
    except Exception:  # noqa: BLE001 - a train() that cannot run on a shadow is not checked
        _restore(flags, modes)
        return None
    if _restore(flags, modes):  # the dry run reached the real model: its answer is not to be trusted
        return None
    changes = TrainChanges(owners=owners)
    for path, module in modules:
        shadow = shadows[id(module)]
        if shadow.training != module.training:
            (changes.to_train if shadow.training else changes.to_eval).append(path)
        for name, parameter in module._parameters.items():
            copy = shadow._parameters.get(name)
            if parameter is None or copy is None or copy.requires_grad == parameter.requires_grad:
                continue
            full = f"{path}.{name}" if path else name
            (changes.unfrozen if copy.requires_grad else changes.frozen).append(full)
    return changes


def _shadow(module: nn.Module, shadows: dict[int, nn.Module]) -> nn.Module:
    """A new object of ``module``'s class with its attributes, meta copies of its parameters and buffers and
    the shadows of its submodules (a module used twice gets one shadow)."""
    known = shadows.get(id(module))
    if known is not None:
        return known
    clone = object.__new__(type(module))
    shadows[id(module)] = clone
    state = dict(module.__dict__)
    state["_parameters"] = {name: None if p is None else _meta_parameter(p) for name, p in module._parameters.items()}
    state["_buffers"] = {name: None if b is None else torch.empty(b.shape, dtype=b.dtype, device="meta")
                         for name, b in module._buffers.items()}
    state["_modules"] = {name: None if m is None else _shadow(m, shadows) for name, m in module._modules.items()}
    clone.__dict__.update(state)
    return clone


def _meta_parameter(parameter: torch.Tensor) -> nn.Parameter:
    meta = torch.empty(parameter.shape, dtype=parameter.dtype, device="meta")
    return nn.Parameter(meta, requires_grad=parameter.requires_grad)


def _restore(flags: list[tuple[torch.Tensor, bool]], modes: list[tuple[nn.Module, bool]]) -> bool:
    """Put back every ``requires_grad`` flag and mode that differs from the snapshot; whether any did."""
    changed = False
    for parameter, flag in flags:
        if parameter.requires_grad != flag:
            parameter.requires_grad_(flag)
            changed = True
    for module, mode in modes:
        if module.training != mode:
            module.training = mode
            changed = True
    return changed

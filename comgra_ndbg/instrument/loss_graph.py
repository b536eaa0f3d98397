"""How a prediction reaches its loss, read from autograd: mistakes no statistic names as precisely.

A loss is computed by a handful of autograd nodes next to the root of the graph ``backward()`` is called
on, whether a loss module or a function of ``torch.nn.functional`` computed it. Two classic mistakes show
there as a pattern of node types, with no tensor element read:

- **an activation the loss applies again** (``activation_before_loss``): a sigmoid's output fed to
  ``binary_cross_entropy_with_logits`` (``BCEWithLogitsLoss`` applies its own sigmoid: the probabilities it
  computes stay within (0.5, 0.73)), a softmax's or sigmoid's output fed to ``cross_entropy`` (its
  ``log_softmax`` of values within [0, 1] caps the right class's probability at e / (e + C − 1)), or
  probabilities fed to ``nll_loss``, which expects log-probabilities;
- **a prediction broadcast against its target** (``target_shape``): ``mse_loss``, ``smooth_l1_loss``,
  ``huber_loss`` or ``l1_loss`` of a ``[B, 1]`` prediction and a ``[B]`` target compare every prediction
  with every target (``[B, B]``) and the model learns the batch's mean. Both were broadcast when the
  prediction reaches the loss through an expansion and the saved target has a zero stride where it is
  longer than one; ``l1_loss`` saves no target, so there the ``[B, 1]`` against ``[B]`` pattern itself is
  read (a broadcast shape of ``[B, B]`` from a prediction ``[B, 1]``).

Between the activation and the loss only views, copies and dtype casts may stand (a squeeze, a
``.float()``); a clamp or a log between them is a different computation and is left alone (the log of a
softmax is the right input of ``nll_loss``). The walk visits at most :data:`NODES` nodes from the root, so
its cost does not grow with the model.

>>> import torch, torch.nn.functional as F
>>> logits = torch.randn(4, 3, requires_grad=True)
>>> [m.invariant for m in loss_mistakes(F.cross_entropy(torch.softmax(logits, 1), torch.tensor([0, 1, 2, 0])))]
['activation_before_loss']
>>> loss_mistakes(F.cross_entropy(logits, torch.tensor([0, 1, 2, 0])))
[]
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["LossMistake", "loss_mistakes", "gradient_leaves", "NODES", "LEAVES", "INFORMATION"]

NODES = 64
"""Autograd nodes visited from the loss at most: a loss's own nodes are within a few of the root."""

INFORMATION = frozenset({"sum_reduction"})
"""Findings that are facts about the loss, not mistakes by themselves (log rows of severity ``info``)."""

_PASS_THROUGH = frozenset({
    "ViewBackward0", "ReshapeAliasBackward0", "UnsafeViewBackward0", "SqueezeBackward0", "SqueezeBackward1",
    "SqueezeBackward2", "UnsqueezeBackward0", "TBackward0", "TransposeBackward0", "TransposeBackward1",
    "PermuteBackward0", "CloneBackward0", "ToCopyBackward0", "AliasBackward0", "FlattenBackward0"})
_ACTIVATIONS = {"SigmoidBackward0": "sigmoid", "SoftmaxBackward0": "softmax"}
_LOGIT_LOSSES = {"BinaryCrossEntropyWithLogitsBackward0": "binary_cross_entropy_with_logits (BCEWithLogitsLoss)",
                 "LogSoftmaxBackward0": "cross_entropy or log_softmax (CrossEntropyLoss)"}
_LOG_PROBABILITY_LOSSES = {"NllLossBackward0": "nll_loss (NLLLoss)", "NllLoss2DBackward0": "nll_loss (NLLLoss)"}
_REGRESSION_LOSSES = {"MseLossBackward0": "mse_loss (MSELoss)",
                      "SmoothL1LossBackward0": "smooth_l1_loss (SmoothL1Loss)",
                      "HuberLossBackward0": "huber_loss (HuberLoss)"}
_L1_ROOTS = frozenset({"MeanBackward0", "SumBackward0"})


@dataclass(frozen=True)
class LossMistake:
    """One mistake found in the loss's graph: the loop invariant it breaks, a sentence, the evidence."""

    invariant: str
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)
    source: Any = field(default=None, compare=False, repr=False)  # the autograd node at fault (the activation's)


def loss_mistakes(loss: torch.Tensor) -> list[LossMistake]:
    """The mistakes (module docstring) in the graph of ``loss``, each kind once, in the order met."""
    root = getattr(loss, "grad_fn", None)
    if root is None:
        return []
    found: dict[str, LossMistake] = {}
    seen, queue = {root}, [root]
    for node in queue:
        if len(seen) > NODES:
            break
        for mistake in _at(node, is_root=node is root):
            found.setdefault(mistake.invariant, mistake)
        for child, _ in node.next_functions:
            if child is not None and child not in seen and len(seen) <= NODES:
                seen.add(child)
                queue.append(child)
    return list(found.values())


LEAVES = 200_000
"""Autograd nodes a walk for the leaves a loss reaches visits at most (once per run: the whole graph)."""


def gradient_leaves(tensors: list[torch.Tensor], limit: int = LEAVES) -> list[torch.Tensor]:
    """The leaf tensors whose gradients a backward pass through ``tensors`` accumulates (their graph's
    ``AccumulateGrad`` nodes), each once, walking at most ``limit`` nodes.

    >>> w, b = torch.ones(2, requires_grad=True), torch.zeros(2, requires_grad=True)
    >>> [t is w or t is b for t in gradient_leaves([w * 3 + b])]
    [True, True]
    """
    roots = [t.grad_fn for t in tensors if getattr(t, "grad_fn", None) is not None]
    leaves: list[torch.Tensor] = []
    seen, stack = set(roots), list(roots)
    while stack and len(seen) <= limit:
        node = stack.pop()
        variable = getattr(node, "variable", None)
        if isinstance(variable, torch.Tensor):
            leaves.append(variable)
        for child, _ in node.next_functions:
            if child is not None and child not in seen:
                seen.add(child)
                stack.append(child)
    return leaves


def _name(node: Any) -> str:
    return type(node).__name__


def _input_node(node: Any) -> Any:
    """The node that computed ``node``'s first input, past views, copies and casts (None: a leaf or none)."""
    current = node.next_functions[0][0] if node.next_functions else None
    for _ in range(8):
        if current is None or _name(current) not in _PASS_THROUGH or not current.next_functions:
            return current
        current = current.next_functions[0][0]
    return current


def _at(node: Any, *, is_root: bool) -> list[LossMistake]:
    name = _name(node)
    found = _sum_reduction(node, name)
    if name in _LOGIT_LOSSES or name in _LOG_PROBABILITY_LOSSES:
        source = _input_node(node)
        activation = _ACTIVATIONS.get(_name(source)) if source is not None else None
        if activation is not None:
            found.append(_activation_mistake(node, name, activation, source))
    elif name in _REGRESSION_LOSSES:
        found += _broadcast_mistake(node, _REGRESSION_LOSSES[name])
    elif is_root and name in _L1_ROOTS:
        found += _l1_broadcast(node)
    return found


_SUMMED = {"NllLossBackward0": "nll_loss / cross_entropy", "NllLoss2DBackward0": "nll_loss / cross_entropy",
           "MseLossBackward0": "mse_loss", "SmoothL1LossBackward0": "smooth_l1_loss",
           "HuberLossBackward0": "huber_loss",
           "BinaryCrossEntropyWithLogitsBackward0": "binary_cross_entropy_with_logits",
           "BinaryCrossEntropyBackward0": "binary_cross_entropy"}
_SUM = 2  # torch's reduction enum: none 0, mean 1, sum 2


def _sum_reduction(node: Any, name: str) -> list[LossMistake]:
    """A loss summed rather than averaged (``reduction='sum'``) over its terms, with how many: information,
    not a mistake by itself — its gradient is that many times the mean's, which a learning rate set for a mean
    does not survive (the analysis reads it only where the optimizer blew up from the first step)."""
    if name not in _SUMMED:
        return []
    try:
        if int(node._saved_reduction) != _SUM:
            return []
        shape = tuple(node._saved_self.shape)
    except (AttributeError, RuntimeError, TypeError, ValueError):
        return []
    per_class = name.startswith("NllLoss") and len(shape) >= 2  # one term per sample (and position), not per class
    terms = math.prod(shape[:1] + shape[2:]) if per_class else math.prod(shape)
    return [LossMistake("sum_reduction",
                        f"{_SUMMED[name]} sums its {terms} terms (reduction='sum'): its gradient is {terms}× that of "
                        f"their mean",
                        {"terms": int(terms), "loss": _SUMMED[name]})]


def _activation_mistake(node: Any, name: str, activation: str, source: Any) -> LossMistake:
    if name in _LOG_PROBABILITY_LOSSES:
        loss = _LOG_PROBABILITY_LOSSES[name]
        effect = (f"it expects log-probabilities and takes the {activation}'s probabilities as they are: the loss it "
                  f"minimises is minus the right class's probability, not its log")
    elif name == "BinaryCrossEntropyWithLogitsBackward0":
        loss = _LOGIT_LOSSES[name]
        effect = ("it applies a sigmoid of its own, so the probabilities it computes stay within (0.5, 0.73): a "
                  "target of 0 can never be approached and the gradients shrink as the model's own sigmoid saturates")
    else:
        loss = _LOGIT_LOSSES[name]
        classes = _classes(node)
        cap = f" ({math.e / (math.e + classes - 1):.2f} for its {classes} classes)" if classes else ""
        effect = (f"it applies log_softmax of its own to values within [0, 1], which caps the right class's "
                  f"probability at e / (e + C - 1){cap} and shrinks the gradients")
    return LossMistake("activation_before_loss",
                       f"the prediction reaching {loss} already went through a {activation}: {effect}",
                       {"activation": activation, "loss": loss.split(" ")[0]}, source)


def _classes(node: Any) -> int | None:
    """The number of classes a ``LogSoftmaxBackward0`` normalised over (its saved result's size there)."""
    try:
        result, dim = node._saved_result, node._saved_dim
        return int(result.shape[dim]) if result.dim() else None
    except (AttributeError, RuntimeError, IndexError):
        return None


def _broadcast_mistake(node: Any, loss: str) -> list[LossMistake]:
    """A regression loss whose prediction and target were both broadcast to a larger shape."""
    expand = node.next_functions[0][0] if node.next_functions else None
    if expand is None or _name(expand) != "ExpandBackward0":
        return []
    try:
        prediction = [int(s) for s in expand._saved_self_sym_sizes]
        target = node._saved_target
        shape, strides = list(target.shape), target.stride()
    except (AttributeError, RuntimeError):
        return []
    if not any(stride == 0 and size > 1 for size, stride in zip(shape, strides)):
        return []  # the target kept its own shape: a prediction spread over it on purpose
    return [_shape_mistake(loss, prediction, shape)]


def _l1_broadcast(root: Any) -> list[LossMistake]:
    """``l1_loss`` as autograd records it, ``mean(abs(prediction - target))``, of a ``[B, 1]`` prediction
    broadcast to ``[B, B]``."""
    absolute = root.next_functions[0][0] if root.next_functions else None
    if absolute is None or _name(absolute) != "AbsBackward0" or not absolute.next_functions:
        return []
    difference = absolute.next_functions[0][0]
    if difference is None or _name(difference) != "SubBackward0" or not difference.next_functions:
        return []
    expand = difference.next_functions[0][0]
    if expand is None or _name(expand) != "ExpandBackward0":
        return []
    try:
        prediction = [int(s) for s in expand._saved_self_sym_sizes]
        shape = list(absolute._saved_self.shape)
    except (AttributeError, RuntimeError):
        return []
    if len(prediction) != 2 or len(shape) != 2 or prediction[1] != 1 or shape != [prediction[0], prediction[0]]:
        return []
    return [_shape_mistake("l1_loss (L1Loss)", prediction, shape)]


def _shape_mistake(loss: str, prediction: list[int], shape: list[int]) -> LossMistake:
    return LossMistake("target_shape",
                       f"{loss} compares a prediction of shape {prediction} with a target that broadcasts with it to "
                       f"{shape}: every prediction against every target of the batch, so the model learns the "
                       f"batch's mean",
                       {"prediction": prediction, "broadcast": shape, "loss": loss.split(" ")[0]})

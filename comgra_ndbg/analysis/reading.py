"""Reading a root event as a failure type and an origin.

| root event | type | origin |
|---|---|---|
| parameter edited outside the optimizer, harm in the signal it feeds | what the harm is (dead units, saturation, exploding, vanishing) | the parameter's node |
| non-finite input (from the first step too) | nonfinite_data | data |
| non-finite loss, or non-finite gradients first at the loss's end of the backward pass | nonfinite_loss | loss |
| non-finite elsewhere | exploding | node |
| value scale jump / drop; dead or saturated units in the same signal at once | exploding / vanishing (dead_units / saturation) | node |
| scale shift of the input | data_shift | data |
| the spread across samples collapses (in the input: the data) | mode_collapse | node (data) |
| one of two parallel paths' gradients come to dwarf the other's | imbalanced_learning | loss |
| … beginning with a sudden gradient jump inside the path that moved | exploding / vanishing | the jumping node |
| dead / saturated units | dead_units / saturation | node |
| gradient-ratio shift with no forward cause | exploding / vanishing | node |
| the same sudden gradient shift in most parameter nodes at once, no module output's gradient moving | gradient_scaling | optimizer |
| a parameter frozen while the rest trains (or never moving though it gets gradients) | update_stagnation | node |
| the whole model frozen at once | update_stagnation | optimizer |
| update jumps in most parameters at once | optimizer_divergence (non-finite, ≥ 100×, or settling at 2× the untrained model's loss) / optimizer_instability | optimizer |
| one of two parallel paths' updates come to dwarf the other's (gradients alike) | imbalanced_learning | optimizer |
| a sudden lasting jump of the loss that sets parallel paths apart | imbalanced_learning | loss |
| one parameter's update jump | optimizer_instability | node |
| transient loss spike | loss_spike | data |
| a sudden lasting jump of the loss with the parameters and inputs as the step before had them | target_shift | data (the targets) |
| loss divergence (or a lasting jump) with no other root | optimizer_divergence (optimizer_instability) | optimizer |
| any runaway (exploding, divergence) while the loss falls without bound below 0 | exploding | loss |
| vanishing gradients while the parameters' global gradient norm is the same at every step (clipped) | update_stagnation | loop |
| the prediction cannot reach its targets, one side squashed on its path | output_range | the squashing node |
| faults present from the first step | as above | architecture (optimizer for update sizes) |

"The same signal" is a pass-through chain (:mod:`~comgra_ndbg.analysis.structure`): a jump in a layer's
output with dead units two pass-through modules later is one fault of that layer.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from comgra_ndbg.analysis.balance import path_members
from comgra_ndbg.analysis.config import Thresholds
from comgra_ndbg.analysis.events import Event
from comgra_ndbg.analysis.harm import training_undone
from comgra_ndbg.analysis.optimizer_stability import OPTIMIZER, initial_loss
from comgra_ndbg.analysis.series import RunSeries
from comgra_ndbg.analysis.shift import log_level
from comgra_ndbg.analysis.structure import consumers, signal_chain

__all__ = ["Reading", "interpret", "loss_unbounded_below", "pinned_gradient_norm", "LOSS_NODE"]

LOSS_NODE = "loss"
STEP_CHANGE_FACTOR = 10.0
PINNED_SPREAD, PINNED_SHARE = 1e-3, 0.9
"""A global gradient norm is pinned when it stays within this relative spread of its median at this share of
the steps (``pinned_gradient_norm``); a model's own gradients wander by more than a percent per step."""
UNBOUNDED_FACTOR = 1000.0
"""How far below the untrained model's loss (in units of its size, 1 at least) a negative loss must fall for the
objective to be read as unbounded below (``loss_unbounded_below``)."""
"""How many times its usual step-to-step move a parameter node's norm may move into a step whose loss jumped,
for the jump to be read as the targets' (``_model_as_before``)."""
_REGIME_TYPE = {"dead": "dead_units", "saturated": "saturation"}
_RUNAWAY = ("exploding", "optimizer_divergence", "optimizer_instability")
_START_TYPE = {"activation_regime:dead": "dead_units", "activation_regime:saturated": "saturation",
               "gradient_health:vanishing": "vanishing", "gradient_health:exploding": "exploding",
               "optimizer_stability:unstable": "optimizer_divergence", "nonfinite:non-finite": "exploding"}


@dataclass(frozen=True)
class Reading:
    """What a root event means: failure type, origin kind, the node to show, and the events that refined it."""

    type: str
    origin: str
    node: str
    refined_by: tuple[Event, ...] = ()


def interpret(root: Event, events: Sequence[Event], series: RunSeries,
              thresholds: Thresholds = Thresholds()) -> Reading | None:
    """Read a root event as a failure type and an origin (see the module table); None when the root is not
    a failure in itself (a parameter fixed on purpose from the start, an edit that harmed nothing). A
    runaway (exploding values, a diverging optimizer) while the loss falls without bound below 0 is the
    loss's: no optimizer or layer makes a loss fall forever, an objective with no minimum does. Vanishing
    gradients while the parameters' gradient norm is pinned at one value every step are the loop's: the
    gradients were larger, and were clipped to that norm (``pinned_gradient_norm``)."""
    reading = _interpret(root, events, series, thresholds)
    if reading is None or root.family == "parameter_edit":
        return reading
    if reading.type in _RUNAWAY and loss_unbounded_below(series.loss, thresholds):
        return Reading("exploding", "loss", _loss_node(series), reading.refined_by)
    if reading.type == "vanishing" and pinned_gradient_norm(series, thresholds) is not None:
        return Reading("update_stagnation", "loop", "", reading.refined_by)
    return reading


def _interpret(root: Event, events: Sequence[Event], series: RunSeries, t: Thresholds) -> Reading | None:
    if root.to_state == "fixed":
        return None
    if root.family == "parameter_edit":
        return _edit_reading(root, events, series, t)
    if root.family == "output_range":  # present from the start or not, the squashing node is the place to fix
        return Reading("output_range", "node", root.node)
    if root.to_state == "frozen":
        if root.node == OPTIMIZER and root.at_start:  # (a network killed mid-run also ends at zero gradients)
            cut = _zero_gradient_nodes(series, root)
            if cut:  # their gradients are exactly 0: the backward path is cut, no optimizer could move them
                return Reading("unused_parameters", "architecture", cut[0])
        return Reading("update_stagnation", "optimizer" if root.node == OPTIMIZER else "node",
                       "" if root.node == OPTIMIZER else root.node)
    if root.family == "nonfinite" and _role(series, root.node) == "input":  # from the first step or not: the data
        return Reading("nonfinite_data", "data", root.node)
    if root.at_start:
        if root.node == OPTIMIZER:
            return Reading("optimizer_divergence", "optimizer", "")
        return Reading(_START_TYPE.get(root.label, root.to_state), "architecture", root.node)
    role = _role(series, root.node)
    if root.family == "nonfinite":
        return _nonfinite_reading(root, role, series)
    if root.family == "activation_regime":
        if role == "input":
            return Reading("data_shift", "data", root.node)
        if root.to_state in _REGIME_TYPE:
            return Reading(_REGIME_TYPE[root.to_state], "node", root.node)
        regime = _regime_in_signal(root.node, root.onset, events, series, t)
        if regime is not None:
            return Reading(_REGIME_TYPE[regime.to_state], "node", root.node, (regime,))
        return Reading(root.to_state, "node", root.node)
    if root.family == "gradient_health":
        if root.node == OPTIMIZER:  # every parameter's gradient scaled alike after the backward pass
            return Reading("gradient_scaling", "optimizer", "")
        return Reading(root.to_state, "node", root.node)
    if root.family == "path_balance":
        return _balance_reading(root, events, series, t)
    if root.family == "representation":
        return Reading("mode_collapse", "data" if role == "input" else "node", root.node)
    if root.to_state == "diverging" and root.sudden:
        imbalance = [e for e in events if e.family == "path_balance" and 0 <= e.onset - root.onset <= t.same_time]
        if imbalance:  # the loss itself changed at once (a term's weight) and set the paths apart
            return Reading("imbalanced_learning", "loss", _loss_node(series), (imbalance[0],))
    if root.to_state == "jumped" and _forward_moved(events, series, root.onset, t):
        return None  # the loss followed a forward pass that changed, measured a step later: that is the root
    if (root.to_state in ("diverging", "jumped") and root.sudden and _model_as_before(series, root.onset, t)
            and not _forward_moved(events, series, root.onset, t)):
        return Reading("target_shift", "data", _target_node(series) or _loss_node(series))
    if root.node == OPTIMIZER or root.to_state in ("diverging", "jumped"):
        return Reading(_optimizer_type(root, events, series, t), "optimizer", "")
    if root.to_state == "spike":
        return Reading("loss_spike", "data", _input_node(series))
    return Reading("optimizer_instability", "node", root.node)


def loss_unbounded_below(loss: np.ndarray, t: Thresholds = Thresholds()) -> bool:
    """Whether the loss fell without bound: its lowest finite value is negative, at least ``UNBOUNDED_FACTOR``
    times below the untrained model's level (1 at least), and among the last ``window`` finite values (it was
    still falling when the run ended or turned non-finite). An optimizer that diverges makes the loss climb;
    a loss that runs to -inf while the weights explode is an objective with no minimum: a log-likelihood
    minimised where its negative was meant, a missing term, a scale the loss rewards.

    >>> falling = np.array([-1.6] * 20 + [-1.6 * 2.0 ** k for k in range(1, 30)] + [np.nan] * 5)
    >>> loss_unbounded_below(falling), loss_unbounded_below(np.abs(falling))
    (True, False)
    >>> loss_unbounded_below(np.array([2.0] * 20 + [-3.0] * 30))  # a Gaussian NLL below 0: bounded
    False
    """
    finite = np.asarray(loss, dtype=np.float64)
    finite = finite[np.isfinite(finite)]
    if len(finite) < t.min_history:
        return False
    start = initial_loss(finite, t)
    lowest = int(np.argmin(finite))
    return bool(finite[lowest] < 0 and finite[lowest] <= -UNBOUNDED_FACTOR * max(1.0, abs(start))
                and lowest >= len(finite) - t.window)


def pinned_gradient_norm(series: RunSeries, t: Thresholds = Thresholds()) -> float | None:
    """The norm every parameter's gradient together had at almost every step, or None: over the recorded steps
    where every parameter node has a finite gradient (``min_history`` × 2 of them at least), the global norm
    within ``PINNED_SPREAD`` of its median at ``PINNED_SHARE`` of them. Only a rescaling after the backward
    pass does that (``clip_grad_norm_`` active at every step, or gradients normalised by hand): the raw
    gradients were larger than that norm every time, so they did not vanish on their way through the model."""
    nodes = [n for n in series.parameters if n.has("grad")]
    if not nodes or len(nodes) < len(series.parameters):
        return None
    norms = np.sqrt(np.sum([n.stats["grad"]["l2"] ** 2 for n in nodes], axis=0))
    norms = norms[np.isfinite(norms)]
    if len(norms) < 2 * t.min_history:
        return None
    middle = float(np.median(norms))
    if middle <= 0:
        return None
    pinned = np.abs(norms / middle - 1) <= PINNED_SPREAD
    return middle if pinned.mean() >= PINNED_SHARE else None


def _balance_reading(root: Event, events: Sequence[Event], series: RunSeries, t: Thresholds) -> Reading:
    """Updates apart under alike gradients: the learning rates; gradients apart: the loss weighs the paths —
    unless the gradient jumped suddenly inside the path that moved, below its end: a broken backward there."""
    if root.kind == "update":
        return Reading("imbalanced_learning", "optimizer", "", (root,))
    members = path_members(series.graph, root.node) - {root.node}
    order = {n.name: n.order for n in series.nodes}
    jumps = [e for e in events if e.family == "gradient_health" and e.sudden and e.node in members
             and abs(e.onset - root.onset) <= t.same_time]
    if jumps:
        jump = max(jumps, key=lambda e: order.get(e.node, -1))
        return Reading(jump.to_state, "node", jump.node, (root,))
    return Reading("imbalanced_learning", "loss", _loss_node(series), (root,))


def _nonfinite_reading(root: Event, role: str, series: RunSeries) -> Reading:
    if role == "input":
        return Reading("nonfinite_data", "data", root.node)
    if role == "loss" or root.node == LOSS_NODE:
        return Reading("nonfinite_loss", "loss", root.node)
    if root.kind == "grad" and _feeds_loss_directly(series, root.node) and _loss_finite_at(series, root.onset):
        return Reading("nonfinite_loss", "loss", _loss_node(series) or root.node)
    return Reading("exploding", "node", root.node)


def _zero_gradient_nodes(series: RunSeries, root: Event) -> list[str]:
    """The parameter nodes whose recorded gradient is exactly 0 at every step of ``root`` (a whole-model
    stagnation) while some other parameter node's is not, when they are at least half the parameter nodes:
    the model multiplies their path by 0 (a scale initialised to 0 that is no ``Parameter``), or cuts it."""
    steps = (series.steps >= root.onset) & (series.steps <= root.end)
    zero, live = [], 0
    for node in series.parameters:
        if not node.has("grad"):
            continue
        grad = node.stats["grad"]["abs_max"][steps]
        grad = grad[np.isfinite(grad)]
        if not len(grad):
            continue
        if grad.max() == 0:
            zero.append(node.name)
        else:
            live += 1
    return zero if live and len(zero) * 2 >= len(series.parameters) else []


def _edit_reading(root: Event, events: Sequence[Event], series: RunSeries, t: Thresholds) -> Reading | None:
    """The harm in the signal an edited parameter feeds, read as that parameter's failure."""
    chain: set[str] = set()
    for consumer in consumers(series.graph, root.node):
        chain |= signal_chain(series.graph, series.info or {}, consumer)
    near = [e for e in events if e.node in chain and e.kind == "value" and 0 <= e.onset - root.onset <= t.same_time]
    if _back_to_start(series, root) and training_undone(series, root.onset, t):  # a reload of the initial weights
        return _reset_reading(root, events, series)
    for states, kind in ((("dead", "saturated"), None), (("non-finite",), "exploding"),
                         (("exploding", "vanishing"), None), (("collapsed",), "mode_collapse")):
        found = [e for e in near if e.to_state in states]
        if found:
            effect = found[0]
            return Reading(kind or _REGIME_TYPE.get(effect.to_state, effect.to_state), "node", root.node, (effect,))
    # the values it feeds moved less than a decade, but gradients downstream jumped with the edit: the weights'
    # own jump (a layer re-initialised to a larger scale) is the fault, not those gradients
    downstream = _downstream(series, root.node)
    jumps = [e for e in events if e.family == "gradient_health" and e.sudden and e.node in downstream
             and e.to_state in ("exploding", "vanishing") and 0 <= e.onset - root.onset <= t.same_time]
    if jumps:
        return Reading(jumps[0].to_state, "node", root.node, (jumps[0],))
    # nothing downstream crossed its rule, but the weights' norm itself moved a decade: the edit is read by
    # its direction, a failure only where the loss got worse after it (``harm``)
    if root.evidence and len(root.evidence[0].values) == 2:
        before, after = root.evidence[0].values
        if before > 0 and after > 0 and abs(np.log10(after / before)) >= t.enter_decades:
            return Reading("exploding" if after > before else "vanishing", "node", root.node)
    # weights written back to where an untrained model's are (a re-initialisation inside the loop): the loss
    # returns to the untrained model's; most parameter nodes at once is the whole model, the loop's doing
    if training_undone(series, root.onset, t):
        return _reset_reading(root, events, series)
    return None


def _reset_reading(root: Event, events: Sequence[Event], series: RunSeries) -> Reading:
    """A re-initialisation: of the whole model (the loop's doing) when most parameter nodes were edited at
    once, else of the edited node."""
    edited = {e.node for e in events if e.family == "parameter_edit" and e.onset == root.onset}
    whole = len(edited) * 2 >= max(len(series.parameters), 1)
    return Reading("weights_reset", "loop", "" if whole else root.node)


def _back_to_start(series: RunSeries, root: Event, tolerance: float = 0.02) -> bool:
    """Whether the edited parameter node's value rms went back to within ``tolerance`` of its first recorded
    step's, from a value training had moved further than that: the weights were written back to where they
    started (a "best" checkpoint saved before training), not scaled or zeroed."""
    try:
        rms = series.get(root.node, "value", "rms")
    except Exception:  # noqa: BLE001 - a node without value statistics: no such reading
        return False
    i = int(np.searchsorted(series.steps, root.onset))
    if i < 2 or i >= len(rms) or not np.isfinite(rms[[0, i - 1, i]]).all() or rms[0] <= 0:
        return False
    start, before, after = float(rms[0]), float(rms[i - 1]), float(rms[i])
    return abs(after / start - 1) <= tolerance < abs(before / start - 1)


def _downstream(series: RunSeries, node: str) -> set[str]:
    """The nodes the dependency graph reaches from ``node`` (its consumers, theirs, and so on), with the
    parameter nodes of the modules among them."""
    graph = series.graph
    if graph is None:
        return set()
    seen, todo = set(), [node]
    while todo:
        for consumer in consumers(graph, todo.pop()):
            if consumer not in seen:
                seen.add(consumer)
                todo.append(consumer)
    return seen | {n.name for n in series.parameters if n.name.rsplit(".parameters", 1)[0] in seen}


def _regime_in_signal(node: str, onset: int, events: Sequence[Event], series: RunSeries,
                      t: Thresholds) -> Event | None:
    chain = signal_chain(series.graph, series.info or {}, node)
    regimes = [e for e in events if e.to_state in _REGIME_TYPE and e.family == "activation_regime"
               and e.node in chain and 0 <= e.onset - onset <= t.same_time]
    return regimes[0] if regimes else None


def _optimizer_type(root: Event, events: Sequence[Event], series: RunSeries, t: Thresholds) -> str:
    if root.to_state == "diverging":
        return "optimizer_divergence"
    horizon = root.onset + t.max_lag
    for e in events:
        if root.onset <= e.onset <= horizon and (e.family == "nonfinite" or e.to_state == "diverging"):
            return "optimizer_divergence"
    loss = series.loss
    i = int(np.searchsorted(series.steps, root.onset))
    before = loss[max(0, i - t.window):i]
    after = loss[i:int(np.searchsorted(series.steps, horizon, side="right"))]
    if np.isfinite(before).any() and len(after):
        base = float(np.nanmedian(before))
        if base > 0 and (~np.isfinite(after) | (after >= t.divergence_factor * base)).any():
            return "optimizer_divergence"
        initial = initial_loss(loss, t)
        settled = after[1:t.window + 1]
        if (np.isfinite(initial) and np.isfinite(settled).any()
                and np.nanmedian(settled) >= t.divergence_floor * initial):
            return "optimizer_divergence"  # the model is now worse than it was untrained
    return "optimizer_instability"


def _model_as_before(series: RunSeries, onset: int, t: Thresholds) -> bool:
    """Whether the step before ``onset`` left every parameter node and every input as the steps before it did:
    their norm moved from the previous step by no more than ``STEP_CHANGE_FACTOR`` × the median of such moves
    over the ``window`` steps before (and an input's rms by less than a decade). The loss of step ``onset``
    is computed before that step's update, so a loss that jumps at once there, with the model's parameters and
    inputs as they were, was changed by what it compares them with: the targets, or the loss itself. A
    learning rate that jumped shows in the parameters' move into ``onset``, an edit or an unnormalised batch
    as well. False where the parameters' values are not recorded at ``onset`` and the step before."""
    i = int(np.searchsorted(series.steps, onset))
    if i < 2 or i >= len(series.steps) or series.steps[i] != onset or series.steps[i - 1] != onset - 1:
        return False
    checked = 0
    for node in series.nodes:
        if not node.has("value") or not (node.is_parameter or node.role == "input"):
            continue
        level = log_level(node.stats["value"]["l2" if node.is_parameter else "rms"])[:i + 1]
        moves = np.abs(np.diff(level))
        now, before = moves[-1], moves[max(0, len(moves) - 1 - t.window):-1]
        before = before[np.isfinite(before)]
        if not np.isfinite(now) or len(before) < t.min_history:
            return False
        limit = 1.0 if node.role == "input" else STEP_CHANGE_FACTOR * float(np.median(before))
        if now > max(limit, float(np.median(before))):
            return False
        checked += node.is_parameter
    return checked > 0


def _forward_moved(events: Sequence[Event], series: RunSeries, onset: int, t: Thresholds) -> bool:
    """Whether a module output's or an input's values moved (an event of kind ``value``) from ``onset`` to the
    step after the next: a forward pass changed without its parameters (a dropout probability set to 1, an
    activation swapped), seen where the module outputs were measured next — at a sentinel step they are not."""
    parameters = {n.name for n in series.parameters}
    return any(e.kind == "value" and e.node not in parameters and onset <= e.onset <= onset + t.same_time + 1
               for e in events)


def _target_node(series: RunSeries) -> str:
    return next((n.name for n in series.nodes if n.role == "target"), "")


def _role(series: RunSeries, name: str) -> str:
    return next((n.role for n in series.nodes if n.name == name), "")


def _input_node(series: RunSeries) -> str:
    return next((n.name for n in series.nodes if n.role == "input"), "")


def _loss_node(series: RunSeries) -> str:
    return next((n.name for n in series.nodes if n.role == "loss"), "")


def _feeds_loss_directly(series: RunSeries, name: str) -> bool:
    """Whether ``name`` is the model's output or feeds the loss node directly (the end of the forward pass,
    where the backward pass starts)."""
    if _role(series, name) == "output":
        return True
    loss = _loss_node(series)
    graph = series.graph
    return bool(loss and graph is not None and any(e.source == name and e.target == loss for e in graph.edges))


def _loss_finite_at(series: RunSeries, step: int) -> bool:
    i = int(np.searchsorted(series.steps, step))
    loss = series.loss
    return i < len(loss) and bool(np.isfinite(loss[i]))

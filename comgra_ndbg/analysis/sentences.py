"""One plain sentence per hypothesis, built from its reading, root event and chain.

>>> from comgra_ndbg.analysis.events import CausalChain, Event
>>> root = Event("activation_regime", "blocks.3.out", "value", "normal", "dead", 200, 399, 0.97, 0.9)
>>> sentence(Reading("dead_units", "node", "blocks.3.out"), root, CausalChain(root), 0.93)
"Dead units originated in 'blocks.3.out' at step 200, after 97% of the units of 'blocks.3.out' went dead (confidence 0.93)."
"""
from __future__ import annotations

import math

from comgra_ndbg.analysis.events import CausalChain, Event
from comgra_ndbg.analysis.optimizer_stability import OPTIMIZER
from comgra_ndbg.analysis.reading import Reading
from comgra_ndbg.analysis.stagnation import stopped_share

__all__ = ["sentence", "describe", "describe_range", "TYPE_TEXT"]

TYPE_TEXT = {
    "vanishing": "Vanishing signal",
    "exploding": "Exploding signal",
    "dead_units": "Dead units",
    "saturation": "Saturation",
    "optimizer_divergence": "Optimizer divergence",
    "optimizer_instability": "Optimizer instability",
    "nonfinite_loss": "A non-finite loss",
    "nonfinite_data": "Non-finite input data",
    "data_shift": "A shift of the input data",
    "target_shift": "A change of the targets or the loss",
    "gradient_scaling": "Gradients scaled between the backward pass and the optimizer's step",
    "loss_spike": "A transient loss spike",
    "update_stagnation": "Update stagnation",
    "mode_collapse": "Mode collapse",
    "imbalanced_learning": "Imbalanced learning",
    # found by loop invariants (analysis/invariants.py)
    "stale_gradients": "Gradients carried over between steps",
    "wrong_mode": "A train/eval mode mistake",
    "batch_statistics": "BatchNorm on too few samples",
    "unused_parameters": "Unused parameters",
    "precision": "Half-precision weights",
    "repeated_batch": "The same batch every step",
    "unnormalised_input": "Unnormalised inputs",
    "constant_target": "A constant target",
    "weights_reset": "Weights reset during training",
    "single_value_batches": "Batches of a single target value",
    "target_shape": "A target shaped unlike the prediction",
    "nonfinite_evaluation": "Non-finite outputs in evaluation",
    "output_range": "An output that cannot reach its targets",
    # found against a healthy reference run (analysis/reference.py)
    "frozen_trains": "A stage meant to be frozen trains",
    "wrong_dtype": "Computation in the wrong dtype",
    "gradient_ratio": "A gradient norm ratio between layers unlike the reference's",
    "update_ratio": "An update norm ratio between layers unlike the reference's",
    "unclear": "A failure of unclear type",
    # found across the ranks of a distributed run (analysis/ranks.py)
    "partial_ddp": "DDP on some ranks only",
    "rank_desync": "Parameters out of sync across ranks",
    "rank_divergence": "A rank diverging from the others",
    "rank_stalled": "A rank that stopped",
    # found in the profile (analysis/profile.py)
    "memory_leak": "A memory leak",
}


def sentence(reading: Reading, root: Event, chain: CausalChain, confidence: float,
             alternatives: tuple[str, ...] = ()) -> str:
    """One plain sentence, e.g. "Dead units originated in 'blocks.3.pre' at step 200, after the value rms of
    'blocks.3.pre' rose 1.6 decades against its recent history and 'blocks.3.out' went dead (confidence
    0.93)."."""
    where = {"optimizer": "the optimizer", "loss": f"the loss ('{reading.node}')" if reading.node else "the loss",
             "data": (f"the targets ('{reading.node}')" if reading.type == "target_shift" else
                      f"the input data ('{reading.node}')") if reading.node else "the input data",
             "architecture": f"the architecture or initialisation (first seen in '{reading.node}')",
             "loop": f"the training loop (first seen in '{reading.node or root.node}')"}.get(
        reading.origin, f"'{reading.node}'")
    onset = "from the first step" if root.at_start else f"at step {root.onset}"
    because = describe(root)
    if reading.type == "target_shift":
        because += ", while the parameters and inputs were as the steps before left them"
    if reading.refined_by:
        regime = reading.refined_by[0]
        because += f" and '{regime.node}' went {regime.to_state}" if regime.node != root.node else ""
    effects = [link.effect for link in chain.links]
    tail = ""
    if effects:
        nodes = {e.node for e in effects}
        first = effects[0]
        tail = (f"; {len(effects)} later event{'s' if len(effects) > 1 else ''} in {len(nodes)} "
                f"node{'s' if len(nodes) > 1 else ''} follow{'s' if len(effects) == 1 else ''} from it "
                f"(first: {first.family.replace('_', ' ')} "
                f"{first.to_state} in '{first.node}' at step {first.onset})")
    title = TYPE_TEXT.get(reading.type, reading.type)
    if alternatives:
        title = f"A failure ({' or '.join(TYPE_TEXT.get(a, a).lower() for a in alternatives)}: unclear which)"
    return f"{title} originated in {where} {onset}, {because}{tail} (confidence {confidence:.2f})."


def describe(e: Event) -> str:
    """What the event's series did, as a clause: "after the value rms of 'h' rose 1.2 decades …"."""
    subject = "the optimizer's updates" if e.node == OPTIMIZER else f"'{e.node}'"
    if e.family == "nonfinite":
        what = "loss" if e.kind == "kpi" else {"value": "values", "update": "updates"}.get(e.kind, "gradients")
        return f"where {what} of {subject} first turned non-finite"
    if e.family == "output_range":
        return describe_range(e)
    if e.family == "parameter_edit":
        before, after = e.evidence[0].values if e.evidence else (float("nan"), float("nan"))
        return (f"where the values of {subject} changed by more than the optimizer's update explains (norm "
                f"{before:.3g} → {after:.3g}: written outside the optimizer)")
    if e.to_state == "imbalanced":
        what = "gradient norms" if e.kind == "grad" else "update/weight ratios"
        pair = e.evidence[0].series.split("÷") if e.evidence else ["", ""]
        other = pair[1].split("/")[0] if len(pair) > 1 else ""
        partner = pair[0].split("/")[0] if pair[0].split("/")[0] != e.node else other
        return (f"after the ratio of the {what} of the parallel paths through {subject} and '{partner}' shifted "
                f"{e.magnitude:.1f} decades and stayed there (one path dwarfs the other)")
    if e.to_state == "collapsed":
        before, after = e.evidence[0].baseline if e.evidence else float("nan"), e.evidence[0].values[0] \
            if e.evidence else float("nan")
        return (f"after the spread of {subject} across the samples of a batch fell from {before:.2g} to {after:.2g} "
                f"of its second moment (the samples became alike)")
    if e.to_state in ("dead", "saturated"):
        share = "units" if e.to_state == "dead" else "elements"
        return f"after {e.magnitude:.0%} of the {share} of {subject} went {e.to_state}"
    if e.to_state == "frozen":
        if e.node == OPTIMIZER:
            share = stopped_share(e)
            if share < 1.0:  # the rule fires on most trainable nodes stopping: say how many, not "no parameter"
                return (f"after {share:.0%} of the trainable parameter nodes stopped changing together for "
                        f"{e.magnitude:.0f} steps")
            return f"after no parameter changed for {e.magnitude:.0f} steps"
        return f"after the values of {subject} stopped changing for {e.magnitude:.0f} steps while the rest trained"
    if e.to_state == "spike":
        return f"after the loss jumped {e.magnitude:.0f}× its recent median and recovered"
    if e.to_state == "diverging":
        return _diverging(e)
    if e.to_state == "jumped":
        return f"after the loss jumped to {_times(e.magnitude)} its recent median at once and stayed there"
    if e.family == "gradient_health" and e.node == OPTIMIZER:
        direction = "rose" if e.to_state == "exploding" else "fell"
        return (f"after the gradients of the parameter nodes (relative to the output's) {direction} {e.magnitude:.1f} "
                f"decades alike in one step, while the module outputs' gradients did not move")
    what = {"value": "value rms", "grad": "gradient (relative to the output's)",
            "update": "update/weight ratio"}.get(e.kind, e.kind)
    direction = "rose" if e.to_state in ("exploding", "unstable") else "fell"
    if e.at_start and e.family == "activation_regime" and e.kind == "value" and e.evidence and e.evidence[0].values:
        rms, inputs = e.evidence[0].values[0], e.evidence[0].baseline
        return (f"where the value rms of {subject} is already {rms:.3g} before the first update, "
                f"{_times(rms / inputs)} the inputs'")
    if e.at_start:
        return f"where the {what} of {subject} is {e.magnitude:.1f} decades off"
    return f"after the {what} of {subject} {direction} {e.magnitude:.1f} decades against its recent history"


def _diverging(e: Event) -> str:
    """The clause of a diverging loss: how far it rose at its onset, and how far by the end of the run when
    it went on rising (the event's magnitude is the highest loss after the onset, which may come hundreds of
    steps later: quoted as the onset's rise it overstated that step by as much)."""
    evidence = e.evidence[0] if e.evidence else None
    if (evidence is None or not evidence.values or not evidence.steps
            or not evidence.baseline > 0 or not math.isfinite(evidence.values[0])):
        return f"after the loss rose to {_times(e.magnitude)} its recent median"
    first = evidence.values[0] / evidence.baseline
    clause = f"after the loss rose to {_times(first)} its recent median"
    if evidence.steps[0] != e.onset:  # (the sentence names the onset already)
        clause += f" at step {evidence.steps[0]}"
    if e.magnitude >= 10 * first:
        clause += f", and on to {_times(e.magnitude)} later"
    return clause


def _times(ratio: float) -> str:
    """A factor for a sentence: "40×", "1,200×", "3.5e+10×"."""
    return f"{ratio:,.0f}×" if ratio < 1e6 else f"{ratio:.2g}×"


def _about(ratio: float) -> str:
    """A ratio to one significant figure: 287.3 → "300"."""
    return f"{float(f'{ratio:.1g}'):g}"


def describe_range(e: Event) -> str:
    """The clause of an ``output_range`` event: how its node squashes one side, before which output, and what
    the prediction cannot reach (read from the event's evidence, see :mod:`~comgra_ndbg.analysis.output_range`).
    """
    if len(e.evidence) < 3:
        return f"where '{e.node}' cannot reach the targets' range"
    reached, how, route = e.evidence[:3]
    _, kind, prediction = (route.series.split("/", 2) + ["", ""])[:3]
    squash, side = how.series.rsplit("/", 1)[-1].split(":")
    ratio, bound = how.values
    low = side == "low"
    sign = "negative" if low else "positive"
    if squash == "compressed":
        clause = (f"where the {sign} side of '{e.node}' is compressed: its {sign} values are about {_about(ratio)}× "
                  f"smaller than its {'positive' if low else 'negative'} ones")
    elif squash == "removed":
        clause = f"where '{e.node}' has no {sign} values at all (cut off, as by a ReLU)"
    else:
        clause = f"where '{e.node}' is pinned at its {'lower' if low else 'upper'} bound {bound:g}"
    if prediction and prediction != e.node and route.values:
        clause += f", before the bounded output '{prediction}' (range {route.values[0]:g} to {route.values[1]:g})"
    where, direction = ("at or above", "down") if low else ("at or below", "up")
    value = reached.values[0] if reached.values else float("nan")
    if kind == "target":
        return (clause + f", so '{prediction}' stays {where} {value:.2g} where the targets go {direction} to "
                         f"{reached.baseline:.2g}, while the loss keeps pushing it {direction}")
    if kind == "probabilities":
        return (clause + f", so the cross-entropy on the probabilities of '{prediction}' (not logits) cannot "
                         f"fall below {reached.baseline:.3g}: it stays at {value:.3g}")
    return (clause + f", so the loss keeps pushing '{prediction}' {direction} (its gradient's mean is "
                     f"{how.baseline:.0%} of its rms) and it stays {where} {value:.2g}")

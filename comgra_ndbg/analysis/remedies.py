"""One concrete remedy per hypothesis, with numbers taken from the run itself.

A remedy names what to change and the value to change it to, read from the healthy phase before the
failure: the gradient norm to clip at (its 99th percentile before the onset), how far the update/weight
ratio jumped (so how much lower the learning rate should go), which parameter was written outside the
optimizer and when. Where the evidence says nothing more specific, it names the check that tells the
candidates apart.

>>> import numpy as np
>>> from comgra_ndbg.analysis.series import build_series
>>> from comgra_ndbg.analysis.synthetic import summary_rows
>>> s = build_series({("w", "grad"): summary_rows(rms=np.r_[np.full(50, 0.5), np.full(10, 80.0)])},
...                  roles={"w": "parameter"}, kpis={})
>>> round(healthy_gradient_norm(s, 50), 2)
4.0
"""
from __future__ import annotations

import numpy as np

from comgra_ndbg.analysis.events import Event
from comgra_ndbg.analysis.optimizer_stability import OPTIMIZER, update_ratio
from comgra_ndbg.analysis.reading import Reading, pinned_gradient_norm
from comgra_ndbg.analysis.stagnation import stopped_share
from comgra_ndbg.analysis.series import RunSeries

__all__ = ["remedy", "healthy_gradient_norm"]


def healthy_gradient_norm(series: RunSeries, onset: int, quantile: float = 0.99) -> float:
    """The ``quantile`` of the whole model's gradient norm (over every parameter node) before step
    ``onset``; NaN when no parameter gradient was recorded."""
    squares = [n.stats["grad"]["l2"] ** 2 for n in series.parameters if n.has("grad")]
    if not squares:
        return float("nan")
    total = np.sqrt(np.nansum(np.stack(squares), axis=0))
    total[~np.isfinite(np.stack(squares)).any(axis=0)] = np.nan
    before = total[series.steps < onset]
    before = before[np.isfinite(before) & (before > 0)]
    return float(np.quantile(before, quantile)) if len(before) else float("nan")


def _ratio_jump(series: RunSeries, onset: int) -> tuple[float, float]:
    """Median update/weight ratio over the parameter nodes before ``onset`` and at its peak after it."""
    before, after = [], []
    for node in series.parameters:
        if node.has("update") and node.has("value"):
            ratio = update_ratio(node)
            head, tail = ratio[series.steps < onset], ratio[(series.steps >= onset) & (series.steps < onset + 5)]
            if np.isfinite(head).any() and np.isfinite(tail).any():
                before.append(np.median(head[np.isfinite(head)][-20:]))  # the last 20 recorded (tiers skip steps)
                after.append(np.nanmax(tail))
    if not before:
        return float("nan"), float("nan")
    return float(np.median(before)), float(np.median(after))


def _clip(series: RunSeries, onset: int) -> str:
    norm = healthy_gradient_norm(series, onset)
    if not np.isfinite(norm):
        return "clip gradients (torch.nn.utils.clip_grad_norm_) at the norm they had while training was healthy"
    return (f"clip gradients with torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm={norm:.3g}), "
            f"the 99th percentile of the gradient norm before step {onset}")


def _range_remedy(node: str, root: Event) -> str:
    """The ``output_range`` remedy for how ``node`` squashes (compressed, removed, pinned) and the route by
    which the shortfall showed (the event's evidence, see :mod:`~comgra_ndbg.analysis.output_range`): a
    softmax before a cross-entropy is not an activation to move but probabilities to replace by logits.

    >>> from comgra_ndbg.analysis.events import Evidence
    >>> evidence = (Evidence("probs/value", (), ()), Evidence("probs/value/pinned:low", (), ()),
    ...             Evidence("route/probabilities/probs", (), ()))
    >>> event = Event("output_range", "probs", "value", "normal", "out_of_reach", 0, 9, 1.0, 0.9, evidence)
    >>> _range_remedy("probs", event)[:56]
    "pass logits to F.cross_entropy: remove the softmax at 'p"
    """
    how = route = ""
    if len(root.evidence) >= 3:
        how = root.evidence[1].series.rsplit("/", 1)[-1].split(":")[0]
        route = (root.evidence[2].series.split("/") + ["", ""])[1]
    if route == "probabilities":
        return (f"pass logits to F.cross_entropy: remove the softmax at '{node}' (the loss applies log-softmax "
                f"itself), or give log-probabilities to F.nll_loss")
    if how == "pinned":
        return (f"match the output's activation to the targets at '{node}': remove it or move it off the output "
                f"layer (no activation for real-valued targets), or scale the targets into its range")
    return (f"match the output's activation to the targets at '{node}': remove it or move it off the output "
            f"layer (the output layer's values go unchanged to a sigmoid or, for real-valued targets, to the loss)")


def remedy(reading: Reading, root: Event, series: RunSeries) -> str:
    """The remedy sentence for a hypothesis read as ``reading`` from ``root`` (see the module docstring)."""
    node, onset = reading.node, root.onset
    if root.family == "parameter_edit":
        if reading.type == "weights_reset":
            return (f"the model's weights were set back to an untrained state at step {onset} (an initialisation "
                    f"applied inside the training loop, model.apply(init) or reset_parameters() per epoch, or a "
                    f"checkpoint of the untrained model loaded): initialise once, before the loop")
        return (f"the values of '{node}' were written outside the optimizer before step {onset} (an in-place edit "
                f"under torch.no_grad(), a re-initialisation or a checkpoint load): find the code that writes them, "
                f"or restore them from a checkpoint taken before step {onset}")
    kind = reading.type
    role = next((n.role for n in series.nodes if n.name == node), "")
    if kind == "output_range":
        return _range_remedy(node, root)
    if kind in ("dead_units", "saturation") and role == "output":
        bound = "0 for every sample" if kind == "dead_units" else "pinned at a bound of its activation"
        return (f"the model's output '{node}' is {bound}: its last activation cannot reach the targets' range "
                f"(e.g. negative targets after a ReLU, targets outside (0, 1) after a sigmoid): remove it or match "
                f"it to the targets")
    if kind == "dead_units":
        return (f"lower the learning rate or add a normalisation before '{node}'; an activation that keeps a "
                f"gradient for negative inputs (LeakyReLU, GELU) stops units from dying for good")
    if kind == "saturation":
        return (f"keep the input of '{node}' in the activation's working range: normalise it (LayerNorm, "
                f"BatchNorm) or scale down the weights that feed it")
    if kind == "unused_parameters":
        return (f"the gradients reaching '{node}' and the other parameter nodes that stopped are exactly 0: the "
                f"model multiplies their path by 0 or cuts it from the loss (a scale initialised to 0 kept as a plain "
                f"number instead of an nn.Parameter, a detach, a mask of zeros); make the scale a Parameter or "
                f"reconnect the path")
    if kind == "exploding" and root.at_start and root.family == "activation_regime":  # before any update
        return (f"the untrained model already amplifies its inputs at '{node}': check its initialisation (the weights' "
                f"scale; for a recurrent layer, a recurrence gain at or under 1: orthogonal or 1/sqrt(hidden) "
                f"weights), or add a normalisation before it")
    if kind == "exploding" and reading.origin == "loss":
        finite = series.loss[np.isfinite(series.loss)]
        return (f"the loss fell without bound (to {finite.min():.3g}) while the weights grew: the objective has no "
                f"minimum. Check its sign (a log-likelihood minimised where its negative was meant: NLL is "
                f"-log p), a term left out, and any scale the loss rewards; a loss like cross-entropy or MSE never "
                f"goes below 0")
    if kind == "exploding":
        return _clip(series, onset) + f", and look at what amplifies the signal at '{node}'"
    if kind == "vanishing":
        return (f"look at what shrinks the signal at '{node}' (a scale, an initialisation, a saturating activation); "
                f"residual connections or a normalisation keep the gradient of earlier layers alive")
    if kind in ("optimizer_divergence", "optimizer_instability"):
        before, after = _ratio_jump(series, onset)
        if np.isfinite(before) and np.isfinite(after) and before > 0 and after > before:
            factor = after / before
            return (f"the update/weight ratio jumped {factor:.3g}× at step {onset} (from {before:.2g} to "
                    f"{after:.2g}): lower the learning rate about {factor:.2g}× (back to the rate before step "
                    f"{onset}), check the scheduler, or {_clip(series, onset)}")
        return f"lower the learning rate or use a warm-up; {_clip(series, onset)}"
    if kind == "mode_collapse":
        if reading.origin == "data":
            return (f"the samples of each batch became alike from step {onset} on: check the data pipeline (the "
                    f"same sample repeated, a broadcast instead of a batch, shuffling lost)")
        return (f"the samples' values at '{node}' became alike at step {onset}: look at what removes their "
                f"differences there (weights zeroed or scaled down, a normalisation over the batch or the wrong "
                f"axis, a constant input); for a generator, a lower learning rate or a loss that rewards variety")
    if kind == "imbalanced_learning":
        return (f"the path through '{node}' changed scale at step {onset} and now dominates or starves its parallel "
                f"path: check the learning rate of its param group, the scale of its input, and any weighting of "
                f"the paths; normalising each path's output before they meet keeps them comparable")
    if kind == "nonfinite_loss":
        return (f"make the loss finite for every batch: compute it from logits (F.cross_entropy, "
                f"F.log_softmax) instead of log(softmax), and guard logs and divisions with a small epsilon "
                f"(the first non-finite loss was at step {onset})")
    if kind == "nonfinite_data":
        return (f"the input of step {onset} holds NaN or Inf: check the data pipeline (a normalisation dividing by "
                f"a zero standard deviation, a corrupt sample) and assert torch.isfinite(x).all() on each batch")
    if kind == "gradient_scaling":
        direction = "shrank" if root.to_state == "vanishing" else "grew"
        return (f"every parameter's gradient {direction} about {10 ** root.magnitude:.2g}× at step {onset} while the "
                f"gradients of the module outputs did not: check what runs between loss.backward() and "
                f"optimizer.step() from then on (clip_grad_norm_'s max_norm, a GradScaler's unscale, .grad changed "
                f"by hand)")
    if kind == "target_shift":
        return (f"the loss jumped at step {onset} before the model or its inputs had changed: check the targets "
                f"of the batches from step {onset} on (labels remapped, shuffled or paired with the wrong inputs) "
                f"and any change to the loss then (a weight, a reduction, a term)")
    if kind == "data_shift":
        return (f"the input's scale changed at step {onset}: check the preprocessing of the batches from then on "
                f"(a normalisation dropped, pixels in 0-255 instead of 0-1)")
    if kind == "loss_spike":
        return f"look at the batch of step {onset} (outliers, wrong labels) and {_clip(series, onset)}"
    pinned = pinned_gradient_norm(series) if kind == "update_stagnation" and reading.origin == "loop" else None
    if pinned is not None:
        return (f"the parameters' gradients were rescaled to a norm of {pinned:.3g} at every "
                f"step between loss.backward() and optimizer.step(): check clip_grad_norm_'s max_norm (1.0 is usual; "
                f"a typo of 1e-4 freezes training) or the code that normalises the gradients")
    if kind == "update_stagnation":
        if reading.origin == "optimizer" and root.node == OPTIMIZER and stopped_share(root) < 1.0:
            return (f"{stopped_share(root):.0%} of the trainable parameter nodes stopped changing at step {onset} "
                    f"while the rest trained: check that every parameter that gets a gradient is in a param group "
                    f"of the optimizer, that no learning rate is 0, and that optimizer.step() is called every step")
        if reading.origin == "optimizer":
            return (f"no parameter changed from step {onset} on: check that optimizer.step() is called every step "
                    f"and that no learning rate is 0")
        return (f"'{node}' stopped changing at step {onset} while the rest trained: check its requires_grad, the "
                f"learning rate of its param group, and that it is among the optimizer's parameters")
    return f"inspect '{node}' around step {onset} in the explorer"

"""Baselines scored on the same recordings as the analysis.

- B0 *loss only*: an alarm at the first step whose loss is non-finite or above 10× the running median of
  the previous 20 losses. It cannot localize: it says "non-finite loss" at the loss, or "loss spike" in
  the data.
- B1 *AUTOTRAINER-style fixed rules*, checked every step on the parameter gradients: first/last layer
  gradient-norm ratio < 1e-3 with first-layer norm < 1e-4 → vanishing (at the first layer); ratio > 70 →
  exploding (at the first layer); ≥ 70 % zero gradient elements in a layer → dead units (at that layer);
  loss non-finite or ≥ 1e3 → non-finite loss.

Each returns ``None`` (no alarm) or a ``Prediction``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from comgra_ndbg.store.reader import Recording


@dataclass(frozen=True)
class Prediction:
    type: str
    origin: str  # "node", "optimizer", "loss", "data", "architecture"
    node: str
    onset: int
    confidence: float = 1.0


def b0_loss_only(rec: Recording) -> Prediction | None:
    steps, loss = rec.kpi("loss")
    for i in range(len(loss)):
        if not np.isfinite(loss[i]):
            return Prediction("nonfinite_loss", "loss", "loss", int(steps[i]))
        history = loss[max(0, i - 20):i]
        history = history[np.isfinite(history)]
        if len(history) >= 5 and loss[i] > 10 * np.median(history):
            return Prediction("loss_spike", "data", "input", int(steps[i]))
    return None


def b1_fixed_rules(rec: Recording) -> Prediction | None:
    layers = [t.node for t in rec.tensors if t.role == "parameter" and t.name.endswith("weight")
              and not t.node.split(".")[-2].startswith("norms")]
    layers = list(dict.fromkeys(layers))
    if len(layers) < 2:
        return None
    first, last = layers[0], layers[-1]
    steps, first_norm = rec.summary(first, "grad", "l2", tensor=first + ".weight")
    last_steps, last_norm = rec.summary(last, "grad", "l2", tensor=last + ".weight")
    zero = {node: rec.summary(node, "grad", "zero_fraction", tensor=node + ".weight") for node in layers}
    loss_steps, loss = rec.kpi("loss")
    loss_at = dict(zip(loss_steps.tolist(), loss.tolist()))
    last_at = dict(zip(last_steps.tolist(), last_norm.tolist()))
    zero_at = {node: dict(zip(s.tolist(), v.tolist())) for node, (s, v) in zero.items()}
    for i, step in enumerate(steps.tolist()):
        value = loss_at.get(step, 0.0)
        if not np.isfinite(value) or value >= 1e3:
            return Prediction("nonfinite_loss", "loss", "loss", step)
        norm_last = last_at.get(step, np.nan)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = first_norm[i] / norm_last
        if ratio < 1e-3 and first_norm[i] < 1e-4:
            return Prediction("vanishing", "node", first, step)
        if ratio > 70:
            return Prediction("exploding", "node", first, step)
        for node in layers:
            if zero_at[node].get(step, 0.0) >= 0.7:
                return Prediction("dead_units", "node", node, step)
    return None

"""Baselines scored on the same recordings as the analysis.

- B0 *loss only*: an alarm at the first step whose loss is non-finite or above 10× the median of the
  previous 20 losses. It reads the recording's loss: the KPI ``loss``, else the node ``loss``; a recording
  without either (a functional loss ``NeuralDbg`` was not told about) gives it nothing to read. It cannot
  localize: it says "non-finite loss" at the loss, or "loss spike" in the data.
- B1 *AUTOTRAINER-style fixed rules*, checked every step on the weight gradients of the layers in
  recording order (norm layers and embeddings left out; ``NeuralDbg`` names a layer's parameters
  ``model.<path>.parameters``, ``Recorder.track_module`` names them ``model.<path>``): first/last layer
  gradient-norm ratio < 1e-3 with first-layer norm < 1e-4 → vanishing (at the first layer); ratio > 70 →
  exploding (at the first layer); ≥ 70 % zero gradient elements in a layer → dead units (at that layer);
  loss non-finite or ≥ 1e3 → non-finite loss.

Each returns ``None`` (no alarm) or a ``Prediction``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from comgra_ndbg.store.reader import Recording

SKIPPED_MODULES = ("Norm", "Embedding")


@dataclass(frozen=True)
class Prediction:
    type: str
    origin: str
    node: str
    onset: int
    confidence: float = 1.0


def recorded_loss(rec: Recording) -> tuple[np.ndarray, np.ndarray]:
    """The loss as the recording has it (KPI ``loss``, else node ``loss``), or empty arrays."""
    if "loss" in rec.kpi_names:
        return rec.kpi("loss")
    if "loss" in rec.nodes:
        return rec.summary("loss", "value", "mean")
    return np.zeros(0, np.int64), np.zeros(0)


def b0_loss_only(rec: Recording) -> Prediction | None:
    steps, loss = recorded_loss(rec)
    for i in range(len(loss)):
        if not np.isfinite(loss[i]):
            return Prediction("nonfinite_loss", "loss", "loss", int(steps[i]))
        history = loss[max(0, i - 20):i]
        history = history[np.isfinite(history)]
        if len(history) >= 5 and loss[i] > 10 * np.median(history):
            return Prediction("loss_spike", "data", "input", int(steps[i]))
    return None


def _layers(rec: Recording) -> list[tuple[str, str]]:
    """``(node, weight tensor)`` of every weighted layer, in recording order."""
    classes = {m.path: m.class_name for m in rec.modules}
    layers = [(t.node, t.name) for t in rec.tensors if t.role == "parameter" and t.name.endswith(".weight")
              and not any(s in classes.get(t.module, "") for s in SKIPPED_MODULES)]
    return list(dict.fromkeys(layers))


def _aligned(rec: Recording, tensor: str, stat: str, steps: np.ndarray) -> np.ndarray:
    found_steps, values = rec.summary(tensor, "grad", stat)
    lookup = dict(zip(found_steps.tolist(), values.tolist()))
    return np.array([lookup.get(s, np.nan) for s in steps.tolist()])


def b1_fixed_rules(rec: Recording) -> Prediction | None:
    layers = [(n, t) for n, t in _layers(rec) if "grad" in rec.kinds(t)]
    if len(layers) < 2:
        return None
    (first, first_tensor), (_, last_tensor) = layers[0], layers[-1]
    steps = rec.steps
    first_norm = _aligned(rec, first_tensor, "l2", steps)
    last_norm = _aligned(rec, last_tensor, "l2", steps)
    zero = {node: _aligned(rec, tensor, "zero_fraction", steps) for node, tensor in layers}
    loss_steps, loss = recorded_loss(rec)
    loss_at = dict(zip(loss_steps.tolist(), loss.tolist()))
    for i, step in enumerate(steps.tolist()):
        value = loss_at.get(step, 0.0)
        if not np.isfinite(value) or value >= 1e3:
            return Prediction("nonfinite_loss", "loss", "loss", step)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = first_norm[i] / last_norm[i]
        if ratio < 1e-3 and first_norm[i] < 1e-4:
            return Prediction("vanishing", "node", first, step)
        if ratio > 70:
            return Prediction("exploding", "node", first, step)
        for node, share in zero.items():
            if share[i] >= 0.7:
                return Prediction("dead_units", "node", node, step)
    return None

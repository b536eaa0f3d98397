"""Ground-truth checks read straight from a recording (never through the analysis under test).

``validate`` says whether a faulty run shows its fault's defining symptom (runs that do not are dropped and
counted); ``secondary_effects`` says which expected secondary effects the run really shows, so that chain
recall is scored only where there is something to find.
"""
from __future__ import annotations

import numpy as np

from benchmarks.diagbench.runs import DEAD_UNITS, GRADIENT_VANISHING, NONFINITE, RunSpec
from comgra_ndbg.store.reader import Recording

WINDOW = 50


def _median(steps: np.ndarray, values: np.ndarray, start: int, stop: int) -> float:
    chosen = values[(steps >= start) & (steps < stop)]
    return float(np.nanmedian(chosen)) if np.isfinite(chosen).any() else float("nan")


def _loss_nonfinite_after(rec: Recording, t0: int, horizon: int = 400) -> bool:
    steps, loss = rec.kpi("loss")
    chosen = loss[(steps >= t0) & (steps < t0 + horizon)]
    return bool((~np.isfinite(chosen)).any())


def _grad_ratio(rec: Recording, node: str) -> tuple[np.ndarray, np.ndarray]:
    steps, grad = rec.summary(node, "grad", "rms")
    ref_steps, ref = rec.summary("logits", "grad", "rms")
    common, a, b = np.intersect1d(steps, ref_steps, return_indices=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        return common, grad[a] / ref[b]


def validate(spec: RunSpec, rec: Recording) -> tuple[bool, str]:
    """Whether the recording shows the defining symptom of ``spec``'s fault, and what was measured."""
    fault, t0, k = spec.fault, spec.t0, spec.block
    after = (t0, t0 + WINDOW)
    before = (t0 - WINDOW, t0)
    if fault == "F1":
        steps, ratio = _grad_ratio(rec, "blocks.0.pre")
        value = _median(steps, ratio, 0, 20)
        return value < 1e-4, f"first/output gradient ratio {value:.2e} (< 1e-4)"
    if fault == "F2":
        steps, rms = rec.summary(f"blocks.{k}.pre", "value", "rms")
        drop = _median(steps, rms, *after) / _median(steps, rms, *before)
        return drop <= 1e-2, f"pre-activation rms ×{drop:.1e} (≤ 1e-2)"
    if fault == "F3":
        steps, rms = rec.summary(f"blocks.{k}.pre", "value", "rms")
        rise = np.nanmax(np.where(steps >= t0, rms, np.nan)) / _median(steps, rms, *before)
        nonfinite = _loss_nonfinite_after(rec, t0)
        return bool(rise >= 10 or nonfinite), f"pre-activation rms ×{rise:.1e}, non-finite loss {nonfinite}"
    if fault in ("F4", "F11"):
        blocks = [k] if fault == "F4" else list(range(spec.config.depth))
        start, stop = (t0, t0 + WINDOW) if fault == "F4" else (0, WINDOW)
        dead = []
        for b in blocks:
            steps, share = rec.summary(f"blocks.{b}.out", "value", "dead_fraction")
            chosen = share[(steps >= start) & (steps < stop)]
            dead.append(bool(len(chosen) and np.nanmin(chosen) >= 0.99))
        need = 1 if fault == "F4" else max(1, len(blocks) // 2)
        return sum(dead) >= need, f"{sum(dead)}/{len(blocks)} blocks with dead share ≥ 0.99 for {WINDOW} steps"
    if fault == "F5":
        steps, share = rec.summary(f"blocks.{k}.out", "value", "saturated_fraction")
        value = _median(steps, share, *after)
        return value >= 0.5, f"saturated share {value:.2f} (≥ 0.5)"
    if fault == "F6":
        steps, loss = rec.kpi("loss")
        base = _median(steps, loss, *before)
        chosen = loss[(steps >= t0) & (steps < t0 + 20)]
        bad = bool((~np.isfinite(chosen) | (chosen >= 100 * base)).any())
        return bad, f"loss non-finite or ≥ 100× its median within 20 steps: {bad}"
    if fault == "F7":
        steps, loss = rec.kpi("loss")
        base = _median(steps, loss, *before)
        peak = float(np.nanmax(np.where((steps >= t0) & (steps < t0 + WINDOW), loss, np.nan)))
        return peak >= 2 * base, f"loss peak {peak / base:.1f}× its median (≥ 2)"
    if fault == "F8":
        return _loss_nonfinite_after(rec, t0, 1), "loss non-finite at t0"
    if fault == "F9":
        steps, nonfinite = rec.summary("input", "value", "nonfinite")
        hit = bool(np.any(nonfinite[steps == t0] > 0))
        return hit, f"input non-finite at t0: {hit}"
    if fault == "F10":
        steps, loss = rec.kpi("loss")
        ratio = float(loss[steps == t0][0] / _median(steps, loss, t0 - 20, t0))
        return ratio >= 10, f"loss at t0 {ratio:.0f}× its median (≥ 10)"
    if fault == "F12":
        steps, grad = rec.summary(f"blocks.{k}.pre", "grad", "rms")
        rise = _median(steps, grad, t0, t0 + 20) / _median(steps, grad, *before)
        return rise >= 1e3, f"gradient rms ×{rise:.1e} (≥ 1e3)"
    if fault == "F13":
        node = f"model.blocks.{k}.linear"
        frozen = all(bool(np.all(update[steps >= t0] == 0)) for steps, update in
                     (rec.summary(node, "update", "abs_max", tensor=t.name) for t in rec.tensors_of(node)))
        return frozen, f"zero updates from t0: {frozen}"
    raise ValueError(f"no validation for fault {fault!r}")


def secondary_effects(spec: RunSpec, rec: Recording, expected: list[str]) -> dict[str, bool]:
    """For each expected effect label, whether the recording shows it (measured directly)."""
    out = {}
    t0, k = spec.t0, spec.block
    for label in expected:
        if label == NONFINITE:
            out[label] = _loss_nonfinite_after(rec, t0)
        elif label == DEAD_UNITS:
            died = False
            for b in range(spec.config.depth):
                steps, share = rec.summary(f"blocks.{b}.out", "value", "dead_fraction")
                if _median(steps, share, t0 - 20, t0) < 0.5 and np.nanmax(
                        np.where((steps >= t0) & (steps < t0 + WINDOW), share, np.nan)) >= 0.9:
                    died = True
            out[label] = died
        elif label == GRADIENT_VANISHING:
            upstream = f"blocks.{k - 1}.out" if k else None
            if upstream is None:
                out[label] = False
                continue
            steps, ratio = _grad_ratio(rec, upstream)
            drop = _median(steps, ratio, t0, t0 + 20) / _median(steps, ratio, t0 - 20, t0)
            out[label] = bool(drop <= 0.1)
        else:
            raise ValueError(f"no check for effect {label!r}")
    return out

"""Ground-truth checks: does a faulty run show its fault's defining symptom, and which expected secondary
effects does it show? Read straight from the recording with the public reader (``open_recording``:
summaries of nodes) and from the loop's own measurements in ``truth.json`` (the loss of every step, and
the per-sample spread used for mode collapse) — never through the analysis under test.

Runs that fail ``validate`` are dropped from the scores and counted (a healthy run is checked too: its loss
finite and falling, no saturated or dead module); ``secondary_effects`` decides where chain recall is scored.
"""
from __future__ import annotations

import numpy as np

from benchmarks.diagbench.faults import DEAD, GRAD_VANISHING, NONFINITE
from benchmarks.diagbench.families import Family, Site, families
from comgra_ndbg.stats.statistics import derive_one, merge_groups
from comgra_ndbg.store.reader import Recording

WINDOW = 20
FIRST_LAYER = {"mlp": "blocks.0.linear", "autoencoder": "encoder.0"}


def series(rec: Recording, node: str, kind: str, stat: str) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, values)`` of one statistic of a node, its tensors merged (``input[0]`` and ``input[1]``)."""
    parts = [rec.summary_rows(t.name, kind) for t in rec.tensors_of(node) if kind in rec.kinds(t.name)]
    if not parts:
        return np.zeros(0, np.int64), np.zeros(0)
    steps, rows = merge_groups(np.concatenate([s for s, _ in parts]), np.concatenate([r for _, r in parts]))
    return steps, derive_one(rows, stat)


def median(steps: np.ndarray, values: np.ndarray, start: int, stop: int) -> float:
    chosen = values[(steps >= start) & (steps < stop)]
    chosen = chosen[np.isfinite(chosen)]
    return float(np.median(chosen)) if len(chosen) else float("nan")


def _ratio(after: float, before: float) -> float:
    return after / before if before > 0 else float("nan")


def _losses(truth: dict) -> tuple[np.ndarray, np.ndarray]:
    loss = np.array(truth["loss"], dtype=float)
    return np.arange(len(loss)), loss


def _nonfinite_loss_from(truth: dict, t0: int, within: int = 10_000) -> bool:
    steps, loss = _losses(truth)
    return bool((~np.isfinite(loss[(steps >= t0) & (steps < t0 + within)])).any())


def _updates_zero(rec: Recording, node: str, t0: int) -> tuple[bool, int]:
    """Whether the node stood still from ``t0`` on: every recorded update exactly 0, and — a parameter that
    needs no gradient gets no update rows — its value's summary the same at every step (over WINDOW steps)."""
    steps, update = series(rec, node, "update", "abs_max")
    after = update[steps >= t0]
    value_steps, norm = series(rec, node, "value", "l2")
    _, total = series(rec, node, "value", "mean")
    held = value_steps >= t0
    summed = held & np.isfinite(total)  # a sentinel row (detail="tiered") holds no sum: NaN mean
    first = norm[value_steps == t0][:1]  # sentinel and complete rows' norms of one tensor differ in the last bits
    still = bool(np.all(np.abs(norm[held] - first) <= 1e-6 * np.abs(first)) and
                 np.all(total[summed] == total[summed][:1]))
    n = int(held.sum())
    return bool(n >= WINDOW and np.all(after == 0) and still), n


def _branch_norm(rec: Recording, family: Family, branch: str, kind: str) -> tuple[np.ndarray, np.ndarray]:
    nodes = [family.parameter_node(p) for p in (f"branch_{branch}.0", f"branch_{branch}.2")]
    found = [series(rec, n, kind, "l2") for n in nodes]
    steps = found[0][0]
    return steps, np.sqrt(sum(np.interp(steps, s, v) ** 2 for s, v in found))


def _imbalance(rec: Recording, family: Family, site: Site, t0: int, kind: str) -> float:
    other = "b" if site.target == "a" else "a"
    steps, own = _branch_norm(rec, family, site.target, kind)
    _, rest = _branch_norm(rec, family, other, kind)
    ratio = own / np.where(rest > 0, rest, np.nan)
    return _ratio(median(steps, ratio, t0 + 5, t0 + 5 + 2 * WINDOW), median(steps, ratio, t0 - 2 * WINDOW, t0))


def healthy_check(truth: dict, rec: Recording) -> tuple[bool, str]:
    """Whether a healthy run trained as one: its loss finite throughout and falling (the median of its last
    50 steps below 0.9× that of its first 10), never relapsing (once below a tenth of that start it never
    returns to half of it: the optimizer-instability symptom of Adam near a zero loss), and no module
    output with the symptom of a catalogue fault (a 20-step median saturated share ≥ 0.5 or dead share
    ≥ 0.9) — a control must not hold a fault."""
    loss = np.array(truth["loss"], dtype=float)
    finite = bool(np.isfinite(loss).all())
    first, last = float(np.median(loss[:10])), float(np.median(loss[-50:]))
    trained = np.flatnonzero(loss < 0.1 * first)
    relapse = bool(len(trained) and np.nanmax(loss[trained[0]:]) >= 0.5 * first)
    worst = {"saturated_fraction": (0.0, ""), "dead_fraction": (0.0, "")}
    for node in rec.nodes:
        if rec.graph() is not None and node in rec.graph().graph.node_names and \
                rec.graph().graph.node(node).role in ("parameter", "input", "target", "loss"):
            continue
        for stat in worst:
            steps, values = series(rec, node, "value", stat)
            levels = [median(steps, values, a, a + WINDOW) for a in range(0, truth["steps"], WINDOW)]
            level = max((v for v in levels if np.isfinite(v)), default=0.0)
            worst[stat] = max(worst[stat], (level, node))
    (saturated, at_s), (dead, at_d) = worst["saturated_fraction"], worst["dead_fraction"]
    ok = finite and last < 0.9 * first and not relapse and saturated < 0.5 and dead < 0.9
    return ok, (f"loss finite {finite}, median {first:.3g} → {last:.3g} (< 0.9×), relapse {relapse}; "
                f"most saturated {saturated:.2f} "
                f"{at_s} (< 0.5), most dead {dead:.2f} {at_d} (< 0.9)")


def validate(truth: dict, rec: Recording) -> tuple[bool, str]:
    """Whether the recording shows the defining symptom of the run's fault, and what was measured."""
    if truth["healthy"]:
        return healthy_check(truth, rec)
    family = families()[truth["family"]]
    fault, t0 = truth["fault"], truth["t0"]
    site = Site(**{**truth["site"], "accept": tuple(truth["site"]["accept"])}) if truth.get("site") else None
    node = family.node(site.observe) if site else ""
    before, after = (t0 - WINDOW, t0), (t0, t0 + WINDOW)
    if fault == "vanish_depth":
        steps, first = series(rec, family.node(FIRST_LAYER[truth["family"]]), "grad", "rms")
        out_steps, out = series(rec, family.node(""), "grad", "rms")
        value = median(steps, first / np.interp(steps, out_steps, out), 0, WINDOW)
        return value < 1e-4, f"first-layer / output gradient rms {value:.1e} (< 1e-4)"
    if fault == "dead_init":
        dead = [float(np.nanmin(v[s < WINDOW])) >= 0.99 for s, v in
                (series(rec, family.node(x.observe), "value", "dead_fraction") for x in family.sites["dead"])]
        return sum(dead) * 2 >= len(dead), f"{sum(dead)}/{len(dead)} ReLUs with dead share ≥ 0.99 in 20 steps"
    if fault in ("vanish_weights", "explode_weights"):
        steps, rms = series(rec, node, "value", "rms")
        if fault == "vanish_weights":  # Adam regrows the weights within ~20 steps: the first 5 steps count
            drop = _ratio(median(steps, rms, t0, t0 + 5), median(steps, rms, *before))
            return drop <= 1 / 30, f"{node} rms ×{drop:.1e} over 5 steps (≤ 1/30)"
        rise = _ratio(float(np.nanmax(np.where(steps >= t0, rms, np.nan))), median(steps, rms, *before))
        nonfinite = _nonfinite_loss_from(truth, t0)
        return bool(rise >= 10 or nonfinite), f"{node} rms ×{rise:.1e} (≥ 10), non-finite loss {nonfinite}"
    if fault == "dead_bias":
        steps, dead = series(rec, node, "value", "dead_fraction")
        chosen = dead[(steps >= t0) & (steps < t0 + WINDOW)]
        low = float(np.min(chosen)) if len(chosen) else float("nan")
        return low >= 0.99, f"{node} dead share ≥ {low:.2f} for 20 steps (≥ 0.99)"
    if fault == "saturate_weights":
        steps, share = series(rec, node, "value", "saturated_fraction")
        _, level = series(rec, node, "value", "abs_mean")
        saturated, mean_abs = median(steps, share, *after), median(steps, level, *after)
        ok = saturated >= 0.5 or mean_abs >= 0.9
        return ok, f"{node} saturated share {saturated:.2f} (≥ 0.5) or mean |y| {mean_abs:.2f} (≥ 0.9)"
    if fault == "grad_bug":
        steps, grad = series(rec, node, "grad", "rms")
        rise = _ratio(float(np.nanmax(grad[(steps >= t0) & (steps < t0 + 3)], initial=np.nan)),
                      median(steps, grad, *before))
        return rise >= 1e3, f"{node} gradient rms ×{rise:.1e} within 3 steps (≥ 1e3)"
    if fault in ("freeze_requires_grad", "freeze_lr0"):
        frozen, n = _updates_zero(rec, family.parameter_node(site.observe), t0)
        return frozen, f"{family.parameter_node(site.observe)}: updates exactly 0 in all {n} steps from t0: {frozen}"
    if fault in ("embedding_copy", "code_dropout"):
        spread = np.array(truth["spread"][site.observe], dtype=float)
        steps = np.arange(len(spread))
        low, high = median(steps, spread, *after), median(steps, spread, *before)
        return bool(low <= 0.01 and high >= 0.1), f"{site.observe} spread {high:.3f} → {low:.4f} (≤ 0.01)"
    if fault == "lr_kill":
        steps, loss = _losses(truth)
        base = median(steps, loss, *before)
        early = loss[(steps > t0) & (steps <= t0 + 2)]
        later = loss[(steps > t0) & (steps <= t0 + WINDOW)]
        killed = bool((~np.isfinite(early) | (early >= 10 * base)).any())
        stays = bool((~np.isfinite(later)).any() or np.median(later) >= 10 * base)
        return killed and stays, (f"loss non-finite or ≥ 10× its median within 2 steps: {killed}, and over the "
                                  f"next 20 steps: {stays}")
    if fault == "lr_start":
        steps, loss = _losses(truth)
        early = loss[steps < 10]
        blown = bool((~np.isfinite(early)).any() or np.max(early) >= 10 * loss[0])
        return blown, f"loss non-finite or ≥ 10× its first value ({loss[0]:.3g}) within 10 steps: {blown}"
    if fault == "lr_unstable":
        steps, loss = _losses(truth)
        base = median(steps, loss, *before)
        chosen = loss[(steps >= t0) & (steps < t0 + 50)]
        peak = float(np.max(chosen)) / base if np.isfinite(chosen).all() else float("inf")
        return 2 <= peak < 100, f"loss peak ×{peak:.1f} its median (2 ≤ peak < 100, finite)"
    if fault == "schedule_ends_early":
        nodes = [n for n in rec.nodes if any("update" in rec.kinds(t.name) for t in rec.tensors_of(n))]
        frozen = all(_updates_zero(rec, n, t0)[0] for n in nodes)
        return frozen, f"updates exactly 0 from t0 in all {len(nodes)} parameter nodes: {frozen}"
    if fault in ("branch_lr", "loss_weight"):
        kind = "update" if fault == "branch_lr" else "grad"
        change = _imbalance(rec, family, site, t0, kind)
        ok = change <= 1 / 30 if fault == "branch_lr" else change >= 30
        return ok, f"branch {site.target} {kind} norm ÷ other branch's ×{change:.1e}"
    if fault in ("log_zero", "empty_mask"):
        bad = _nonfinite_loss_from(truth, t0, 1)
        return bad, f"loss non-finite at t0: {bad}"
    if fault in ("nan_input", "zero_std"):
        steps, nonfinite = series(rec, "input", "value", "nonfinite")
        hit = bool(np.any(nonfinite[steps == t0] > 0))
        return hit, f"input non-finite at t0: {hit}"
    if fault == "outlier_batch":
        steps, loss = _losses(truth)
        ratio = _ratio(float(loss[t0]), median(steps, loss, t0 - WINDOW, t0))
        return ratio >= 10, f"loss at t0 ×{ratio:.0f} its median (≥ 10)"
    if fault == "unnormalised":
        steps, rms = series(rec, "input", "value", "rms")
        rise = _ratio(median(steps, rms, *after), median(steps, rms, *before))
        return rise >= 10, f"input rms ×{rise:.0f} (≥ 10)"
    if fault in ("relu_output", "sigmoid_range", "softmax_ce"):
        steps, loss = _losses(truth)
        late = median(steps, loss, truth["steps"] - 50, truth["steps"])
        floor = 0.3
        if fault == "softmax_ce":
            classes = rec.tensors_of(family.node(""))[0].shape[-1] if rec.tensors_of(family.node("")) else 10
            floor = 0.95 * float(np.log1p((classes - 1) / np.e))
        return bool(late >= floor), f"median loss of the last 50 steps {late:.3g} (≥ {floor:.3g})"
    raise ValueError(f"no validation for fault {fault!r}")


def secondary_effects(truth: dict, rec: Recording) -> dict[str, bool]:
    """For each expected effect label of the fault, whether the recording shows it (measured directly)."""
    family = families()[truth["family"]]
    t0, out = truth["t0"], {}
    for label in truth["chain"]:
        if label == NONFINITE:
            out[label] = _nonfinite_loss_from(truth, t0, 30)
        elif label == DEAD:
            died = False
            for site in family.sites.get("dead", ()):
                steps, share = series(rec, family.node(site.observe), "value", "dead_fraction")
                window = share[(steps >= t0) & (steps < t0 + 30)]
                died |= bool(median(steps, share, t0 - WINDOW, t0) < 0.5 and len(window) and np.max(window) >= 0.9)
            out[label] = died
        elif label == GRAD_VANISHING:
            out[label] = _upstream_gradient_drop(truth, rec, family)
        else:
            raise ValueError(f"no check for effect {label!r}")
    return out


def _upstream_gradient_drop(truth: dict, rec: Recording, family: Family) -> bool:
    """Whether the gradient of a node feeding the faulty module fell ≥ 10× (median of the 5 steps from t0
    against the 20 before): the graph's predecessors of the module's output node, parameters and inputs
    left out."""
    site, t0, stored = truth.get("site"), truth["t0"], rec.graph()
    if not site or stored is None or family.node(site["target"]) not in stored.graph.node_names:
        return False
    for node in stored.graph.predecessors(family.node(site["target"])):
        info = stored.graph.node(node)
        if info.role in ("parameter", "input", "target") or info.is_parameter_group:
            continue
        steps, grad = series(rec, node, "grad", "rms")
        if len(steps) and _ratio(median(steps, grad, t0, t0 + 5), median(steps, grad, t0 - WINDOW, t0)) <= 0.1:
            return True
    return False

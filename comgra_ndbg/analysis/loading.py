"""Reading a recording into a :class:`RunSeries` — the only analysis module that talks to the reader."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from comgra_ndbg.analysis.invariants import LoopFacts, TensorRows
from comgra_ndbg.analysis.output_range import prediction_nodes
from comgra_ndbg.analysis.reference_rules import RunFacts
from comgra_ndbg.analysis.series import RunSeries, build_series, jumps
from comgra_ndbg.analysis.structure import NodeInfo
from comgra_ndbg.stats.statistics import derive_one
from comgra_ndbg.store import schema
from comgra_ndbg.store.reader import Recording

__all__ = ["load_series", "node_info", "load_run_facts", "pass_push", "step_types"]


def load_series(recording: Recording) -> RunSeries:
    """Every summarized series of every tensor, merged per node, plus the KPIs, the dependency graph and what
    the loop-invariant analysis reads (the ``invariant`` log, each input's and target's own rows). At
    sentinel steps, module outputs and gradients read from the steps recorded in full (``series.hold_rows``)."""
    rows: dict[tuple[str, str], list] = {}
    roles: dict[str, str] = {}
    inputs: dict[str, list[TensorRows]] = {"input": [], "target": []}
    for tensor in recording.tensors:
        roles.setdefault(tensor.node, tensor.role)
        for kind in recording.kinds(tensor.name):
            found = recording.summary_rows(tensor.name, kind)
            rows.setdefault((tensor.node, kind), []).append(found)
            if kind == "value" and tensor.role in inputs:
                inputs[tensor.role].append(TensorRows(tensor.name, tensor.dtype, *found))
    kpis = {name: recording.kpi(name) for name in recording.kpi_names}
    stored = recording.graph()
    graph = stored.graph if stored is not None else None
    if graph is not None:
        for node in graph.nodes:
            if node.name in roles:
                roles[node.name] = node.role
    log = tuple(LoopFacts.row(e.step, e.subject, e.message, e.detail) for e in recording.log("invariant"))
    reasons = recording.step_reasons()
    held = np.array(sorted(s for s, reason in reasons.items() if reason.startswith(schema.SENTINEL_REASON)),
                    dtype=np.int64)
    moved = {s for s, reason in reasons.items()  # the tiers saw something move there
             if "tiers:" in reason and reason != schema.SENTINEL_REASON}
    for tensor in inputs["input"]:  # ... or an input moved, which the tiers do not watch
        moved.update(jumps(tensor.steps, tensor.rows).tolist())
    moved = np.array(sorted(moved), dtype=np.int64)
    series = build_series(rows, roles=roles, kpis=kpis, graph=graph, trial=recording.trial,
                          node_order=recording.nodes, info=node_info(recording),
                          loop=LoopFacts(log, tuple(inputs["input"]), tuple(inputs["target"])), held=held,
                          moved=moved)
    return replace(series, pass_push=pass_push(recording, series.steps, prediction_nodes(series)),
                   step_types=step_types(recording, series.steps))


def step_types(recording: Recording, steps: np.ndarray) -> np.ndarray:
    """The type name of each of ``steps`` (``""`` for a step the recording gives no type)."""
    out = np.full(len(steps), "", dtype=object)
    for name in recording.step_types:
        typed = np.asarray(recording.steps_of_type(name))
        at = np.searchsorted(steps, typed)
        keep = at < len(steps)
        at = at[keep][steps[at[keep]] == typed[keep]]
        out[at] = name
    return out


def pass_push(recording: Recording, steps: np.ndarray, nodes: list[str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per node of ``nodes``: the lowest and the highest gradient mean ÷ rms of one forward pass (iteration)
    of each step, aligned with ``steps`` (NaN where a step ran fewer than two passes). A discriminator's
    passes on real and on generated samples pull its output to opposite ends: merged, they look like one
    push. Read only where some step ran several passes, and only for the few prediction nodes."""
    counts = recording.step_iterations
    most = int(counts.max()) if len(counts) else 0
    if most < 2:
        return {}
    found: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for node in nodes:
        tensors = [t.name for t in recording.tensors if t.node == node and schema.KIND_GRAD in recording.kinds(t.name)]
        if len(tensors) != 1:
            continue  # several tensors per node merge per pass too: their passes are not told apart here
        low, high = np.full(len(steps), np.inf), np.full(len(steps), -np.inf)
        seen = np.zeros(len(steps), np.int64)
        for iteration in range(most):
            at, rows = recording.summary_rows(tensors[0], schema.KIND_GRAD, iteration=iteration)
            with np.errstate(divide="ignore", invalid="ignore"):  # a gradient of exactly 0: no ratio (NaN, dropped)
                ratio = derive_one(rows, "mean") / derive_one(rows, "rms")
            index = np.searchsorted(steps, at)
            keep = (index < len(steps)) & np.isfinite(ratio)
            index, ratio = index[keep], ratio[keep]
            keep = steps[index] == at[keep]
            index, ratio = index[keep], ratio[keep]
            np.minimum.at(low, index, ratio)
            np.maximum.at(high, index, ratio)
            np.add.at(seen, index, 1)
        several = seen >= 2
        found[node] = (np.where(several, low, np.nan), np.where(several, high, np.nan))
    return found


def node_info(recording: Recording) -> dict[str, NodeInfo]:
    """Per node: the class of the module whose output it is (or that owns its parameters), the shape of its
    first tensor, the ranks of its parameters, and the dtype of its first tensor."""
    modules = {m.path: m for m in recording.modules}
    out: dict[str, NodeInfo] = {}
    for tensor in recording.tensors:
        known = out.get(tensor.node)
        module = modules.get(tensor.module) or modules.get(tensor.node)
        module_type, holds = (module.class_name, module.parameters) if module is not None else ("", -1)
        if tensor.role == "parameter":
            ranks = (known.parameter_ranks if known else ()) + (len(tensor.shape),)
            out[tensor.node] = NodeInfo(module_type, (), ranks, holds, known.dtype if known else tensor.dtype)
        elif known is None:
            out[tensor.node] = NodeInfo(module_type, tuple(tensor.shape), (), holds, tensor.dtype)
    return out


def load_run_facts(recording: Recording, series: RunSeries | None = None) -> RunFacts:
    """What a comparison with a reference run reads: the series (loaded unless given), the step type of each
    step and the shapes of each parameter node's tensors."""
    series = series if series is not None else load_series(recording)
    types = {int(s): t for t in recording.step_types for s in recording.steps_of_type(t)}
    shapes: dict[str, list[tuple[str, tuple[int, ...]]]] = {}
    for tensor in recording.tensors:
        if tensor.role == "parameter":
            shapes.setdefault(tensor.node, []).append((tensor.name, tuple(tensor.shape)))
    return RunFacts(series, tuple(types.get(int(s), "") for s in series.steps),
                    {node: tuple(shape for _, shape in sorted(found)) for node, found in shapes.items()},
                    str(recording.location))

"""Reading a recording into a :class:`RunSeries` — the only analysis module that talks to the reader."""
from __future__ import annotations

from comgra_ndbg.analysis.invariants import LoopFacts, TensorRows
from comgra_ndbg.analysis.reference_rules import RunFacts
from comgra_ndbg.analysis.series import RunSeries, build_series
from comgra_ndbg.analysis.structure import NodeInfo
from comgra_ndbg.store.reader import Recording

__all__ = ["load_series", "node_info", "load_run_facts"]


def load_series(recording: Recording) -> RunSeries:
    """Every summarized series of every tensor, merged per node, plus the KPIs, the dependency graph and what
    the loop-invariant analysis reads (the ``invariant`` log, each input's and target's own rows)."""
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
    return build_series(rows, roles=roles, kpis=kpis, graph=graph, trial=recording.trial,
                        node_order=recording.nodes, info=node_info(recording),
                        loop=LoopFacts(log, tuple(inputs["input"]), tuple(inputs["target"])))


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

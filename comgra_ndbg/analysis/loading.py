"""Reading a recording into a :class:`RunSeries` — the only analysis module that talks to the reader."""
from __future__ import annotations

from comgra_ndbg.analysis.series import RunSeries, build_series
from comgra_ndbg.analysis.structure import NodeInfo
from comgra_ndbg.store.reader import Recording

__all__ = ["load_series", "node_info"]


def load_series(recording: Recording) -> RunSeries:
    """Every summarized series of every tensor, merged per node, plus the KPIs and the dependency graph."""
    rows: dict[tuple[str, str], list] = {}
    roles: dict[str, str] = {}
    for tensor in recording.tensors:
        roles.setdefault(tensor.node, tensor.role)
        for kind in recording.kinds(tensor.name):
            rows.setdefault((tensor.node, kind), []).append(recording.summary_rows(tensor.name, kind))
    kpis = {name: recording.kpi(name) for name in recording.kpi_names}
    stored = recording.graph()
    graph = stored.graph if stored is not None else None
    if graph is not None:
        for node in graph.nodes:
            if node.name in roles:
                roles[node.name] = node.role
    return build_series(rows, roles=roles, kpis=kpis, graph=graph, trial=recording.trial,
                        node_order=recording.nodes, info=node_info(recording))


def node_info(recording: Recording) -> dict[str, NodeInfo]:
    """Per node: the class of the module whose output it is (or that owns its parameters), the shape of its
    first tensor, and the ranks of its parameters."""
    modules = {m.path: m for m in recording.modules}
    out: dict[str, NodeInfo] = {}
    for tensor in recording.tensors:
        known = out.get(tensor.node)
        module = modules.get(tensor.module) or modules.get(tensor.node)
        module_type, holds = (module.class_name, module.parameters) if module is not None else ("", -1)
        if tensor.role == "parameter":
            ranks = (known.parameter_ranks if known else ()) + (len(tensor.shape),)
            out[tensor.node] = NodeInfo(module_type, (), ranks, holds)
        elif known is None:
            out[tensor.node] = NodeInfo(module_type, tuple(tensor.shape), (), holds)
    return out

"""Reading a recording into a :class:`RunSeries` — the only analysis module that talks to the reader."""
from __future__ import annotations

from comgra_ndbg.analysis.series import RunSeries, build_series
from comgra_ndbg.store.reader import Recording

__all__ = ["load_series"]


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
                        node_order=recording.nodes)

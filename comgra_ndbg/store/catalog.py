"""The catalog: cumulative name tables of a recording (tensors, series, step types, KPIs, modules, graphs).

Ids are assigned once and never change, so every segment file agrees on them and a merge is a plain
concatenation. Each segment stores the whole catalog as it was when the segment was written; the newest
segment's catalog is therefore a superset of every older one.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import h5py
import numpy as np

from comgra_ndbg.store import schema
from comgra_ndbg.store.checksums import decode_text, text_intact, write_dataset
from comgra_ndbg.store.damage import DamagedData

__all__ = ["TensorInfo", "ModuleInfo", "Catalog"]

_STR = h5py.string_dtype("utf-8")


@dataclass(frozen=True)
class TensorInfo:
    """A recorded tensor: its unique name, graph node, role, owning module and first-seen layout."""

    name: str
    node: str
    role: str
    module: str = ""
    dtype: str = ""
    shape: tuple[int, ...] = ()
    batched: bool = False
    bounds: tuple[float, float] | None = None

    @property
    def label(self) -> str:
        """The tensor's name within its node (``weight`` for ``model.fc.weight`` in node ``model.fc``)."""
        prefix = self.node + "."
        return self.name[len(prefix):] if self.name.startswith(prefix) else self.name


@dataclass(frozen=True)
class ModuleInfo:
    """A module seen by ``track_module``: its path, class name and parameter count (own parameters only)."""

    path: str
    class_name: str
    parameters: int


@dataclass
class Catalog:
    """Mutable, append-only name tables; the recorder owns one, the writer stores it, the reader loads it."""

    tensors: list[TensorInfo] = field(default_factory=list)
    series: list[tuple[int, str]] = field(default_factory=list)  # (tensor id, kind)
    step_types: list[str] = field(default_factory=list)
    kpi_names: list[str] = field(default_factory=list)
    modules: list[ModuleInfo] = field(default_factory=list)
    graphs: dict[str, str] = field(default_factory=dict)  # structure hash -> JSON
    graph_of_type: dict[str, str] = field(default_factory=dict)  # step type -> structure hash
    _tensor_ids: dict[str, int] = field(default_factory=dict, repr=False)
    _series_ids: dict[tuple[int, str], int] = field(default_factory=dict, repr=False)
    _type_ids: dict[str, int] = field(default_factory=dict, repr=False)
    _kpi_ids: dict[str, int] = field(default_factory=dict, repr=False)
    version: int = 0  # bumps on every change, so the writer knows when to rewrite

    # ---- lookups / additions ---------------------------------------------------------------------------
    def tensor_id(self, name: str) -> int | None:
        return self._tensor_ids.get(name)

    def add_tensor(self, info: TensorInfo) -> int:
        self._tensor_ids[info.name] = len(self.tensors)
        self.tensors.append(info)
        self.version += 1
        return len(self.tensors) - 1

    def series_id(self, tensor_id: int, kind: str) -> int:
        key = (tensor_id, kind)
        sid = self._series_ids.get(key)
        if sid is None:
            sid = self._series_ids[key] = len(self.series)
            self.series.append(key)
            self.version += 1
        return sid

    def find_series(self, tensor_id: int, kind: str) -> int | None:
        return self._series_ids.get((tensor_id, kind))

    def step_type_id(self, step_type: str) -> int:
        tid = self._type_ids.get(step_type)
        if tid is None:
            tid = self._type_ids[step_type] = len(self.step_types)
            self.step_types.append(step_type)
            self.version += 1
        return tid

    def kpi_id(self, name: str) -> int:
        kid = self._kpi_ids.get(name)
        if kid is None:
            kid = self._kpi_ids[name] = len(self.kpi_names)
            self.kpi_names.append(name)
            self.version += 1
        return kid

    def add_module(self, info: ModuleInfo) -> None:
        """Add a tracked module; a path already known (a resumed trial tracking its model again) is kept once."""
        if any(m.path == info.path for m in self.modules):
            return
        self.modules.append(info)
        self.version += 1

    def add_graph(self, structure_hash: str, graph_json: str) -> bool:
        if structure_hash in self.graphs:
            return False
        self.graphs[structure_hash] = graph_json
        self.version += 1
        return True

    def set_graph_of_type(self, step_type: str, structure_hash: str) -> None:
        if self.graph_of_type.get(step_type) != structure_hash:
            self.graph_of_type[step_type] = structure_hash
            self.version += 1

    def copy(self) -> Catalog:
        """A copy that later additions leave unchanged: what a segment written on another thread stores."""
        return Catalog(list(self.tensors), list(self.series), list(self.step_types), list(self.kpi_names),
                       list(self.modules), dict(self.graphs), dict(self.graph_of_type), dict(self._tensor_ids),
                       dict(self._series_ids), dict(self._type_ids), dict(self._kpi_ids), self.version)

    # ---- HDF5 ----------------------------------------------------------------------------------------
    def write(self, f: h5py.File) -> None:
        """Store every table into an open, empty file, each with its checksum (``store/checksums.py``)."""
        for column in schema.TENSOR_COLUMNS:
            values = _tensor_column(self.tensors, column)
            write_dataset(f, f"{schema.TENSORS}/{column}", values, text=values.dtype == object)
        write_dataset(f, schema.SERIES_TENSOR, np.array([s[0] for s in self.series], dtype=np.int32), text=False)
        write_dataset(f, schema.SERIES_KIND, [s[1] for s in self.series], text=True)
        write_dataset(f, schema.STEP_TYPES, self.step_types, text=True)
        write_dataset(f, schema.KPI_NAMES, self.kpi_names, text=True)
        write_dataset(f, schema.MODULE_PATH, [m.path for m in self.modules], text=True)
        write_dataset(f, schema.MODULE_CLASS, [m.class_name for m in self.modules], text=True)
        write_dataset(f, schema.MODULE_PARAMETERS, np.array([m.parameters for m in self.modules], dtype=np.int64),
                      text=False)
        f.create_group(schema.GRAPHS)
        for key, text in self.graphs.items():
            write_dataset(f, f"{schema.GRAPHS}/{key}", text, text=True)
        write_dataset(f, schema.GRAPH_INDEX, json.dumps(self.graph_of_type, sort_keys=True), text=True)

    @classmethod
    def read(cls, f: h5py.File) -> Catalog:
        """Load the tables a segment file holds; raises ``DamagedData`` when one fails its checksum (h5py's
        ``OSError`` for a damaged chunk or header passes through)."""
        catalog = cls()
        columns = {c: _column(f, f"{schema.TENSORS}/{c}") for c in schema.TENSOR_COLUMNS}
        for i in range(len(columns["name"])):
            low, high = float(columns["bounds_low"][i]), float(columns["bounds_high"][i])
            shape_text = columns["shape"][i]
            catalog.add_tensor(TensorInfo(
                name=columns["name"][i],
                node=columns["node"][i],
                role=columns["role"][i],
                module=columns["module"][i],
                dtype=columns["dtype"][i],
                shape=tuple(json.loads(shape_text)) if shape_text else (),
                batched=bool(columns["batched"][i]),
                bounds=None if np.isnan(low) else (low, high),
            ))
        for tensor_id, kind in zip(_column(f, schema.SERIES_TENSOR), _column(f, schema.SERIES_KIND)):
            catalog.series_id(int(tensor_id), kind)
        for name in _column(f, schema.STEP_TYPES):
            catalog.step_type_id(name)
        for name in _column(f, schema.KPI_NAMES):
            catalog.kpi_id(name)
        for path, cls_name, count in zip(_column(f, schema.MODULE_PATH), _column(f, schema.MODULE_CLASS),
                                         _column(f, schema.MODULE_PARAMETERS)):
            catalog.add_module(ModuleInfo(path, cls_name, int(count)))
        for key in f[schema.GRAPHS]:
            catalog.add_graph(key, _column(f, f"{schema.GRAPHS}/{key}")[0])
        if schema.GRAPH_INDEX in f:
            for step_type, key in json.loads(_column(f, schema.GRAPH_INDEX)[0]).items():
                catalog.set_graph_of_type(step_type, key)
        return catalog

    def to_dict(self) -> dict:
        """A JSON-able view (for ``info`` and exports)."""
        return {
            "tensors": [asdict(t) for t in self.tensors],
            "series": [{"tensor": self.tensors[t].name, "kind": k} for t, k in self.series],
            "step_types": list(self.step_types),
            "kpis": list(self.kpi_names),
            "modules": [asdict(m) for m in self.modules],
            "graphs": sorted(self.graphs),
            "graph_of_type": dict(self.graph_of_type),
        }


def _tensor_column(tensors: list[TensorInfo], column: str) -> np.ndarray:
    if column == "batched":
        return np.array([t.batched for t in tensors], dtype=np.bool_)
    if column in ("bounds_low", "bounds_high"):
        i = 0 if column == "bounds_low" else 1
        return np.array([np.nan if t.bounds is None else t.bounds[i] for t in tensors], dtype=np.float64)
    if column == "shape":
        values = [json.dumps(list(t.shape)) for t in tensors]
    else:
        values = [getattr(t, column) for t in tensors]
    return np.array(values, dtype=object)


def _column(f: h5py.File, path: str) -> np.ndarray:
    """A catalog table as read: decoded strings (checked against their checksum) or numbers."""
    dataset = f[path]
    if dataset.dtype.kind != "O":
        return dataset[()]
    values = decode_text(dataset[()])
    if not text_intact(dataset, values):
        raise DamagedData(f.filename, path, "its text fails its checksum")
    return values

"""``comgra_ndbg.stats`` is the bottom layer: its modules import numpy, torch, numba (with llvmlite, numba's
code generator), Triton (only ``fused_kernels``, only where it is installed), the standard library and each
other, never the recorder, store, analysis or anything else of ``comgra_ndbg``. The import graph is read from
the source with ``ast``, imports inside functions and ``if`` blocks included."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import comgra_ndbg.stats
from comgra_ndbg.stats import fields
from comgra_ndbg.store import schema

STATS = Path(comgra_ndbg.stats.__file__).parent
PACKAGE = "comgra_ndbg.stats"
THIRD_PARTY = {"numpy", "torch", "numba", "llvmlite", "triton"}


def imported_modules(source: str, module: str) -> list[str]:
    """Every module ``source`` (the text of ``module``) imports, relative imports resolved to full names."""
    package = module.removesuffix(".__init__") if module.endswith(".__init__") else module.rsplit(".", 1)[0]
    names: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            if node.module is None or target in (PACKAGE, "comgra_ndbg"):  # ``from X import m``: m may be a module
                names.extend(f"{target}.{alias.name}" for alias in node.names)
            else:
                names.append(target)
    return names


def forbidden(names: list[str]) -> list[str]:
    """The names of ``names`` outside the layer: comgra_ndbg code outside ``stats`` or an unlisted library."""
    allowed_roots = THIRD_PARTY | set(sys.stdlib_module_names)
    bad = []
    for name in names:
        root = name.split(".")[0]
        if root == "comgra_ndbg":
            if not (name == PACKAGE or name.startswith(PACKAGE + ".")):
                bad.append(name)
        elif root not in allowed_roots:
            bad.append(name)
    return bad


def test_the_checker_finds_imports_from_above_the_layer_in_every_spelling() -> None:
    source = """
from __future__ import annotations
import numpy as np
from comgra_ndbg.stats import kernels
from . import exact
import comgra_ndbg.store.schema
from comgra_ndbg.recorder.policy import Policy
from ..analysis import events
from comgra_ndbg import errors
import h5py

def later():
    from comgra_ndbg.store.reader import Reader
"""
    names = imported_modules(source, "comgra_ndbg.stats.example")
    assert "comgra_ndbg.stats.exact" in names and "comgra_ndbg.stats.kernels" in names
    assert sorted(forbidden(names)) == sorted([
        "comgra_ndbg.store.schema", "comgra_ndbg.recorder.policy", "comgra_ndbg.analysis", "comgra_ndbg.errors",
        "h5py", "comgra_ndbg.store.reader"])


def module_name(path: Path) -> str:
    return ".".join((PACKAGE, *path.relative_to(STATS).with_suffix("").parts))


def test_the_stats_layer_imports_nothing_from_the_layers_above_it() -> None:
    files = sorted(STATS.rglob("*.py"))
    assert {"fields.py", "kernels.py", "reducer.py", "statistics.py", "entries.py"} <= {f.name for f in files}
    found = {}
    for path in files:
        names = imported_modules(path.read_text(encoding="utf-8"), module_name(path))
        if forbidden(names):
            found[module_name(path)] = forbidden(names)
    assert found == {}, f"modules of comgra_ndbg/stats importing from outside the layer: {found}"


def test_only_the_compiled_sources_import_numba() -> None:
    """Everything outside ``stats.compiled`` runs without numba: the module built ahead of time replaces it."""
    found = {}
    for path in sorted(STATS.rglob("*.py")):
        if path.parent.name == "compiled":
            continue
        names = imported_modules(path.read_text(encoding="utf-8"), module_name(path))
        numba = [n for n in names if n.split(".")[0] in ("numba", "llvmlite") or n.startswith(f"{PACKAGE}.compiled.")]
        if numba:
            found[module_name(path)] = numba
    assert found == {"comgra_ndbg.stats.backend": ["comgra_ndbg.stats.compiled.entries"]}, found


def test_the_layer_is_one_package_and_its_compiled_sources_of_modules_under_400_lines() -> None:
    assert [p.name for p in STATS.iterdir() if p.is_dir() and p.name != "__pycache__"] == ["compiled"]
    too_long = {p.name: n for p in STATS.rglob("*.py") if (n := len(p.read_text(encoding="utf-8").splitlines())) > 400}
    assert too_long == {}


def test_the_store_schema_names_the_same_row_layout_the_kernels_fill() -> None:
    assert schema.STAT_FIELDS is fields.STAT_FIELDS and schema.FIELD is fields.FIELD
    assert (schema.NUM_FIELDS, schema.MIN_FIELDS, schema.MAX_FIELDS) == (17, (7,), (8,))
    assert schema.identity_row().tolist() == [0.0] * 7 + [float("inf"), float("-inf")] + [0.0] * 8

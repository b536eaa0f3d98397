"""Module tree from parameter names and element counts: exact hierarchy and counts."""
from __future__ import annotations

import pytest
from torch import nn

from comgra_ndbg.graph import GraphError, ModuleInfo, module_tree


def test_tree_of_a_tracked_model_in_definition_order() -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Sequential(nn.Linear(4, 4, bias=False), nn.LayerNorm(4)))
    counts = {f"model.{name}": p.numel() for name, p in model.named_parameters()}

    assert module_tree(counts) == [
        ModuleInfo("model", None, 0, 0, 40, (), ("model.0", "model.2")),
        ModuleInfo("model.0", "model", 1, 16, 16, ("model.0.weight", "model.0.bias"), ()),
        ModuleInfo("model.2", "model", 1, 0, 24, (), ("model.2.0", "model.2.1")),
        ModuleInfo("model.2.0", "model.2", 2, 16, 16, ("model.2.0.weight",), ()),
        ModuleInfo("model.2.1", "model.2", 2, 8, 8, ("model.2.1.weight", "model.2.1.bias"), ()),
    ]


def test_parameters_of_the_root_module_make_a_root_node() -> None:
    assert module_tree({"scale": 1, "encoder.weight": 6, "head.bias": 2}) == [
        ModuleInfo("", None, 0, 1, 9, ("scale",), ("encoder", "head")),
        ModuleInfo("encoder", "", 1, 6, 6, ("encoder.weight",), ()),
        ModuleInfo("head", "", 1, 2, 2, ("head.bias",), ()),
    ]


def test_several_top_modules_and_an_empty_mapping() -> None:
    assert [(m.path, m.total_parameters) for m in module_tree({"a.x.w": 2, "b.w": 3, "a.y.w": 4})] == [
        ("a", 6), ("a.x", 2), ("a.y", 4), ("b", 3),
    ]
    assert module_tree({}) == []


@pytest.mark.parametrize("bad", [{"": 1}, {"a..w": 1}, {"a.w.": 1}, {"a.w": -1}, {"a.w": 1.5}])
def test_bad_names_and_counts_are_rejected(bad: dict) -> None:
    with pytest.raises(GraphError):
        module_tree(bad)

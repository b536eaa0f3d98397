"""Pass-through chains: which nodes carry one signal unit for unit, from module classes or structure."""
from __future__ import annotations

from comgra_ndbg.analysis.structure import NodeInfo, passes_through, signal_chain
from comgra_ndbg.graph.model import DependencyGraph, GraphEdge, GraphNode


def graph(edges, parameters=()):
    names = sorted({n for e in edges for n in e})
    return DependencyGraph(tuple(GraphNode(n, "parameter" if n in parameters else "intermediate", "", (n,),
                                           n in parameters) for n in names),
                           tuple(GraphEdge(a, b, "forward") for a, b in edges))


def test_module_classes_decide_where_the_signal_keeps_its_units() -> None:
    g = graph([("fc", "scale"), ("scale", "norm"), ("norm", "act"), ("act", "fc2"), ("fc2", "act2")])
    info = {"fc": NodeInfo("Linear"), "scale": NodeInfo("Dropout"), "norm": NodeInfo("LayerNorm"),
            "act": NodeInfo("GELU"), "fc2": NodeInfo("Linear"), "act2": NodeInfo("ReLU")}
    assert signal_chain(g, info, "fc") == {"fc", "scale", "norm", "act"}
    assert signal_chain(g, info, "fc2") == {"fc2", "act2"}


def test_unknown_modules_pass_through_when_one_input_no_weight_matrix_and_the_same_shape() -> None:
    g = graph([("x", "pre"), ("w", "pre"), ("pre", "scaled"), ("g", "scaled"), ("scaled", "out"),
               ("out", "mixed"), ("m", "mixed")], parameters={"w", "g", "m"})
    info = {"pre": NodeInfo(shape=(8, 16)), "scaled": NodeInfo(shape=(8, 16)), "out": NodeInfo(shape=(8, 16)),
            "mixed": NodeInfo(shape=(8, 16)), "w": NodeInfo(parameter_ranks=(2, 1)),
            "g": NodeInfo(parameter_ranks=(1,)), "m": NodeInfo(parameter_ranks=(2,))}
    assert passes_through(g, info, "scaled")  # a per-unit gain keeps units apart
    assert not passes_through(g, info, "mixed")  # a weight matrix mixes them
    assert signal_chain(g, info, "pre") == {"pre", "scaled", "out"}


def test_a_merge_of_two_signals_or_a_reshape_ends_the_chain() -> None:
    g = graph([("a", "sum"), ("b", "sum"), ("a", "flat")])
    info = {"a": NodeInfo(shape=(8, 4, 4)), "b": NodeInfo(shape=(8, 4, 4)), "sum": NodeInfo(shape=(8, 4, 4)),
            "flat": NodeInfo(shape=(8, 16))}
    assert signal_chain(g, info, "a") == {"a"}


def test_a_container_without_weights_of_its_own_passes_its_last_layers_output_through() -> None:
    g = graph([("dec.4", "dec.5"), ("dec.5", "model")])
    info = {"dec.4": NodeInfo("Linear", (8, 4), (), 20), "dec.5": NodeInfo("Sigmoid", (8, 4), (), 0),
            "model": NodeInfo("Autoencoder", (8, 4), (), 0)}
    assert signal_chain(g, info, "dec.4") == {"dec.4", "dec.5", "model"}
    info["model"] = NodeInfo("Head", (8, 4), (), 12)  # a module with weights of its own mixes
    assert signal_chain(g, info, "dec.4") == {"dec.4", "dec.5"}

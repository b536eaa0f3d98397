"""Every component id of the explorer, in one place.

Layout, callbacks and the browser tests import these names, so an id is never a string repeated across
files. Plain ids are strings; the prev/next buttons share one pattern-matching id (a dict) whose
``selector`` says which selector they step and ``delta`` in which direction.
"""
from __future__ import annotations

# ---- selectors (each has a prev/next stepper pair) -------------------------------------------------------
TRIAL = "trial"
STEP_TYPE = "step-type"
STEP = "step"  # a slider over the positions of the step type's recorded steps
ITERATION = "iteration"
NODE = "node"
TENSOR = "tensor"  # the tensor within the node (its role there: weight, bias, ...)
KIND = "kind"
SAMPLE = "sample"
STAT = "statistic"  # the statistic the timeline shows
COLLAPSE = "collapse-modules"
STEP_LABEL = "step-label"

# Selector name -> component id; the names are the keys of ``state.Selection`` the selector sets.
SELECTORS: dict[str, str] = {
    "trial": TRIAL,
    "step_type": STEP_TYPE,
    "step": STEP,
    "iteration": ITERATION,
    "node": NODE,
    "tensor": TENSOR,
    "kind": KIND,
    "sample": SAMPLE,
}
STEPPER_TYPE = "stepper"


def stepper(selector: str, delta: int) -> dict[str, str | int]:
    """The id of the prev (``delta=-1``) or next (``+1``) button of ``selector``."""
    return {"type": STEPPER_TYPE, "selector": selector, "delta": delta}


def stepper_button_id(selector: str, delta: int) -> str:
    """The DOM id Dash renders for a stepper button (its dict id as sorted, compact JSON)."""
    return '{"delta":%d,"selector":"%s","type":"%s"}' % (delta, selector, STEPPER_TYPE)


# ---- state -----------------------------------------------------------------------------------------------
SELECTION = "selection-store"  # {"wanted": {...}, "selection": {...}}
GENERATION = "generation-store"  # {trial: generation}, bumped when a live recording grew
INTERVAL = "refresh-interval"
GRAPH_KEY = "graph-key-store"
TIMELINE_KEY = "timeline-key-store"
STATUS = "status"

# ---- graph -----------------------------------------------------------------------------------------------
GRAPH = "graph"

# ---- tabs ------------------------------------------------------------------------------------------------
TABS = "tabs"
TAB_TENSORS = "tab-tensors"
TAB_DIAGNOSIS = "tab-diagnosis"
TAB_KPIS = "tab-kpis"
TAB_NOTES = "tab-notes"
TAB_NETWORK = "tab-network"
TAB_COMPARE = "tab-compare"
TAB_CUSTOM = "tab-custom"

# ---- Tensors tab -----------------------------------------------------------------------------------------
TENSOR_HEADER = "tensor-header"
STATS_TABLE = "stats-table"
HISTOGRAM = "histogram"
VALUES_MODE = "values-mode"
VALUES_PAGE = "values-page"
VALUES = "values"
TENSORS_BODY = "tensors-body"  # filled after the first paint, so plotly does not delay the graph
TIMELINE_TYPE = "timeline"
TIMELINE = {"type": TIMELINE_TYPE, "index": 0}  # a dict id: the selection listens to it with ALL, present or not
TIMELINE_BOX = "timeline-box"

# ---- other tabs ------------------------------------------------------------------------------------------
DIAGNOSIS = "diagnosis"
DIAGNOSIS_JUMP_TYPE = "diagnosis-jump"
ANALYZE = "analyze-now"  # the Diagnosis tab's button that runs comgra_ndbg.analyze for the trial
ANALYZE_STATUS = "analyze-status"
ANALYSES = "analyses-store"  # {trial: stamp of its stored analysis}, changes when an analysis is stored
KPIS = "kpis"
NOTES = "notes"
NETWORK = "network"
COMPARE_MODE = "compare-mode"
COMPARE_TRIAL = "compare-trial"
COMPARE_STEP = "compare-step"
COMPARE = "compare"
CUSTOM = "custom"


def diagnosis_jump(item: str, node: str, step: int, kind: str) -> dict[str, str | int]:
    """The id of a clickable hypothesis or event (``item``: ``h0``, ``e3``, … unique in the tab) that selects
    ``node`` (``""``: keep the node) with ``kind`` (``""``: keep the kind) at ``step``."""
    return {"type": DIAGNOSIS_JUMP_TYPE, "item": item, "node": node, "step": step, "kind": kind}

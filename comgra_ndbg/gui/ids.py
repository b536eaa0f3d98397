"""Every component id of the explorer, in one place.

Layout, callbacks, client-side scripts and the browser tests import these names, so an id is never a string
repeated across files. Plain ids are strings; the prev/next buttons share one pattern-matching id (a dict)
whose ``selector`` says which selector they step and ``delta`` in which direction, the diagnosis rows one
whose fields say where choosing them goes, and the export buttons one naming the plot and the format.
"""
from __future__ import annotations

# ---- selectors (each has a prev/next stepper pair) -------------------------------------------------------
TRIAL = "trial"
STEP_TYPE = "step-type"
STEP = "step"  # a slider over the positions of the step type's recorded steps
STEP_BOX = "step-box"  # a step number typed in: the nearest recorded step
STEP_PREV = "step-prev"  # moves the slider in the browser (so quick presses add up), which asks the server once
STEP_NEXT = "step-next"
ITERATION = "iteration"
NODE = "node"
TENSOR = "tensor"  # the tensor within the node (its role there: weight, bias, ...)
KIND = "kind"
SAMPLE = "sample"
RANK = "rank"  # the rank of a distributed trial (gui/ranks.py)
STAT = "statistic"  # the statistic the timeline shows
STEP_LABEL = "step-label"
FOLLOW = "follow-live"  # checklist: move to each new step of a live recording
THEME = "theme"

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
    "rank": RANK,
}
STEPPER_TYPE = "stepper"
SNAPSHOT_STEPPER = "snapshot"  # the ``selector`` of the buttons that step to the previous / next snapshot


def stepper(selector: str, delta: int) -> dict[str, str | int]:
    """The id of the prev (``delta=-1``) or next (``+1``) button of ``selector``."""
    return {"type": STEPPER_TYPE, "selector": selector, "delta": delta}


def stepper_button_id(selector: str, delta: int) -> str:
    """The DOM id Dash renders for a stepper button (its dict id as sorted, compact JSON)."""
    return '{"delta":%d,"selector":"%s","type":"%s"}' % (delta, selector, STEPPER_TYPE)


# ---- state -----------------------------------------------------------------------------------------------
ADDRESS = "address-store"  # the address of the view the server drew; the page's script shows it in the URL
STEP_DATA = "step-data-store"  # the views of the steps around the current one (gui/stepping.py)
STEP_ASK = "step-ask-store"  # a step, typed step or address the page could not show itself: the server's input
SELECTION = "selection-store"  # {"wanted": {...}, "selection": {...}}
KEYS = "keys-store"  # what each view was last computed for, so unchanged views are not sent again
GENERATION = "generation-store"  # {trial: generation}, bumped when a live recording grew
INTERVAL = "refresh-interval"
STATUS = "status"
CLIENT = "client-store"  # written by client-side callbacks only (their required output)

# ---- graph -----------------------------------------------------------------------------------------------
GRAPH = "graph"
GRAPH_VIEW = "graph-view-store"  # what the client-side script applies: selected item, colours, centring
GRAPH_SEARCH = "graph-search"
NODE_NAMES = "node-names-store"  # every node's name; the search lists those matching what is typed
GRAPH_FIT = "graph-fit"
GRAPH_CENTRE = "graph-centre"
GRAPH_EXPAND = "graph-expand-all"
GRAPH_DEFAULT = "graph-default-boxes"
GRAPH_OPTIONS = "graph-options"  # checklist: implied edges, unused parameters
COLOUR = "graph-colour"  # what the node colour shows: role, or a statistic at the step
GRAPH_NOTE = "graph-note"
GRAPH_HOVER = "graph-hover"
COLOUR_SCALE = "graph-colour-scale"

# ---- tabs ------------------------------------------------------------------------------------------------
TABS = "tabs"
TAB_TENSORS = "tab-tensors"
TAB_DIAGNOSIS = "tab-diagnosis"
TAB_DISTRIBUTION = "tab-distribution"
TAB_LAYERS = "tab-layers"
TAB_KPIS = "tab-kpis"
TAB_NOTES = "tab-notes"
TAB_NETWORK = "tab-network"
TAB_COMPARE = "tab-compare"
TAB_CUSTOM = "tab-custom"
TAB_PROFILE = "tab-profile"
TAB_NAMES = {TAB_TENSORS: "tensors", TAB_DISTRIBUTION: "distribution", TAB_DIAGNOSIS: "diagnosis",
             TAB_LAYERS: "layers", TAB_KPIS: "kpis",
             TAB_NOTES: "notes", TAB_NETWORK: "network", TAB_COMPARE: "compare", TAB_CUSTOM: "custom",
             TAB_PROFILE: "profile"}

# ---- Tensors tab -----------------------------------------------------------------------------------------
TENSOR_HEADER = "tensor-header"
STATS_TABLE = "stats-table"
HISTOGRAM = "histogram"  # the panel: a histogram drawn by the page (histogramscript) or a note
HISTOGRAM_NOTE = "histogram-note"  # the note in place of a histogram at a step without a snapshot
VALUES_MODE = "values-mode"
VALUES_PAGE = "values-page"
VALUES = "values"
VALUES_NOTE = "values-note"  # the note in place of element values at a step without a snapshot
VALUES_IMAGE = "values-image"  # a snapshot's element values drawn as an image (value_image)
TIMELINE = "timeline"
TIMELINE_BOX = "timeline-box"
TIMELINE_RANGE = "timeline-range"  # the steps the user zoomed the timeline to, [low, high], or None: all of them
OVERLAY_NODES = "overlay-nodes"
OVERLAY_TRIALS = "overlay-trials"
TIMELINE_OPTIONS = "timeline-options"  # checklist: log y
EMA = "ema"  # smoothing factor of the timeline, 0 = off
DISTRIBUTION = "distribution"  # histograms of the snapshots over steps, as a heatmap

# ---- other tabs ------------------------------------------------------------------------------------------
DIAGNOSIS = "diagnosis"
DIAGNOSIS_JUMP_TYPE = "diagnosis-jump"
EVIDENCE = "evidence"  # the chosen hypothesis' or event's evidence: plot, thresholds, remedy
TRIAL_SORT = "trial-sort"  # the sweep column the trial selector's options are sorted by
TRIAL_ORDER = "trial-order"  # ascending / descending
TRIAL_FILTER = "trial-filter"  # "type=exploding, lr>=0.1": which trials the selector lists
TRIAL_NOTE = "trial-note"  # how many trials match, or why the filter cannot be read
SIGNATURE = "diagnosis-signature"  # the failure signature image: layer norms in the steps before the failure
ANALYZE = "analyze-now"  # the Diagnosis tab's button that runs comgra_ndbg.analyze for the trial
ANALYZE_STATUS = "analyze-status"
ANALYSES = "analyses-store"  # {trial: stamp of its stored analysis}, changes when an analysis is stored
GRADIENT_FLOW = "gradient-flow"
UPDATE_RATIO = "update-ratio"
LAYERS_NOTE = "layers-note"
KPIS = "kpis"
NOTES = "notes"
NETWORK = "network"
COMPARE_MODE = "compare-mode"
COMPARE_TRIAL = "compare-trial"
COMPARE_STEP = "compare-step"
COMPARE = "compare"
CUSTOM = "custom"
PROFILE = "profile"  # the Profile tab: per-layer time and memory, process memory

# ---- export ----------------------------------------------------------------------------------------------
EXPORT_TYPE = "export"


def export(target: str, fmt: str) -> dict[str, str]:
    """The id of the button that saves the plot ``target`` (a ``dcc.Graph`` id, or the graph) as ``fmt``
    (``png`` or ``csv``)."""
    return {"type": EXPORT_TYPE, "target": target, "format": fmt}


def diagnosis_jump(item: str, node: str, step: int, kind: str) -> dict[str, str | int]:
    """The id of a clickable hypothesis or event (``item``: ``h0``, ``e3``, … unique in the tab) that selects
    ``node`` (``""``: keep the node) with ``kind`` (``""``: keep the kind) at ``step``."""
    return {"type": DIAGNOSIS_JUMP_TYPE, "item": item, "node": node, "step": step, "kind": kind}

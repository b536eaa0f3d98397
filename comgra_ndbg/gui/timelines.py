"""Pure builders of plots over steps: timelines with overlays, smoothing and log scale, the marks of
events and of a rule's evidence (onset, baseline, threshold), KPIs, and one line per layer.

Lines are plain SVG scatter traces (no WebGL: it costs a context per plot and warns in current Chromium);
a series longer than :data:`MAX_POINTS` is reduced to the minimum and maximum of equal step buckets, so a
spike is never averaged away. Clicking a point selects its step (``clickData.points[0].x``).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from comgra_ndbg.analysis.events import Event
from comgra_ndbg.gui.figures import THEMES, format_number, plot_title, step_line, themed

__all__ = ["EVENT_COLOR", "EvidenceMarks", "decimate", "ema", "event_annotations", "event_shapes", "event_text",
           "evidence_shapes", "kpi_figure", "layers_figure", "step_marker", "timeline_figure", "viridis", "visible"]

TRACE_COLORS = ("#1F77B4", "#FF7F0E", "#2CA02C", "#9467BD", "#8C564B", "#E377C2", "#17BECF", "#BCBD22",
                "#7F7F7F", "#D62728")
EVENT_COLOR = "#F28C28"  # event lines on timelines, nodes with events in the graph
BASELINE_COLOR = "#6B7280"
THRESHOLD_COLOR = "#DC2626"
MAX_POINTS = 2_000  # points per trace drawn as they are; a longer series is reduced to the minimum and maximum of
# 1,000 buckets — a pair per pixel column of a timeline up to 1,000 px wide — so a spike stays visible, the page
# gets a third of the data of 6,000 points and a node tap is drawn sooner; zooming in sends the zoomed range
# reduced the same way (:func:`visible`), so detail appears as the range narrows
LAYER_POINTS = 600  # points per line of the per-layer plots, which draw hundreds of lines


def step_marker(step: int | None, theme: str = "light") -> list[dict[str, Any]]:
    """The vertical line that marks the current step on a timeline (none when no step is selected)."""
    return step_line(step, theme)


def decimate(steps: np.ndarray, values: np.ndarray, limit: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """At most about ``limit`` points of a series: the series itself when short enough, else the minimum and
    the maximum of each of ``limit // 2`` equal buckets, in step order (NaN buckets dropped).

    >>> decimate(np.arange(8), np.array([0, 5, 1, 1, 2, -3, 2, 2.0]), limit=4)
    (array([0, 1, 4, 5]), array([ 0.,  5.,  2., -3.]))
    """
    steps, values = np.asarray(steps), np.asarray(values, dtype=np.float64)
    if len(steps) <= limit:
        return steps, values
    # the buckets of np.array_split, found at once: a 10,000-step series is reduced in about a millisecond
    count = limit // 2
    size, extra = divmod(len(steps), count)
    starts = np.arange(count) * size + np.minimum(np.arange(count), extra)
    bucket = np.repeat(np.arange(count), np.diff(np.append(starts, len(steps))))
    finite = np.isfinite(values)
    low = np.minimum.reduceat(np.where(finite, values, np.inf), starts)
    high = np.maximum.reduceat(np.where(finite, values, -np.inf), starts)
    keep = np.union1d(_first_per_bucket(finite & (values == low[bucket]), bucket),
                      _first_per_bucket(finite & (values == high[bucket]), bucket))
    return steps[keep], values[keep]


def _first_per_bucket(mask: np.ndarray, bucket: np.ndarray) -> np.ndarray:
    """The first index where ``mask`` holds in each bucket that has one (argmin / argmax keep the first)."""
    where = np.flatnonzero(mask)
    return where[np.unique(bucket[where], return_index=True)[1]]


def visible(steps: np.ndarray, values: np.ndarray, low: float, high: float) -> tuple[np.ndarray, np.ndarray]:
    """The part of a series (sorted by step) drawn in the range ``[low, high]`` of steps: the points inside,
    and the nearest one outside on each side, so the line runs on to both edges of the plot.

    >>> visible(np.array([0, 10, 20, 30, 40]), np.array([0., 1., 2., 3., 4.]), 12, 28)
    (array([10, 20, 30]), array([1., 2., 3.]))
    """
    steps, values = np.asarray(steps), np.asarray(values)
    first = max(int(np.searchsorted(steps, low, side="left")) - 1, 0)
    last = min(int(np.searchsorted(steps, high, side="right")) + 1, len(steps))
    return steps[first:last], values[first:last]


def ema(values: np.ndarray, factor: float) -> np.ndarray:
    """Exponential moving average with bias correction (as TensorBoard smooths), skipping non-finite values.

    >>> ema(np.array([1.0, 3.0, np.nan, 3.0]), 0.5).round(4).tolist()
    [1.0, 2.3333, 2.3333, 2.7143]
    """
    values = np.asarray(values, dtype=np.float64)
    if factor <= 0:
        return values
    out = np.empty_like(values)
    average, weight = 0.0, 0.0
    for i, v in enumerate(values):
        if np.isfinite(v):
            average = factor * average + (1 - factor) * v
            weight = factor * weight + (1 - factor)
        out[i] = average / weight if weight else np.nan
    return out


def event_text(event: Event) -> str:
    """One line describing an event, as hover text and table titles.

    >>> event_text(Event("activation_regime", "h", "value", "normal", "saturated", 10, 29, 0.9, 0.7))
    'activation_regime: normal → saturated · h (value) · steps 10–29 · magnitude 0.9 · strength 0.7'
    """
    return (f"{event.family}: {event.from_state} → {event.to_state} · {event.node} ({event.kind}) · steps "
            f"{event.onset}–{event.end} · magnitude {format_number(event.magnitude)} · strength "
            f"{format_number(event.strength)}")


def _by_onset(events: Sequence[Event]) -> dict[int, list[Event]]:
    grouped: dict[int, list[Event]] = {}
    for event in sorted(events, key=lambda e: (e.onset, e.node, e.family, e.kind)):
        grouped.setdefault(int(event.onset), []).append(event)
    return grouped


def event_shapes(events: Sequence[Event]) -> list[dict[str, Any]]:
    """A dashed vertical line at each distinct onset step of ``events`` (a timeline's event marks)."""
    return [{"type": "line", "xref": "x", "yref": "paper", "x0": onset, "x1": onset, "y0": 0, "y1": 1,
             "line": {"color": EVENT_COLOR, "width": 1.5, "dash": "dash"}} for onset in _by_onset(events)]


def event_annotations(events: Sequence[Event]) -> list[dict[str, Any]]:
    """A label at the top of each event line: the new states, with every event of that onset as hover text."""
    return [{"x": onset, "xref": "x", "y": 1, "yref": "paper", "yanchor": "top", "xanchor": "left",
             "showarrow": False, "text": " · ".join(dict.fromkeys(f"⚑ {e.to_state}" for e in group)),
             "hovertext": "<br>".join(event_text(e) for e in group), "font": {"size": 10, "color": EVENT_COLOR},
             "bgcolor": "rgba(255,255,255,0.85)"} for onset, group in _by_onset(events).items()]


@dataclass(frozen=True)
class EvidenceMarks:
    """What a rule fired on, drawn on a plot of its series: the onset and end steps, the evidence window's
    points, the baseline (NaN for absolute rules) and the threshold with its name (``None``: none known)."""

    onset: int
    end: int
    steps: tuple[int, ...]
    values: tuple[float, ...]
    baseline: float
    threshold: float | None = None
    threshold_name: str = ""


def evidence_shapes(marks: EvidenceMarks) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(shapes, annotations)``: the span from onset to end shaded, the onset as a solid line, the baseline
    dashed grey and the threshold dotted red across the plot, each labelled at the right."""
    shapes: list[dict[str, Any]] = [
        {"type": "rect", "xref": "x", "yref": "paper", "x0": marks.onset, "x1": max(marks.end, marks.onset),
         "y0": 0, "y1": 1, "fillcolor": "rgba(242,140,40,0.12)", "line": {"width": 0}, "layer": "below"},
        {"type": "line", "xref": "x", "yref": "paper", "x0": marks.onset, "x1": marks.onset, "y0": 0, "y1": 1,
         "line": {"color": EVENT_COLOR, "width": 2}},
    ]
    notes = [{"x": marks.onset, "xref": "x", "y": 0, "yref": "paper", "yanchor": "bottom", "xanchor": "left",
              "showarrow": False, "text": f"onset {marks.onset}", "font": {"size": 10, "color": EVENT_COLOR}}]
    for value, colour, dash, name in ((marks.baseline, BASELINE_COLOR, "dash", "baseline"),
                                      (marks.threshold, THRESHOLD_COLOR, "dot", marks.threshold_name or "threshold")):
        if value is None or not np.isfinite(value):
            continue
        shapes.append({"type": "line", "xref": "paper", "yref": "y", "x0": 0, "x1": 1, "y0": value, "y1": value,
                       "line": {"color": colour, "width": 1.5, "dash": dash}})
        notes.append({"x": 1, "xref": "paper", "y": value, "yref": "y", "xanchor": "right", "yanchor": "bottom",
                      "showarrow": False, "text": f"{name} {format_number(value)}",
                      "font": {"size": 10, "color": colour}})
    return shapes, notes


def _line(name: str, steps: np.ndarray, values: np.ndarray, colour: str, *, width: float = 1.5,
          opacity: float = 1.0, markers: bool | None = None, limit: int = MAX_POINTS) -> dict[str, Any]:
    shown_steps, shown = decimate(np.asarray(steps), np.asarray(values, dtype=np.float64), limit)
    with_markers = len(shown_steps) <= 200 if markers is None else markers
    return {"type": "scatter", "mode": "lines+markers" if with_markers else "lines", "name": name,
            "x": np.asarray(shown_steps).tolist(),
            "y": [None if v != v or v in (np.inf, -np.inf) else float(v) for v in shown.tolist()],
            "marker": {"size": 6, "color": colour}, "line": {"width": width, "color": colour}, "opacity": opacity}


def timeline_figure(curves: Mapping[str, tuple[np.ndarray, np.ndarray]], *, title: str, y_label: str,
                    step: int | None, events: Sequence[Event] = (), log_y: bool = False, smoothing: float = 0.0,
                    evidence: EvidenceMarks | None = None, theme: str = "light",
                    x_range: tuple[float, float] | None = None) -> dict[str, Any]:
    """One line per curve (step types, or overlaid nodes and trials) against a statistic, the current step
    marked, ``events`` marked by dashed lines at their onsets (described on hover), and ``evidence`` drawn
    when the plot shows the series a rule fired on. With ``smoothing`` > 0 each curve is drawn smoothed
    (:func:`ema`) over its raw values, shown faint. With ``x_range`` the plot shows those steps, each line
    reduced over that range only (a zoomed timeline: more detail the narrower the range)."""
    data = []
    for index, (name, (steps, values)) in enumerate(curves.items()):
        colour = TRACE_COLORS[index % len(TRACE_COLORS)]
        if smoothing > 0:
            smooth = ema(values, smoothing)  # over the whole series, so a zoomed line is the same line
            raw, smooth = _in_range(steps, values, x_range), _in_range(steps, smooth, x_range)
            data.append({**_line(name, *raw, colour, width=1.0, opacity=0.3, markers=False),
                         "showlegend": False, "hoverinfo": "skip"})
            data.append(_line(f"{name} (EMA {smoothing:g})", *smooth, colour, markers=False))
        else:
            data.append(_line(name, *_in_range(steps, values, x_range), colour))
    if evidence is not None:
        data.append({"type": "scatter", "mode": "markers", "name": "evidence", "x": list(evidence.steps),
                     "y": [None if not np.isfinite(v) else float(v) for v in evidence.values],
                     "marker": {"size": 8, "color": THRESHOLD_COLOR, "symbol": "circle-open", "line": {"width": 2}}})
    shapes, notes = evidence_shapes(evidence) if evidence is not None else ([], [])
    return {"data": data, "layout": themed({
        "title": plot_title(title), "shapes": step_marker(step, theme) + event_shapes(events) + shapes,
        "annotations": event_annotations(events) + notes,
        "hovermode": "closest", "clickmode": "event", "showlegend": len(curves) > 1 or evidence is not None,
        "xaxis": {"title": {"text": "step"}, **({"range": list(x_range), "autorange": False} if x_range else {})},
        "yaxis": {"title": {"text": y_label}, "type": "log" if log_y else "linear"},
        "legend": {"orientation": "h", "y": 1.02, "x": 1, "xanchor": "right", "yanchor": "bottom"},
    }, theme)}


def _in_range(steps: np.ndarray, values: np.ndarray, x_range: tuple[float, float] | None
              ) -> tuple[np.ndarray, np.ndarray]:
    return (steps, values) if x_range is None else visible(steps, values, *x_range)


def kpi_figure(name: str, curves: Mapping[str, tuple[np.ndarray, np.ndarray]], step: int | None, *,
               theme: str = "light") -> dict[str, Any]:
    """A KPI's curve per step type, the current step marked."""
    return timeline_figure(curves, title=name, y_label=name, step=step, theme=theme)


def layers_figure(names: Sequence[str], steps: np.ndarray, matrix: np.ndarray, *, title: str, y_label: str,
                  step: int | None, log_y: bool = True, band: tuple[float, float] | None = None,
                  theme: str = "light") -> dict[str, Any]:
    """One line per layer (rows of ``matrix``, in forward order) over ``steps``, coloured from the first layer
    (dark blue) to the last (yellow), the current step marked; ``band`` shades a healthy range."""
    count = max(len(names), 1)
    data = []
    for index, name in enumerate(names):
        position = index / max(count - 1, 1)
        colour = viridis(position)
        data.append({**_line(name, steps, matrix[index], colour, width=1.2, markers=False, limit=LAYER_POINTS),
                     "hovertemplate": f"{name}<br>step %{{x}}: %{{y:.4g}}<extra></extra>"})
    shapes = step_marker(step, theme)
    if band is not None:
        shapes.append({"type": "rect", "xref": "paper", "yref": "y", "x0": 0, "x1": 1, "y0": band[0], "y1": band[1],
                       "fillcolor": "rgba(44,160,44,0.10)", "line": {"width": 0}, "layer": "below"})
    return {"data": data, "layout": themed({
        "title": plot_title(f"{title} · {len(names)} layers, first dark blue, last yellow"), "shapes": shapes,
        "hovermode": "closest", "clickmode": "event", "showlegend": False,
        "xaxis": {"title": {"text": "step"}},
        "yaxis": {"title": {"text": y_label}, "type": "log" if log_y else "linear",
                  "gridcolor": THEMES.get(theme, THEMES["light"])["grid"]},
    }, theme)}


_VIRIDIS = ((0.0, (68, 1, 84)), (0.25, (59, 82, 139)), (0.5, (33, 145, 140)), (0.75, (94, 201, 98)),
            (1.0, (253, 231, 37)))


def viridis(t: float) -> str:
    """The colour at ``t`` in [0, 1] of the viridis scale, as ``#rrggbb``.

    >>> viridis(0.0), viridis(1.0), viridis(0.5)
    ('#440154', '#fde725', '#21918c')
    """
    t = float(np.clip(t, 0.0, 1.0))
    for (t0, c0), (t1, c1) in zip(_VIRIDIS, _VIRIDIS[1:]):
        if t <= t1:
            w = (t - t0) / (t1 - t0)
            return "#" + "".join(f"{round(a + w * (b - a)):02x}" for a, b in zip(c0, c1))
    return "#fde725"



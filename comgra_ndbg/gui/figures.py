"""Pure figure builders for one tensor: numpy arrays in, plotly figure dicts out (statistics table rows,
histogram, element values as a table, the distribution over steps, KPIs), in the light or the dark theme.

No dash import, no I/O, so every builder is tested by comparing dicts. Timelines are built in
:mod:`comgra_ndbg.gui.timelines`, the graph's elements and stylesheet in :mod:`comgra_ndbg.gui.cyto`.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["THEMES", "HistogramBins", "as_matrix", "bar_colour", "distribution_figure", "format_number",
           "histogram_bins", "histogram_figure", "message_figure",
           "plot_title", "statistics_rows", "step_line", "themed", "value_rows"]

# Colours of the page per theme; the stylesheet of the page (layout.CSS) uses the same ones.
THEMES: dict[str, dict[str, str]] = {
    "light": {"paper": "#ffffff", "plot": "#ffffff", "font": "#1f2937", "grid": "#e5e7eb", "muted": "#6b7280",
              "template": "plotly_white", "bar": "#4C72B0", "marker": "#D62728"},
    "dark": {"paper": "#111827", "plot": "#111827", "font": "#e5e7eb", "grid": "#374151", "muted": "#9ca3af",
             "template": "plotly_dark", "bar": "#7FA7E0", "marker": "#F87171"},
}
MARGIN = {"l": 52, "r": 12, "t": 40, "b": 40}
TITLE_FONT: dict[str, Any] = {"size": 13}
SEQUENTIAL = "Viridis"  # counts and other non-negative values


def _palette(theme: str) -> dict[str, str]:
    return THEMES.get(theme, THEMES["light"])


def bar_colour(theme: str) -> str:
    """The colour of a histogram's bars in ``theme``."""
    return _palette(theme)["bar"]


def themed(layout: dict[str, Any], theme: str = "light") -> dict[str, Any]:
    """``layout`` with the theme's template, colours and margins (its own keys win)."""
    colours = _palette(theme)
    return {"template": colours["template"], "paper_bgcolor": colours["paper"], "plot_bgcolor": colours["plot"],
            "font": {"color": colours["font"]}, "margin": MARGIN, **layout}


def plot_title(text: str) -> dict[str, Any]:
    """A plot title at the top left, clear of the legend at the top right."""
    return {"text": text, "font": TITLE_FONT, "x": 0.0, "xanchor": "left", "xref": "paper", "y": 0.98,
            "yanchor": "top", "yref": "container"}


def format_number(value: float) -> str:
    """A statistic as text: integers exactly, other numbers with 6 significant digits, NaN as ``—``.

    >>> format_number(3.0), format_number(0.000123456789), format_number(float("nan")), format_number(float("inf"))
    ('3', '0.000123457', '—', 'inf')
    """
    if np.isnan(value):
        return "—"
    if np.isinf(value):
        return "inf" if value > 0 else "-inf"
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.6g}"


def statistics_rows(stats: Mapping[str, float]) -> list[tuple[str, str]]:
    """``(name, formatted value)`` rows of a statistics table, in the order of ``stats``."""
    return [(name, format_number(float(value))) for name, value in stats.items()]


@dataclass(frozen=True)
class HistogramBins:
    """The finite element values of a tensor in equal bins: ``counts`` per bin, ``edges`` (one more than the
    counts), and how many values were finite, NaN and ±Inf (non-finite values are counted, not binned)."""

    counts: list[int]
    edges: list[float]
    finite: int
    nan: int
    inf: int

    def caption(self, title: str) -> str:
        """The histogram's title: ``title``, the values binned and the non-finite ones left out."""
        suffix = f" · {self.nan} NaN, {self.inf} ±Inf not shown" if self.nan or self.inf else ""
        return f"{title} · {self.finite} values{suffix}" if self.finite else f"{title}: no finite value{suffix}"


def histogram_bins(values: np.ndarray, bins: int = 40) -> HistogramBins:
    """``values`` in ``bins`` equal bins from their finite minimum to their maximum (a constant tensor: one
    unit wide around its value); no bins when no value is finite.

    >>> histogram_bins(np.array([0.0, 1.0, 1.0, 2.0, np.nan]), bins=2)
    HistogramBins(counts=[1, 3], edges=[0.0, 1.0, 2.0], finite=4, nan=1, inf=0)
    """
    values = np.asarray(values, dtype=np.float64).ravel()
    finite = values[np.isfinite(values)]
    nan, inf = int(np.isnan(values).sum()), int(np.isinf(values).sum())
    if not len(finite):
        return HistogramBins(counts=[], edges=[], finite=0, nan=nan, inf=inf)
    low, high = float(finite.min()), float(finite.max())
    if low == high:
        low, high = low - 0.5, high + 0.5
    counts, edges = np.histogram(finite, bins=bins, range=(low, high))
    return HistogramBins(counts=counts.tolist(), edges=edges.tolist(), finite=len(finite), nan=nan, inf=inf)


def histogram_figure(values: np.ndarray, *, title: str, bins: int = 40, theme: str = "light") -> dict[str, Any]:
    """A bar chart of the finite element values (:func:`histogram_bins`), for plots that overlay several.

    The bins are computed here (not by plotly), so the figure holds exactly the counts a test can check.
    """
    found = histogram_bins(values, bins)
    if not found.finite:
        return message_figure(found.caption(title), theme=theme)
    edges = np.asarray(found.edges)
    centres = (edges[:-1] + edges[1:]) / 2
    return {
        "data": [{"type": "bar", "x": centres.tolist(), "y": found.counts, "width": float(edges[1] - edges[0]),
                  "marker": {"color": _palette(theme)["bar"]}, "hovertemplate": "%{x:.4g}: %{y}<extra></extra>"}],
        "layout": themed({"title": plot_title(found.caption(title)), "bargap": 0.02,
                          "xaxis": {"title": {"text": "value"}}, "yaxis": {"title": {"text": "count"}}}, theme),
    }


def as_matrix(values: np.ndarray) -> np.ndarray:
    """A 2-D view of an array: a scalar is 1×1, a vector one row, higher ranks keep the last axis as columns.

    >>> as_matrix(np.zeros((2, 3, 4))).shape, as_matrix(np.float32(1.0)).shape, as_matrix(np.zeros(5)).shape
    ((6, 4), (1, 1), (1, 5))
    """
    values = np.asarray(values)
    if values.ndim == 0:
        return values.reshape(1, 1)
    if values.ndim == 1:
        return values.reshape(1, -1)
    return values.reshape(-1, values.shape[-1])


def value_rows(values: np.ndarray, shape: tuple[int, ...], positions: np.ndarray | None, *, page: int,
               page_size: int = 50, first_axis: np.ndarray | None = None) -> tuple[list[tuple[str, str]], int]:
    """One page of ``(position, value)`` rows of stored element values, and the number of pages.

    ``positions`` are the flat indices of ``values`` in an array of ``shape`` (``None``: every element, in C
    order); a position is shown as the element's index tuple, its first index replaced by
    ``first_axis[index]`` when given (the batch position of a stored sample).

    >>> value_rows(np.array([1.5, 2.0, 3.0]), (3,), None, page=0, page_size=2)
    ([('(0,)', '1.5'), ('(1,)', '2')], 2)
    >>> value_rows(np.array([7.0]), (2, 2), np.array([3]), page=0, first_axis=np.array([4, 9]))
    ([('(9, 1)', '7')], 1)
    """
    values = np.asarray(values).ravel()
    pages = max(1, -(-len(values) // page_size))
    page = int(np.clip(page, 0, pages - 1))
    chosen = slice(page * page_size, (page + 1) * page_size)
    flat = np.arange(len(values))[chosen] if positions is None else np.asarray(positions)[chosen]
    shape = shape if shape else (1,)
    rows = []
    for p, v in zip(flat, values[chosen]):
        index = [int(i) for i in np.unravel_index(int(p), shape)]
        if first_axis is not None:
            index[0] = int(first_axis[index[0]])
        rows.append((str(tuple(index)), format_number(float(v))))
    return rows, pages


def distribution_figure(steps: np.ndarray, edges: np.ndarray, counts: np.ndarray, *, title: str,
                        step: int | None, theme: str = "light") -> dict[str, Any]:
    """Histograms over steps as a heatmap: one column per snapshot step, one row per value bin, the colour
    the count (on a log scale, so the tails show); the current step marked."""
    centres = (np.asarray(edges[:-1]) + np.asarray(edges[1:])) / 2
    counts = np.asarray(counts, dtype=np.float64)
    return {
        "data": [{"type": "heatmap", "x": [int(s) for s in steps], "y": [float(c) for c in centres],
                  "z": np.log10(counts + 1).round(4).tolist(), "customdata": counts.astype(int).tolist(),
                  "colorscale": SEQUENTIAL, "colorbar": {"title": {"text": "log10(count+1)"}, "thickness": 10},
                  "hovertemplate": "step %{x}, value %{y:.4g}: %{customdata}<extra></extra>"}],
        "layout": themed({"title": plot_title(title), "xaxis": {"title": {"text": "step"}},
                          "yaxis": {"title": {"text": "value"}}, "shapes": step_line(step, theme)}, theme),
    }


def step_line(step: int | None, theme: str = "light") -> list[dict[str, Any]]:
    """The vertical line that marks the current step on a plot over steps (none when no step is selected)."""
    if step is None:
        return []
    return [{"type": "line", "xref": "x", "yref": "paper", "x0": step, "x1": step, "y0": 0, "y1": 1,
             "line": {"color": _palette(theme)["marker"], "width": 2}}]


def message_figure(text: str, *, theme: str = "light") -> dict[str, Any]:
    """An empty figure that says why there is nothing to plot."""
    return {"data": [], "layout": themed({
        "xaxis": {"visible": False}, "yaxis": {"visible": False},
        "annotations": [{"text": text, "showarrow": False, "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5,
                         "font": {"size": 13, "color": _palette(theme)["muted"]}}]}, theme)}

"""Small Dash components rendered from plain data: tables, messages, the module tree, notes.

Each function turns rows that a pure function produced into HTML, and nothing else, so the callbacks read
as "query, build, render" and the tests can check the rows before they become components.
"""
from __future__ import annotations

import json
import time
import zlib
from collections.abc import Iterable, Sequence
from typing import Any

from dash import dcc, html

from comgra_ndbg.gui import ids
from comgra_ndbg.gui.figures import HistogramBins, format_number
from comgra_ndbg.gui.value_image import ValueImage

__all__ = ["GRAPH_CONFIG", "graph_of", "markdown_cell", "markdown_table", "markdown_text", "message", "module_table",
           "histogram_panel", "histogram_view", "notes_table", "plot", "problems_view", "table", "value_view"]

MARKDOWN_SPECIAL = "\\`*_{}[]<>()#+-.!|~"  # escaped in a Markdown table's cells, so they show as typed
MARKDOWN_ESCAPES = str.maketrans({**{c: "\\" + c for c in MARKDOWN_SPECIAL}, "\n": " "})

# No mode bar: it covers the titles of small plots; drag still zooms and a double click resets.
GRAPH_CONFIG: dict[str, Any] = {"displaylogo": False, "displayModeBar": False}


def message(text: str, *, error: bool = False, element_id: str | None = None) -> html.Div:
    """A one-line note in place of a view that has nothing to show, saying why (with an id when the page
    changes its text in place)."""
    props: dict[str, Any] = {"id": element_id} if element_id is not None else {}
    return html.Div(text, className="message error" if error else "message", **props)


def table(header: Sequence[str], rows: Iterable[Sequence[Any]], *, table_id: str | None = None,
          class_name: str = "data-table") -> html.Table:
    """A plain HTML table; cells are shown as given (strings, numbers or components)."""
    props: dict[str, Any] = {"className": class_name}
    if table_id is not None:
        props["id"] = table_id
    return html.Table([
        html.Thead(html.Tr([html.Th(h) for h in header])),
        html.Tbody([html.Tr([html.Td(cell) for cell in row]) for row in rows]),
    ], **props)


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]], *, table_id: str,
                   class_name: str = "data-table") -> dcc.Markdown:
    r"""A plain table drawn by one component: Dash renders every cell of an HTML table as a component of its
    own, and re-renders all of them (one store update each) whenever one value changes. A table that changes
    with every step (the statistics) is sent as this one component, whose text is the whole table.

    >>> print(markdown_table(("statistic", "value"), [("mean", "0.5"), ("min", "-1")], table_id="t").children)
    | statistic | value |
    | --- | --- |
    | mean | 0\.5 |
    | min | \-1 |
    """
    return dcc.Markdown(markdown_text(header, rows), id=table_id, className=class_name)


def markdown_text(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """The Markdown text of :func:`markdown_table` (what the page sets when it shows another step itself)."""
    lines = ["| " + " | ".join(markdown_cell(h) for h in header) + " |",
             "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(markdown_cell(value) for value in row) + " |" for row in rows]
    return "\n".join(lines)


def markdown_cell(value: Any) -> str:
    r"""A value as a cell of :func:`markdown_text`, shown as typed.

    >>> markdown_cell("-1.5e-3 | x")
    '\\-1\\.5e\\-3 \\| x'
    """
    return str(value).translate(MARKDOWN_ESCAPES)


def module_table(modules: Sequence[Any], classes: dict[str, str]) -> html.Table:
    """The module tree (``Recording.module_tree()`` entries), indented by depth, with parameter counts."""
    rows = [(html.Span(m.path.rpartition(".")[2] or m.path or "(root)",
                       style={"paddingLeft": f"{1.2 * m.depth}em"}, title=m.path),
             classes.get(m.path, ""), f"{m.own_parameters:,}", f"{m.total_parameters:,}")
            for m in modules]
    return html.Div(table(("module", "class", "own parameters", "total parameters"), rows,
                          table_id=ids.NETWORK + "-table"), className="scroll")


def notes_table(notes: Sequence[Any]) -> html.Table | html.Div:
    """The recording's free-text notes with their step and time."""
    if not notes:
        return message("No notes in this recording — add some with Recorder.add_note(text).")
    rows = [("before step 0" if n.step < 0 else str(n.step),
             time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(n.time)), n.text) for n in notes]
    return table(("step", "time", "note"), rows, table_id=ids.NOTES + "-table")


def problems_view(damage: Sequence[Any], problems: Sequence[Any]) -> list[Any]:
    """Damage found while reading (one error line each, with what to run) and the recording's problems log
    (what the recorder could not record, by step); empty when there is neither."""
    shown: list[Any] = [message(f"Damaged: {d.describe()}", error=True) for d in damage]
    if damage:
        shown.append(message("Run `comgra-ndbg check PATH` for the full list and `--salvage` to copy everything "
                             "readable into a new recording; what is shown here skips the damaged parts.", error=True))
    if problems:
        rows = [("before step 0" if p.step < 0 else str(p.step), p.category, p.subject, p.message) for p in problems]
        shown.append(html.H4(f"Problems logged while recording ({len(problems)})"))
        shown.append(table(("step", "category", "subject", "what happened"), rows, table_id=ids.NOTES + "-problems"))
    return shown


def graph_of(figure: dict[str, Any], graph_id: str | None = None, height: int = 300) -> Any:
    """A plot of a figure dict, sized for the tab it sits in; with an id it gets PNG and CSV buttons
    (:func:`plot`)."""
    if graph_id is not None:
        return plot(graph_id, height, figure)
    return dcc.Graph(figure=figure, style={"height": f"{height}px"}, config=GRAPH_CONFIG)


def plot(graph_id: str, height: int, figure: dict[str, Any] | None = None) -> html.Div:
    """A ``dcc.Graph`` with buttons that save it as a PNG image and its data as CSV (in the browser, from
    what the plot holds)."""
    figure = figure if figure is not None else {"data": [], "layout": {"xaxis": {"visible": False},
                                                                       "yaxis": {"visible": False}}}
    return html.Div([
        _exports(graph_id, "this plot"),
        dcc.Graph(id=graph_id, figure=figure, style={"height": f"{height}px"}, config=GRAPH_CONFIG),
    ], className="plot")


def _exports(target: str, what: str) -> html.Div:
    return html.Div([html.Button(fmt.upper(), id=ids.export(target, fmt), n_clicks=0, className="tool",
                                 title=f"save {what} as {'a PNG image' if fmt == 'png' else 'CSV data'}")
                     for fmt in ("png", "csv")], className="exports")


def value_view(image: ValueImage, *, title: str, row_label: str, column_label: str,
               row_names: Sequence[int] | None = None, height: int = 240) -> html.Div:
    """Element values as an image stretched over the panel (one cell per element), the first and last row and
    column named on its sides, the colour bar, and a line that reads out the cell under the pointer (the
    page's script reads the cells the image carries); PNG and CSV buttons save the image scaled up and the
    cells. Drawn by the browser in about a millisecond, where a heatmap plot takes 10–15."""
    rows, columns = len(image.cells), len(image.cells[0])
    names = [str(n) for n in row_names] if row_names is not None else [str(i) for i in range(rows)]
    cells, rows_text = json.dumps(image.cells, separators=(",", ":")), json.dumps(names)
    stamp = f"{zlib.crc32((cells + rows_text).encode()):08x}"  # new cells or rows: the page reads them again
    data = {"data-cells": cells, "data-stamp": stamp, "data-rows": rows_text,
            "data-row-label": row_label, "data-column-label": column_label}
    side = (f"{row_label} {names[0]}", f"{row_label} {names[-1]}") if rows > 1 else (f"{row_label} {names[0]}",)
    scale = [html.Span(format_number(image.low)),
             html.Span(className="values-bar", style={"background": image.gradient}),
             html.Span(format_number(image.high))]
    if image.diverging:
        scale.append(html.Span("· 0 in the middle (white)"))
    return html.Div([
        _exports(ids.VALUES_IMAGE, "these values"),
        html.Div(title, className="values-title"),
        html.Div([html.Div([html.Span(text) for text in side], className="values-rows"),
                  html.Img(id=ids.VALUES_IMAGE, src=image.src, className="values-image", alt=title,
                           style={"height": f"{height}px"}, **data)], className="values-frame"),
        html.Div([html.Span(f"{column_label} 0"), html.Span(f"{column_label} {columns - 1}")] if columns > 1 else
                 [html.Span(f"{column_label} 0")], className="values-columns"),
        html.Div(scale, className="values-scale"),
        html.Div("point at a cell to read its value", className="values-readout"),
    ], className="plot values-view")


def histogram_panel() -> html.Div:
    """The Tensors tab's histogram panel, filled by the view callback (:func:`histogram_view` or a note),
    with buttons that save the histogram as a PNG image and its bins as CSV."""
    return html.Div([_exports(ids.HISTOGRAM, "this histogram"), html.Div(id=ids.HISTOGRAM, className="histogram")],
                    className="plot")


def histogram_view(bins: HistogramBins, *, title: str, colour: str, height: int = 250) -> html.Div:
    """A histogram drawn by the page's script on a canvas (:mod:`comgra_ndbg.gui.histogramscript`) from the
    counts and edges it carries, with its title above and a line that reads out the bar under the pointer.
    Drawn in about a millisecond, where a plotly.js bar chart takes 8–12 on every tap and step to a snapshot."""
    counts = json.dumps(bins.counts, separators=(",", ":"))
    edges = json.dumps(bins.edges, separators=(",", ":"))
    return html.Div([
        html.Div(bins.caption(title), className="histogram-title"),
        html.Canvas(className="histogram-canvas", style={"height": f"{height}px"},
                    **{"data-counts": counts, "data-edges": edges, "data-colour": colour,
                       "data-stamp": f"{zlib.crc32((counts + edges + colour).encode()):08x}"}),
        html.Div("point at a bar to read its count", className="histogram-readout"),
    ], className="histogram-view")


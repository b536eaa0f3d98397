"""Small Dash components rendered from plain data: tables, messages, the module tree, notes, diagnosis.

Each function turns rows that a pure function produced into HTML, and nothing else, so the callbacks read
as "query, build, render" and the tests can check the rows before they become components.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Sequence
from typing import Any

from dash import dcc, html

from comgra_ndbg.gui import ids
from comgra_ndbg.gui.figures import format_number

__all__ = ["GRAPH_CONFIG", "diagnosis_view", "graph_of", "message", "module_table", "notes_table", "table"]

MAX_DIAGNOSIS_ROWS = 50
SECTION_ORDER = {"hypotheses": 0, "events": 1}
# No mode bar: it covers the titles of small plots; drag still zooms and a double click resets.
GRAPH_CONFIG: dict[str, Any] = {"displaylogo": False, "displayModeBar": False}


def message(text: str, *, error: bool = False) -> html.Div:
    """A one-line note in place of a view that has nothing to show, saying why."""
    return html.Div(text, className="message error" if error else "message")


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


def module_table(modules: Sequence[Any], classes: dict[str, str]) -> html.Table:
    """The module tree (``Recording.module_tree()`` entries), indented by depth, with parameter counts."""
    rows = [(html.Span(m.path.rpartition(".")[2] or m.path or "(root)",
                       style={"paddingLeft": f"{1.2 * m.depth}em"}, title=m.path),
             classes.get(m.path, ""), f"{m.own_parameters:,}", f"{m.total_parameters:,}")
            for m in modules]
    return table(("module", "class", "own parameters", "total parameters"), rows, table_id=ids.NETWORK + "-table")


def notes_table(notes: Sequence[Any]) -> html.Table | html.Div:
    """The recording's free-text notes with their step and time."""
    if not notes:
        return message("No notes in this recording — add some with Recorder.add_note(text).")
    rows = [("before step 0" if n.step < 0 else str(n.step),
             time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(n.time)), n.text) for n in notes]
    return table(("step", "time", "note"), rows, table_id=ids.NOTES + "-table")


def diagnosis_view(analysis: Any) -> html.Div:
    """Whatever the analysis stored, shown generically: each list it holds (hypotheses first, then events,
    then the rest) as a table of its items' fields, with a button that selects the item's node and step
    (``onset``, ``onset_step`` or ``step``) when it names them."""
    if analysis is None:
        return message("No analysis stored for this trial yet — run `comgra_ndbg.analyze(path)`.")
    parts: list[Any] = []
    if getattr(analysis, "stale", False):
        parts.append(message("The recording has grown since this analysis — run `comgra_ndbg.analyze(path)` "
                             "again to include the new steps."))
    for title, items in sorted(_sections(analysis), key=lambda s: SECTION_ORDER.get(s[0], len(SECTION_ORDER))):
        records = [_as_record(item) for item in items[:MAX_DIAGNOSIS_ROWS]]
        columns = list(dict.fromkeys(key for record in records for key in record))
        rows = []
        for record in records:
            node = record.get("node")
            step = next((record[k] for k in ("onset", "onset_step", "step") if isinstance(record.get(k), int)), None)
            jump = (html.Button("select", id=ids.diagnosis_jump(node, step), className="jump")
                    if isinstance(node, str) and step is not None else "")
            rows.append([jump, *(_cell(record.get(column)) for column in columns)])
        parts.append(html.Div([html.H4(f"{title} ({len(items)})"),
                               table(["", *columns], rows) if rows else message("none")]))
    return html.Div(parts or [message("The stored analysis holds no hypotheses and no events.")])


def _fields(value: Any) -> list[tuple[str, Any]]:
    if isinstance(value, dict):
        return list(value.items())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [(f.name, getattr(value, f.name)) for f in dataclasses.fields(value)]
    return list(vars(value).items()) if hasattr(value, "__dict__") else []


def _sections(analysis: Any) -> list[tuple[str, list[Any]]]:
    """The list-valued fields of ``analysis`` and of its dict or dataclass fields (one level down, where
    e.g. a stored result keeps the diagnosis as a dict)."""
    sections = []
    for name, value in _fields(analysis):
        if isinstance(value, (list, tuple)):
            sections.append((str(name), list(value)))
        elif isinstance(value, dict) or dataclasses.is_dataclass(value):
            sections += [(str(n), list(v)) for n, v in _fields(value) if isinstance(v, (list, tuple))]
    return sections


def _as_record(item: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(item) and not isinstance(item, type):
        return {f.name: getattr(item, f.name) for f in dataclasses.fields(item)}
    if isinstance(item, dict):
        return dict(item)
    return {"value": item}


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return format_number(value)
    if isinstance(value, (list, tuple)):
        return f"{len(value)} items" if len(value) > 3 else ", ".join(_cell(v) for v in value)
    if dataclasses.is_dataclass(value) or isinstance(value, dict):
        return str(value)[:120]
    return "" if value is None else str(value)


def graph_of(figure: dict[str, Any], graph_id: str | None = None, height: int = 300) -> dcc.Graph:
    """A ``dcc.Graph`` of a figure dict, sized for the tab it sits in."""
    props: dict[str, Any] = {"figure": figure, "style": {"height": f"{height}px"}, "config": GRAPH_CONFIG}
    if graph_id is not None:
        props["id"] = graph_id
    return dcc.Graph(**props)

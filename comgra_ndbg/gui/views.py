"""Small Dash components rendered from plain data: tables, messages, the module tree, notes.

Each function turns rows that a pure function produced into HTML, and nothing else, so the callbacks read
as "query, build, render" and the tests can check the rows before they become components.
"""
from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from dash import dcc, html

from comgra_ndbg.gui import ids

__all__ = ["GRAPH_CONFIG", "graph_of", "message", "module_table", "notes_table", "problems_view", "table"]

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


def graph_of(figure: dict[str, Any], graph_id: str | None = None, height: int = 300) -> dcc.Graph:
    """A ``dcc.Graph`` of a figure dict, sized for the tab it sits in."""
    props: dict[str, Any] = {"figure": figure, "style": {"height": f"{height}px"}, "config": GRAPH_CONFIG}
    if graph_id is not None:
        props["id"] = graph_id
    return dcc.Graph(**props)

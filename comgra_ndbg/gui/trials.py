"""The trial selector as a sweep table: sort and filter a group's trials by their diagnosis, final loss and
hyperparameters, the columns of ``comgra-ndbg sweep`` (:mod:`comgra_ndbg.sweep.table`).

Each trial's row is built from what the explorer already has — the stored analysis (never a new one: press
Analyze now, or run ``comgra-ndbg sweep``), the loss KPI and the recording's hyperparameters — and memoized
per stored analysis. :func:`trial_options` turns the rows into the trial dropdown's options, sorted and
filtered, each labelled with its type, confidence, final loss and hyperparameters; the trial being looked at
stays in the list even when the filter leaves it out. The ◀ / ▶ steppers keep the recording order.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dash import Dash, Input, Output, State, dcc, html

from comgra_ndbg.errors import InvalidArgumentError
from comgra_ndbg.gui import ids
from comgra_ndbg.gui.figures import format_number
from comgra_ndbg.gui.state import ReaderCache
from comgra_ndbg.store.reader import Recording
from comgra_ndbg.sweep.table import (SWEEP_COLUMNS, columns_of, filter_rows, parse_filter, sort_rows, sweep_row)
from comgra_ndbg.sweep.tasks import final_loss

__all__ = ["SORTABLE", "trial_row", "trial_table", "sort_columns", "trial_label", "trial_options", "trial_controls",
           "update_trial_options", "register_trial_callbacks"]

SORTABLE = ("trial", "type", "origin", "node", "onset", "confidence", "final_loss", "steps")
"""The fixed sweep columns the selector sorts by; every hyperparameter of the trials follows."""
NOT_ANALYSED = "not analysed"


def trial_row(cache: ReaderCache, trial: str) -> dict[str, Any]:
    """The sweep row of one trial of the explorer (type ``""`` when no analysis is stored)."""
    stored = cache.readable_diagnosis(trial)

    def compute(recording: Recording) -> dict[str, Any]:
        return sweep_row(str(recording.location), trial, stored.diagnosis if stored is not None else None,
                         final_loss=final_loss(recording), steps=len(recording.steps),
                         hyperparameters=recording.hyperparameters)

    return cache.memo(trial, ("sweep-row", cache.analysis_stamp(trial)), compute)


def trial_table(cache: ReaderCache) -> list[dict[str, Any]]:
    """The sweep rows of every readable trial, in the explorer's order."""
    return [trial_row(cache, trial) for trial in cache.trials if trial not in cache.unreadable]


def sort_columns(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """What the selector can sort and filter by: :data:`SORTABLE`, then the hyperparameters."""
    return list(SORTABLE) + [c for c in columns_of(rows) if c not in SWEEP_COLUMNS]


def trial_label(row: Mapping[str, Any], hyperparameters: Sequence[str] = ()) -> str:
    """A trial as the dropdown shows it.

    >>> trial_label({"trial": "b", "type": "exploding", "confidence": 0.93, "final_loss": float("nan"), "lr": 2.0},
    ...             ["lr"])
    'b · exploding 93% · loss nan · lr=2'
    """
    kind = row.get("type") or NOT_ANALYSED
    confidence = row.get("confidence")
    parts = [str(row["trial"]), kind + (f" {round(100 * confidence)}%" if confidence is not None else ""),
             f"loss {_number(row.get('final_loss'))}"]
    parts += [f"{name}={_number(row[name]) if isinstance(row[name], float) else row[name]}"
              for name in hyperparameters if row.get(name) is not None]
    return " · ".join(parts)


def _number(value: float | None) -> str:
    """A number as the labels show it: ``nan`` said as such (a diverged run's loss), not as missing."""
    if value is None:
        return "—"
    return "nan" if value != value else format_number(value)


def trial_options(rows: Sequence[Mapping[str, Any]], *, sort: str | None, descending: bool, query: str,
                  current: str | None) -> tuple[list[dict[str, str]], str]:
    """The dropdown's options (sorted by ``sort``, filtered by ``query`` as in
    :func:`~comgra_ndbg.sweep.table.parse_filter`) and a note: how many trials match, or why the filter
    could not be read (then every trial is listed)."""
    columns = sort_columns(rows)
    hyperparameters = columns[len(SORTABLE):]
    note = ""
    try:
        shown = filter_rows(rows, parse_filter(query or "", columns))
        if query and query.strip():
            note = f"{len(shown)} of {len(rows)} trials match"
    except InvalidArgumentError as error:
        shown, note = list(rows), str(error)
    if sort:
        shown = sort_rows(shown, sort, descending=descending)
    options = [{"label": trial_label(row, hyperparameters), "value": row["trial"]} for row in shown]
    if current is not None and current not in {o["value"] for o in options}:
        for row in rows:
            if row["trial"] == current:
                options.insert(0, {"label": trial_label(row, hyperparameters) + " (filtered out)", "value": current})
    return options, note


def trial_controls(columns: Sequence[str]) -> html.Div:
    """Sort and filter controls for the trial selector (shown when the explorer has several trials)."""
    return html.Div([
        html.Label("sort trials by", htmlFor=ids.TRIAL_SORT),
        dcc.Dropdown(id=ids.TRIAL_SORT, options=list(columns), value=None, placeholder="recording order",
                     className="dropdown"),
        dcc.RadioItems(id=ids.TRIAL_ORDER, options=[{"label": "↑", "value": "ascending"},
                                                     {"label": "↓", "value": "descending"}],
                       value="ascending", inline=True),
        dcc.Input(id=ids.TRIAL_FILTER, type="text", debounce=True, className="trial-filter",
                  placeholder="filter, e.g. type=exploding, lr>=0.1"),
        html.Span(id=ids.TRIAL_NOTE, className="message"),
    ], className="trial-table-controls selector")


def update_trial_options(cache: ReaderCache, sort: str | None, order: str | None, query: str | None,
                         current: str | None) -> tuple[list[dict[str, str]], str]:
    """What the callback returns: the trial dropdown's options and the note beside the filter."""
    with cache.lock:
        rows = trial_table(cache)
    return trial_options(rows, sort=sort, descending=order == "descending", query=query or "", current=current)


def register_trial_callbacks(app: Dash, cache: ReaderCache) -> None:
    """Wire the sort and filter controls to the trial dropdown's options."""
    @app.callback(Output(ids.TRIAL, "options", allow_duplicate=True), Output(ids.TRIAL_NOTE, "children"),
                  Input(ids.TRIAL_SORT, "value"), Input(ids.TRIAL_ORDER, "value"), Input(ids.TRIAL_FILTER, "value"),
                  State(ids.TRIAL, "value"), prevent_initial_call=True)
    def _trial_options(sort: str | None, order: str | None, query: str | None, current: str | None) -> tuple:
        return update_trial_options(cache, sort, order, query, current)

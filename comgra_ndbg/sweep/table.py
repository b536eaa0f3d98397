"""The sweep table's rows: one dict per trial, and how to sort and filter them — plain Python, no pandas.

>>> healthy = sweep_row("runs/a", "a", Diagnosis("a", 60, 59, (), (), ()), final_loss=0.05, steps=60,
...                     hyperparameters={"lr": 0.05})
>>> healthy["type"], healthy["confidence"], healthy["lr"]
('healthy', None, 0.05)
>>> rows = [healthy, sweep_row("runs/b", "b", None, final_loss=float("nan"), steps=0, hyperparameters={"lr": 2.0},
...                            error="CorruptRecordingError: ...")]
>>> [r["trial"] for r in filter_rows(rows, parse_filter("lr>=1"))]
['b']
>>> [r["trial"] for r in sort_rows(rows, "final_loss")]  # NaN and missing values last
['a', 'b']
"""
from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from comgra_ndbg.analysis.events import Diagnosis
from comgra_ndbg.errors import InvalidArgumentError

__all__ = ["SWEEP_COLUMNS", "HEALTHY", "Condition", "sweep_row", "columns_of", "parse_filter", "filter_rows",
           "sort_rows", "last_value"]

SWEEP_COLUMNS = ("path", "trial", "hypothesis", "type", "origin", "node", "onset", "confidence", "final_loss",
                 "steps", "error")
"""The fixed columns, in order; each hyperparameter of the runs follows as a column of its own."""
HEALTHY = "healthy"  # the type column of a trial whose analysis found no failure
_OPERATORS = (">=", "<=", "!=", "=", ">", "<", "~")
_TERM = re.compile(r"^\s*([^<>=!~]+?)\s*(>=|<=|!=|=|>|<|~)\s*(.*?)\s*$")


def last_value(values: Iterable[float]) -> float:
    """The last recorded value (NaN included: a run that ended non-finite says so), NaN when none.

    >>> last_value([3.0, 1.0]), last_value([])
    (1.0, nan)
    """
    out = float("nan")
    for value in values:
        out = float(value)
    return out


def sweep_row(path: str, trial: str, diagnosis: Diagnosis | None, *, final_loss: float, steps: int,
              hyperparameters: Mapping[str, Any], error: str = "") -> dict[str, Any]:
    """One trial's row: the top hypothesis's sentence, type, origin, node, onset and confidence (type
    ``healthy`` and empty fields when there is none; all empty with ``error`` when the trial could not be
    analysed), the final loss, the number of recorded steps, then the hyperparameters (a name that clashes
    with a fixed column gets the prefix ``hp.``)."""
    top = diagnosis.top if diagnosis is not None else None
    row: dict[str, Any] = {
        "path": str(path), "trial": trial, "hypothesis": top.sentence if top else "",
        "type": top.type if top else ("" if diagnosis is None else HEALTHY), "origin": top.origin if top else "",
        "node": top.node if top else "", "onset": int(top.onset) if top else None,
        "confidence": float(top.confidence) if top else None, "final_loss": float(final_loss), "steps": int(steps),
        "error": error}
    for name, value in hyperparameters.items():
        row[f"hp.{name}" if name in SWEEP_COLUMNS else name] = value
    return row


def columns_of(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The fixed columns, then every other column of ``rows`` in sorted order."""
    extra = sorted({key for row in rows for key in row} - set(SWEEP_COLUMNS))
    return list(SWEEP_COLUMNS) + extra


@dataclass(frozen=True)
class Condition:
    """``column operator value`` of a filter; ``~`` means "contains" (case-insensitive)."""

    column: str
    operator: str
    value: str

    def holds(self, row: Mapping[str, Any]) -> bool:
        cell = row.get(self.column)
        if self.operator == "~":
            return self.value.lower() in ("" if cell is None else str(cell)).lower()
        number, wanted = _number(cell), _number(self.value)
        if number is not None and wanted is not None:
            left, right = number, wanted
        elif self.operator in ("=", "!="):
            left, right = ("" if cell is None else str(cell)).lower(), self.value.lower()
        else:
            return False  # an order between a missing / text cell and a number: never true
        return {"=": left == right, "!=": left != right, ">": left > right, "<": left < right,
                ">=": left >= right, "<=": left <= right}[self.operator]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


def parse_filter(text: str, columns: Sequence[str] | None = None) -> tuple[Condition, ...]:
    """Comma-separated ``column op value`` terms (ops ``= != < <= > >= ~``), all of which must hold, e.g.
    ``type=vanishing, lr>=0.01, node~block``. ``columns`` (when given) are the known column names."""
    conditions = []
    for term in (t for t in text.split(",") if t.strip()):
        found = _TERM.match(term)
        if found is None:
            raise InvalidArgumentError(f"cannot read the filter term {term.strip()!r}; write column, operator "
                                       f"({' '.join(_OPERATORS)}) and value, e.g. 'type=vanishing, lr>=0.01'")
        column, operator, value = found.groups()
        if columns is not None and column not in columns:
            raise InvalidArgumentError(f"unknown column {column!r} in the filter; columns are {', '.join(columns)}")
        conditions.append(Condition(column, operator, value))
    return tuple(conditions)


def filter_rows(rows: Iterable[Mapping[str, Any]], conditions: Sequence[Condition]) -> list[Mapping[str, Any]]:
    """The rows for which every condition holds, in their order."""
    return [row for row in rows if all(c.holds(row) for c in conditions)]


def sort_rows(rows: Iterable[Mapping[str, Any]], column: str, *, descending: bool = False) -> list[Mapping[str, Any]]:
    """The rows sorted by ``column``: numbers by value, then text; missing and NaN cells last either way."""
    def key(row: Mapping[str, Any]) -> tuple[int, float, str]:
        cell = row.get(column)
        number = _number(cell)
        if number is not None:
            return 0, (-number if descending else number), ""
        if cell is None or cell == "" or (isinstance(cell, float) and math.isnan(cell)):
            return 2, 0.0, ""
        return 1, 0.0, str(cell)

    ordered = sorted(rows, key=key)
    if descending:  # text descending too, keeping numbers first and missing last
        texts = [r for r in ordered if key(r)[0] == 1]
        texts.reverse()
        ordered = [r for r in ordered if key(r)[0] == 0] + texts + [r for r in ordered if key(r)[0] == 2]
    return ordered

"""User-defined visualizations for the Custom tab, loaded from a Python file given with ``--visualization-file``.

The contract (see ``docs/gui.md``): the file defines ``visualize(recording, selection)``, which receives
the open :class:`~comgra_ndbg.store.reader.Recording` of the selected trial and the current
:class:`~comgra_ndbg.gui.state.Selection`, and returns what Dash can render — a component, a string, a
number, or a list of those. It may define ``TITLE`` (the tab's heading). The file is the user's own code
and runs with the user's rights, like a training script; "safely" here means that a broken file is
reported with a clear message when the explorer starts, and an exception inside ``visualize`` is shown in
the tab with its traceback instead of breaking the explorer.
"""
from __future__ import annotations

import hashlib
import importlib.util
import inspect
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dash import html
from dash.development.base_component import Component

from comgra_ndbg.errors import ComgraError
from comgra_ndbg.gui.state import Selection
from comgra_ndbg.store.reader import Recording

__all__ = ["CustomVisualizationError", "Visualization", "load_visualization"]

FUNCTION_NAME = "visualize"


class CustomVisualizationError(ComgraError, ValueError):
    """The visualization file cannot be used: missing, not Python, failing on import, or without
    ``visualize(recording, selection)``."""


@dataclass(frozen=True)
class Visualization:
    """A loaded visualization: its file, its ``visualize`` function and the tab heading."""

    path: Path
    function: Callable[[Recording, Selection], Any]
    title: str

    def render(self, recording: Recording, selection: Selection) -> Any:
        """What ``visualize`` returns for this selection, or an error box with the traceback."""
        try:
            result = self.function(recording, selection)
        except Exception:  # the user's code must not break the explorer; show what went wrong instead
            return _error(f"{self.path.name}: visualize() raised an exception\n\n{traceback.format_exc(limit=-5)}")
        if not _renderable(result):
            return _error(f"{self.path.name}: visualize() returned a {type(result).__name__}; return a Dash "
                          f"component (e.g. dash.html.Div or dash.dcc.Graph), a string, a number, or a list of them")
        return result


def load_visualization(path: str | Path) -> Visualization:
    """Import the file at ``path`` and check that it defines ``visualize(recording, selection)``.

    Raises :class:`CustomVisualizationError` naming the file and the fix.
    """
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise CustomVisualizationError(f"visualization file {path} does not exist; pass a Python file that "
                                       f"defines visualize(recording, selection)")
    if path.suffix != ".py":
        raise CustomVisualizationError(f"visualization file {path} is not a .py file")
    name = "comgra_ndbg_custom_" + hashlib.sha1(str(path).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise CustomVisualizationError(f"cannot import {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as error:  # report any import-time failure of the user's file with its location
        where = traceback.extract_tb(error.__traceback__)[-1]
        line = getattr(error, "lineno", None) or where.lineno
        raise CustomVisualizationError(f"importing {path} failed at line {line}: {type(error).__name__}: "
                                       f"{error}") from error
    function = getattr(module, FUNCTION_NAME, None)
    if not callable(function):
        raise CustomVisualizationError(f"{path} defines no function {FUNCTION_NAME}(recording, selection); "
                                       f"add one that returns a Dash component")
    try:
        inspect.signature(function).bind(None, None)
    except TypeError:
        raise CustomVisualizationError(f"{path}: {FUNCTION_NAME}{inspect.signature(function)} cannot be called "
                                       f"with (recording, selection); give it exactly those two parameters") from None
    title = getattr(module, "TITLE", None)
    return Visualization(path, function, title if isinstance(title, str) and title else path.stem)


def _renderable(value: Any) -> bool:
    if value is None or isinstance(value, (str, int, float, Component)):
        return not isinstance(value, bool)
    if isinstance(value, (list, tuple)):
        return all(_renderable(v) for v in value)
    return False


def _error(text: str) -> html.Div:
    return html.Div(text, className="message error")

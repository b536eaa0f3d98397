"""What a Jupyter notebook shows: the explorer inline (:func:`show`) and diagnoses as rich HTML
(:func:`diagnosis_html`, behind ``Diagnosis._repr_html_`` and the result of ``NeuralDbg.explain_failure()``).

The HTML is built from the diagnosis alone (no file is read) and every text is escaped:

>>> from comgra_ndbg.analysis.events import Diagnosis
>>> print(diagnosis_html(Diagnosis("a<b", 12, 11, (), (), ())))
<div class="comgra-diagnosis"><p><b>Trial a&lt;b</b>: no failure found in 12 recorded steps.</p></div>
"""
from __future__ import annotations

import html
import socket
from pathlib import Path
from typing import Any

from comgra_ndbg.errors import MissingDependencyError, NotebookError

__all__ = ["show", "in_notebook", "diagnosis_html"]

_STYLE = ("border-collapse:collapse;text-align:left;font-size:13px", "padding:3px 8px;border-bottom:1px solid #ddd;"
          "vertical-align:top")


def diagnosis_html(diagnosis: Any) -> str:
    """An HTML block of a :class:`~comgra_ndbg.analysis.Diagnosis`: the trial and its steps, then one row
    per hypothesis, best first (rank, type, origin, node, onset, confidence, explanation and remedy), the
    number of events, and the notes."""
    title = f"<b>Trial {html.escape(diagnosis.trial)}</b>"
    notes = "".join(f"<p><i>Note:</i> {html.escape(note)}</p>" for note in diagnosis.notes)
    if not diagnosis.hypotheses:
        return (f'<div class="comgra-diagnosis"><p>{title}: no failure found in {diagnosis.num_steps} recorded '
                f"steps.</p>{notes}</div>")
    table, cell = _STYLE
    head = "".join(f'<th style="{cell}">{name}</th>' for name in ("#", "failure", "origin", "node", "onset",
                                                                   "confidence", "explanation"))
    rows = []
    for rank, h in enumerate(diagnosis.hypotheses, start=1):
        remedy = (f"<br><i>Remedy:</i> {html.escape(h.remedy)}" if h.remedy and h.remedy not in h.sentence
                  else "")
        values = (str(rank), html.escape(h.type), html.escape(h.origin), f"<code>{html.escape(h.node)}</code>"
                  if h.node else "", str(h.onset), f"{h.confidence:.2f}", html.escape(h.sentence) + remedy)
        rows.append("<tr>" + "".join(f'<td style="{cell}">{value}</td>' for value in values) + "</tr>")
    count = len(diagnosis.hypotheses)
    return (f'<div class="comgra-diagnosis"><p>{title}: {count} failure hypothes{"is" if count == 1 else "es"} '
            f"in {diagnosis.num_steps} recorded steps, best first ({len(diagnosis.events)} events).</p>"
            f'<table style="{table}"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
            f"{notes}</div>")


def in_notebook() -> bool:
    """Whether this code runs in a Jupyter kernel (a notebook, JupyterLab, VS Code's notebooks), where
    output cells can show HTML; a terminal IPython is no kernel."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def show(path: str | Path, *, height: int = 900, port: int | None = None, host: str = "127.0.0.1",
         visualization_file: str | Path | None = None, server_url: str | None = None) -> None:
    """Show the explorer for the recording(s) at ``path`` inline in the notebook's output cell.

    The explorer is served by a thread of the kernel (Dash's ``jupyter_mode="inline"``) on ``host:port``
    (default: a free port) and shown in an iframe ``height`` pixels high; it lives as long as the kernel,
    and calling ``show`` again on the same port replaces it. ``server_url`` is the address the browser
    reaches the kernel's machine at, when that is not ``http://host:port`` (a remote JupyterHub behind a
    proxy). Outside a Jupyter kernel this raises :class:`NotebookError`: run ``comgra-ndbg gui PATH``.
    """
    if not in_notebook():
        raise NotebookError(f"comgra_ndbg.show({str(path)!r}) shows the explorer inside a Jupyter notebook, and "
                            f"this is not a Jupyter kernel; in a terminal run `comgra-ndbg gui {path}` and open "
                            f"the address it prints")
    try:
        import ipykernel  # noqa: F401  (Dash's inline mode talks to the kernel through it)
    except ImportError:
        raise MissingDependencyError("showing the explorer in a notebook needs ipykernel; install it with "
                                     "`pip install 'comgra-ndbg[notebook]'`") from None
    from comgra_ndbg.gui.app import check_address, create_app

    app = create_app(path, visualization_file=visualization_file)
    port = _free_port(host) if port is None else port
    check_address(host, port)
    app.run(jupyter_mode="inline", host=host, port=port, jupyter_height=height, jupyter_server_url=server_url)


def _free_port(host: str) -> int:
    """A port nothing listens on now, chosen by the operating system."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])

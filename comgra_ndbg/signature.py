"""Draw a failure signature (:mod:`comgra_ndbg.analysis.signature`) as one PNG: two log-scale heatmaps.

Left the per-layer gradient norms, right the activation norms, layers top to bottom in forward order and
recorded steps left to right. The onset step is a dashed line, the failure step (the first event of the
hypothesis's chain, when it differs) a dotted one, the origin layer a red box across both heatmaps with
its name in red, and the top hypothesis's sentence is the title. Cells of tensors that held NaN or Inf
carry an ``x``; grey cells were not recorded; norms of exactly 0 take the lowest colour.

Matplotlib draws through its Agg canvas only (no pyplot, no global backend change), so this works on a
server without a display and inside a running GUI. :func:`signature_of` is the shell that reads a
recording; ``comgra-ndbg signature PATH -o failure.png`` calls it and :func:`write_png`.

>>> import tempfile, torch
>>> from comgra_ndbg import Recorder
>>> with tempfile.TemporaryDirectory() as folder:
...     with Recorder(folder, trial="t") as rec:
...         for step in range(30):
...             with rec.step(step):
...                 _ = rec.register_tensor("x", torch.ones(4, 2), role="input")
...                 rec.record_kpi("loss", 1.0)
...     signature_of(folder)
Traceback (most recent call last):
    ...
comgra_ndbg.errors.NoFailureError: trial 't' has no failure: ...
"""
from __future__ import annotations

import base64
import io
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from comgra_ndbg.analysis.signature import DEFAULT_STEPS, Signature, failure_signature
from comgra_ndbg.errors import InvalidArgumentError, MissingDependencyError

if TYPE_CHECKING:
    from matplotlib.colors import LogNorm
    from matplotlib.figure import Figure

__all__ = ["ORIGIN_COLOUR", "signature_of", "signature_figure", "png_bytes", "write_png", "data_uri"]

ORIGIN_COLOUR = "#ff0000"
ONSET_COLOUR = "#ffffff"
FAILURE_COLOUR = "#ff9900"
NOT_RECORDED = "#d9d9d9"
COLOURMAP = "viridis"  # no red in it, so the origin box stands out
MAX_HEIGHT_INCHES = 24  # 500-node networks: the rows get thinner, the image does not grow past this
MAX_LABELS = 70  # layer names shown at most; beyond, every k-th (and always the origin)
_PANELS = (("gradient", "gradient norm ‖∂L/∂x‖ (log)"), ("activation", "activation norm ‖x‖ (log)"))


def signature_of(path: str | Path, *, trial: str | None = None, steps: int = DEFAULT_STEPS) -> Signature:
    """The failure signature of a recording (a group folder with ``trial``, a trial folder or a ``.h5``
    file), from its stored diagnosis when that is up to date, else from a fresh analysis (stored)."""
    from comgra_ndbg.analysis.loading import load_series
    from comgra_ndbg.export import current_diagnosis
    from comgra_ndbg.store.reader import list_trials, open_recording

    if trial is None and len(trials := list_trials(path)) > 1:
        raise InvalidArgumentError(f"{path} holds {len(trials)} trials ({', '.join(trials)}); name the one to draw "
                                   f"with trial=... (--trial on the command line)")
    with open_recording(path, trial) as recording:
        diagnosis, _ = current_diagnosis(recording)
        return failure_signature(load_series(recording), diagnosis, steps=steps)


def _matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise MissingDependencyError("drawing a failure signature needs matplotlib; install it with "
                                     "`pip install matplotlib` (a dependency of comgra_ndbg)") from None


def _norm(values: np.ndarray) -> LogNorm:
    from matplotlib.colors import LogNorm

    positive = values[np.isfinite(values) & (values > 0)]
    if not len(positive):
        return LogNorm(1e-12, 1.0, clip=True)
    low, high = float(positive.min()), float(positive.max())
    return LogNorm(low, high * 1.0001 if high <= low else high, clip=True)


def _label(name: str, role: str) -> str:
    return f"{name} (weights)" if role == "parameter" else name


def signature_figure(signature: Signature, *, dpi: int = 100) -> Figure:
    """The signature as a matplotlib ``Figure`` on an Agg canvas (``figure.canvas``), ready to save."""
    _matplotlib()
    import matplotlib.patheffects as effects
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    rows, columns = len(signature.layers), len(signature.steps)
    figure = Figure(figsize=(13, min(2.6 + 0.32 * max(rows, 3), MAX_HEIGHT_INCHES)), dpi=dpi)
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, 2, sharey=True)
    cmap = colormaps[COLOURMAP].with_extremes(bad=NOT_RECORDED)
    ticks = np.unique(np.linspace(0, columns - 1, min(columns, 10)).round().astype(int)) if columns else []
    outline = [effects.withStroke(linewidth=3.5, foreground="black")]
    for k, (ax, (attribute, caption)) in enumerate(zip(axes, _PANELS)):
        values = getattr(signature, attribute)
        norm = _norm(values)
        shown = np.where(values == 0, norm.vmin, values) if len(values) else np.zeros((rows, columns))
        image = ax.imshow(np.ma.masked_invalid(shown), cmap=cmap, norm=norm, aspect="auto",
                          interpolation="nearest")
        figure.colorbar(image, ax=ax, fraction=0.04, pad=0.02)
        bad_rows, bad_columns = np.nonzero(signature.nonfinite[k])
        if len(bad_rows):
            ax.scatter(bad_columns, bad_rows, marker="x", color="black", s=30, linewidths=1.5)
        ax.set_title(caption, fontsize=10)
        ax.set_xticks(ticks, [str(signature.steps[i]) for i in ticks], fontsize=8)
        ax.set_xlabel("step")
        if signature.onset_column is not None:
            ax.axvline(signature.onset_column, color=ONSET_COLOUR, linestyle="--", linewidth=2,
                       path_effects=outline)
        failure = signature.failure_column
        if failure is not None and signature.failure_step != signature.onset:
            ax.axvline(failure, color=FAILURE_COLOUR, linestyle=":", linewidth=2, path_effects=outline)
        if signature.origin_row is not None:
            ax.add_patch(Rectangle((-0.5, signature.origin_row - 0.5), columns, 1, fill=False,
                                   edgecolor=ORIGIN_COLOUR, linewidth=3, zorder=5))
    every = max(1, -(-rows // MAX_LABELS))  # a large network: every k-th layer named, and the origin
    labelled = sorted(set(range(0, rows, every)) | ({signature.origin_row} if signature.origin_row is not None else set()))
    axes[0].set_yticks(labelled, [_label(signature.layers[i], signature.roles[i]) for i in labelled],
                       fontsize=8 if every == 1 else 6)
    if signature.origin_row is not None:
        label = axes[0].get_yticklabels()[labelled.index(signature.origin_row)]
        label.set_color(ORIGIN_COLOUR)
        label.set_fontweight("bold")
    figure.suptitle("\n".join(textwrap.wrap(signature.title, 130)), fontsize=10)
    figure.text(0.01, 0.01, _legend(signature), fontsize=8)
    height = figure.get_size_inches()[1]  # margins in inches: the title and the step axis keep their room
    figure.subplots_adjust(left=0.16, right=0.97, top=1 - 0.95 / height, bottom=1.05 / height, wspace=0.12)
    return figure


def _legend(signature: Signature) -> str:
    origin = (f"red box: origin '{signature.origin}'" if signature.origin_row is not None else
              f"origin: {signature.origin or 'the ' + signature.origin_kind} (no row of its own)")
    onset = f"dashed line: onset step {signature.onset}"
    if signature.onset_column is None:
        onset = f"onset step {signature.onset} (outside the window)"
    parts = [f"trial {signature.trial}", f"{signature.type}", onset, origin]
    if signature.failure_step != signature.onset:
        parts.append(f"dotted line: first chain event, step {signature.failure_step}")
    parts.append("x: NaN/Inf in the tensor · grey: not recorded")
    return " · ".join(parts)


def png_bytes(signature: Signature, *, dpi: int = 100) -> bytes:
    """The signature as PNG bytes."""
    figure = signature_figure(signature, dpi=dpi)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


def write_png(signature: Signature, path: str | Path, *, dpi: int = 100) -> Path:
    """Write the signature as a PNG file at ``path``; returns the path."""
    path = Path(path)
    path.write_bytes(png_bytes(signature, dpi=dpi))
    return path


def data_uri(signature: Signature, *, dpi: int = 80) -> str:
    """The signature as a ``data:image/png;base64,...`` address, for an ``<img>`` in the GUI."""
    return "data:image/png;base64," + base64.b64encode(png_bytes(signature, dpi=dpi)).decode("ascii")

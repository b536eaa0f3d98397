"""A tensor's element values as a small image: one pixel per element, coloured on the scale of its values.

The explorer shows a snapshot's element values (up to :data:`comgra_ndbg.gui.panels.HEATMAP_LIMIT` cells)
as a PNG scaled up in the browser, with a colour bar and a readout of the cell under the pointer, instead
of a plotly.js heatmap: a heatmap plot costs the browser 10–15 ms to draw on every tap at a step with a
snapshot (its axes, colour bar and hover layer), an image about one. Colours follow plotly's: Viridis for
non-negative values, RdBu reversed and centred on 0 for values of both signs; cells not stored (NaN in the
dense array) are transparent.

Pure functions: arrays in, bytes and plain data out, no I/O.
"""
from __future__ import annotations

import base64
import struct
import zlib
from dataclasses import dataclass

import numpy as np
from plotly.colors import diverging, sequential

__all__ = ["DIVERGING_STOPS", "SEQUENTIAL_STOPS", "ValueImage", "colour_cells", "gradient_css", "png_bytes",
           "value_image"]


def _rgb(colour: str) -> tuple[int, int, int]:
    """``'#440154'`` or ``'rgb(103,0,31)'`` as an (r, g, b) tuple."""
    if colour.startswith("#"):
        return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)
    r, g, b = (int(part) for part in colour[colour.index("(") + 1:-1].split(","))
    return r, g, b


SEQUENTIAL_STOPS = np.array([_rgb(c) for c in sequential.Viridis], dtype=np.float64)  # low -> high
DIVERGING_STOPS = np.array([_rgb(c) for c in reversed(diverging.RdBu)], dtype=np.float64)  # blue < 0 < red


@dataclass(frozen=True)
class ValueImage:
    """What the page draws for a matrix of element values.

    ``src``: the PNG as a data URI; ``low``/``high``: the values at the two ends of the colour bar (for
    values of both signs, ``-m`` and ``m`` with ``m`` the largest magnitude, so that 0 sits in the middle);
    ``diverging``: which scale; ``gradient``: the colour bar as a CSS ``linear-gradient``; ``cells``: the
    values row by row, None where not stored (the readout and the CSV export read them)."""

    src: str
    low: float
    high: float
    diverging: bool
    gradient: str
    cells: list[list[float | None]]


def colour_cells(matrix: np.ndarray) -> tuple[np.ndarray, float, float, bool]:
    """RGBA bytes (rows × columns × 4) of a 2-D array, the values at the two ends of its scale and whether the
    scale is diverging. Non-finite cells are transparent; a constant array takes the middle colour.

    >>> rgba, low, high, signed = colour_cells(np.array([[0.0, 1.0, np.nan]]))
    >>> rgba[0, 0].tolist(), rgba[0, 1].tolist(), int(rgba[0, 2, 3]), (low, high, signed)
    ([68, 1, 84, 255], [253, 231, 37, 255], 0, (0.0, 1.0, False))
    """
    values = np.asarray(matrix, dtype=np.float64)
    finite = np.isfinite(values)
    shown = values[finite]
    signed = bool(len(shown)) and float(shown.min()) < 0
    if signed:
        magnitude = float(np.abs(shown).max())
        low, high = -magnitude, magnitude
        stops = DIVERGING_STOPS
    else:
        low, high = (float(shown.min()), float(shown.max())) if len(shown) else (0.0, 1.0)
        stops = SEQUENTIAL_STOPS
    span = high - low
    where = np.where(finite, (values - low) / span if span > 0 else 0.5, 0.0)
    position = np.clip(where, 0.0, 1.0) * (len(stops) - 1)
    below = np.minimum(np.floor(position).astype(np.int64), len(stops) - 2)
    fraction = (position - below)[..., None]
    rgb = stops[below] * (1.0 - fraction) + stops[below + 1] * fraction
    rgba = np.empty(values.shape + (4,), dtype=np.uint8)
    rgba[..., :3] = np.rint(rgb).astype(np.uint8)
    rgba[..., 3] = np.where(finite, 255, 0)
    return rgba, low, high, signed


def png_bytes(rgba: np.ndarray) -> bytes:
    """A PNG file (8-bit RGBA, no interlace) of a rows × columns × 4 array of bytes."""
    rgba = np.ascontiguousarray(rgba, dtype=np.uint8)
    height, width = rgba.shape[:2]
    raw = np.zeros((height, 1 + 4 * width), dtype=np.uint8)  # each row starts with filter type 0 (none)
    raw[:, 1:] = rgba.reshape(height, 4 * width)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw.tobytes(), 6))
            + chunk(b"IEND", b""))


def gradient_css(diverging_scale: bool) -> str:
    """The colour bar of a scale as a left-to-right CSS gradient."""
    stops = DIVERGING_STOPS if diverging_scale else SEQUENTIAL_STOPS
    parts = [f"rgb({int(r)},{int(g)},{int(b)}) {100 * i / (len(stops) - 1):.1f}%" for i, (r, g, b) in enumerate(stops)]
    return "linear-gradient(to right, " + ", ".join(parts) + ")"


def value_image(matrix: np.ndarray) -> ValueImage:
    """The image, scale and cells of a 2-D array of element values (NaN: not stored)."""
    values = np.asarray(matrix, dtype=np.float64)
    if values.ndim != 2 or 0 in values.shape:
        raise ValueError(f"element values must be a non-empty 2-D array to draw as an image; got shape {values.shape}")
    rgba, low, high, signed = colour_cells(values)
    src = "data:image/png;base64," + base64.b64encode(png_bytes(rgba)).decode("ascii")
    cells = [[float(v) if v == v and abs(v) != float("inf") else None for v in row] for row in values.tolist()]
    return ValueImage(src=src, low=low, high=high, diverging=signed, gradient=gradient_css(signed), cells=cells)

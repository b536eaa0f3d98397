"""Element values drawn as an image: the PNG holds one pixel per element in the colour of its value on the
scale the colour bar shows, cells not stored are transparent, and the page gets the cells, row names and
labels its readout and exports read."""
from __future__ import annotations

import base64
import json
import struct
import zlib

import numpy as np
import pytest
from plotly.colors import diverging, sequential

from comgra_ndbg.gui import ids
from comgra_ndbg.gui.value_image import colour_cells, gradient_css, png_bytes, value_image
from comgra_ndbg.gui.views import value_view


def decode_png(data: bytes) -> np.ndarray:
    """The RGBA pixels of a PNG written by ``png_bytes`` (8-bit RGBA, filter 0), checking every chunk's CRC."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    position, chunks = 8, {}
    while position < len(data):
        length, = struct.unpack(">I", data[position:position + 4])
        kind, body = data[position + 4:position + 8], data[position + 8:position + 8 + length]
        crc, = struct.unpack(">I", data[position + 8 + length:position + 12 + length])
        assert crc == zlib.crc32(kind + body) & 0xFFFFFFFF, kind
        chunks[kind] = chunks.get(kind, b"") + body
        position += 12 + length
    width, height, depth, colour_type = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
    assert (depth, colour_type) == (8, 6) and b"IEND" in chunks
    raw = np.frombuffer(zlib.decompress(chunks[b"IDAT"]), dtype=np.uint8).reshape(height, 1 + 4 * width)
    assert (raw[:, 0] == 0).all()
    return raw[:, 1:].reshape(height, width, 4)


def rgb(colour: str) -> list[int]:
    if colour.startswith("#"):
        return [int(colour[i:i + 2], 16) for i in (1, 3, 5)]
    return [int(part) for part in colour[4:-1].split(",")]


def test_the_png_holds_the_pixels_it_was_given() -> None:
    pixels = np.random.default_rng(0).integers(0, 256, size=(3, 5, 4), dtype=np.uint8)
    assert np.array_equal(decode_png(png_bytes(pixels)), pixels)
    assert decode_png(png_bytes(pixels[:1, :1])).shape == (1, 1, 4)


def test_non_negative_values_span_viridis_from_their_minimum_to_their_maximum() -> None:
    rgba, low, high, signed = colour_cells(np.array([[2.0, 6.0], [4.0, 2.0 + 4.0 / 9.0]]))
    assert (low, high, signed) == (2.0, 6.0, False)
    assert rgba[0, 0, :3].tolist() == rgb(sequential.Viridis[0])
    assert rgba[0, 1, :3].tolist() == rgb(sequential.Viridis[-1])
    assert rgba[1, 1, :3].tolist() == rgb(sequential.Viridis[1])  # a ninth of the way: the second stop exactly
    between = (np.array(rgb(sequential.Viridis[4])) + np.array(rgb(sequential.Viridis[5]))) / 2  # halfway: 4.5/9
    assert np.abs(rgba[1, 0, :3].astype(int) - between).max() <= 1
    assert (rgba[..., 3] == 255).all()


def test_values_of_both_signs_are_centred_on_zero_blue_below_red_above() -> None:
    rgba, low, high, signed = colour_cells(np.array([[-1.0, 0.0, 4.0, -4.0]]))
    assert (low, high, signed) == (-4.0, 4.0, True)  # symmetric, so 0 sits in the middle of the bar
    assert rgba[0, 3, :3].tolist() == rgb(diverging.RdBu[-1])  # the most negative: dark blue
    assert rgba[0, 2, :3].tolist() == rgb(diverging.RdBu[0])  # the most positive: dark red
    assert rgba[0, 1, :3].tolist() == rgb(diverging.RdBu[5])  # zero: the white middle
    assert "rgb(5,48,97) 0.0%" in gradient_css(True) and gradient_css(True).endswith("rgb(103,0,31) 100.0%)")
    assert gradient_css(False).startswith("linear-gradient(to right, rgb(68,1,84) 0.0%")


def test_cells_not_stored_or_not_finite_are_transparent_and_read_as_missing() -> None:
    image = value_image(np.array([[1.0, np.nan], [np.inf, 3.0]]))
    pixels = decode_png(base64.b64decode(image.src.split(",", 1)[1]))
    assert pixels[..., 3].tolist() == [[255, 0], [0, 255]]
    assert image.cells == [[1.0, None], [None, 3.0]] and (image.low, image.high) == (1.0, 3.0)


@pytest.mark.parametrize("values", [np.full((2, 2), 7.0), np.full((1, 3), np.nan)])
def test_a_constant_or_empty_array_takes_one_colour_without_dividing_by_zero(values: np.ndarray) -> None:
    rgba, low, high, _ = colour_cells(values)
    assert np.isfinite([low, high]).all() and len({tuple(p) for p in rgba.reshape(-1, 4).tolist()}) == 1


def test_only_a_non_empty_matrix_is_drawn() -> None:
    for bad in (np.zeros(3), np.zeros((0, 4)), np.zeros((2, 2, 2))):
        with pytest.raises(ValueError, match="non-empty 2-D array"):
            value_image(bad)


def find(component: object, component_id: str) -> object | None:
    if getattr(component, "id", None) == component_id:
        return component
    children = getattr(component, "children", None)
    for child in children if isinstance(children, list) else [children]:
        found = find(child, component_id) if child is not None and not isinstance(child, str) else None
        if found is not None:
            return found
    return None


def texts(component: object) -> list[str]:
    children = getattr(component, "children", None)
    if isinstance(children, str):
        return [children]
    return [t for child in (children if isinstance(children, list) else [children]) if child is not None
            for t in ([child] if isinstance(child, str) else texts(child))]


def test_the_view_carries_cells_row_names_labels_and_names_its_corners_and_scale() -> None:
    matrix = np.array([[0.5, -1.0, 2.0], [1.0, 0.0, -2.0]])
    view = value_view(value_image(matrix), title="element values · (2, 3)", row_label="sample", column_label="index",
                      row_names=[4, 9], height=40)
    image = find(view, ids.VALUES_IMAGE)
    assert json.loads(getattr(image, "data-cells")) == matrix.tolist()
    assert json.loads(getattr(image, "data-rows")) == ["4", "9"]
    assert (getattr(image, "data-row-label"), getattr(image, "data-column-label")) == ("sample", "index")
    assert image.style == {"height": "40px"}
    shown = texts(view)
    assert ["sample 4", "sample 9", "index 0", "index 2", "-2", "2"] == [t for t in shown if t in (
        "sample 4", "sample 9", "index 0", "index 2", "-2", "2")]
    assert "· 0 in the middle (white)" in shown
    other = find(value_view(value_image(matrix * 2), title="", row_label="row", column_label="index"), ids.VALUES_IMAGE)
    assert getattr(other, "data-stamp") != getattr(image, "data-stamp")  # the page re-reads the cells of a new image
    assert json.loads(getattr(other, "data-rows")) == ["0", "1"]
    renamed = find(value_view(value_image(matrix), title="", row_label="sample", column_label="index",
                              row_names=[5, 9]), ids.VALUES_IMAGE)
    assert getattr(renamed, "data-stamp") != getattr(image, "data-stamp")  # the same cells, other samples

"""The page's script for a snapshot's element values drawn as an image (:func:`comgra_ndbg.gui.views.value_view`):
the readout of the cell under the pointer, and saving the image (scaled up, cells kept sharp) and its cells.

The image carries its cells as JSON in ``data-cells``, with the row names and axis labels beside them; the
readout parses them once per image (``data-stamp`` tells a new image from the same element reused) and
names the row, the column and the value. Functions live in ``window.dash_clientside.comgraValues``;
:data:`comgra_ndbg.gui.clientside.SCRIPT` inlines this script and calls ``save`` from its export callback.
"""
from __future__ import annotations

__all__ = ["VALUES_SCRIPT"]

VALUES_SCRIPT = """
window.dash_clientside = Object.assign({}, window.dash_clientside, {comgraValues: (function () {
  const EXPORT_PIXELS = 2048;  // a saved image's longer side at most, in whole pixels per cell
  function parsed(img) {
    if (img.__stamp !== img.dataset.stamp) {
      img.__stamp = img.dataset.stamp;
      img.__cells = JSON.parse(img.dataset.cells || '[]');
      img.__rows = JSON.parse(img.dataset.rows || '[]');
    }
    return img.__cells;
  }
  const number = (v) => (v === null || v === undefined ? 'not stored' :
                         (Number.isInteger(v) ? String(v) : Number(v).toPrecision(6).replace(/\\.?0+(e|$)/, '$1')));
  function cellAt(img, event) {
    const cells = parsed(img), rows = cells.length, columns = rows ? cells[0].length : 0;
    const box = img.getBoundingClientRect();
    const x = event.clientX - box.left - img.clientLeft, y = event.clientY - box.top - img.clientTop;
    if (!rows || x < 0 || y < 0 || x >= img.clientWidth || y >= img.clientHeight) { return null; }
    const row = Math.min(rows - 1, Math.floor(y / img.clientHeight * rows));
    const column = Math.min(columns - 1, Math.floor(x / img.clientWidth * columns));
    return {row: row, column: column, value: cells[row][column]};
  }
  function readout(img) { return img.closest('.values-view').querySelector('.values-readout'); }
  document.addEventListener('mousemove', (event) => {
    const img = event.target;
    if (!img || !img.classList || !img.classList.contains('values-image')) { return; }
    const cell = cellAt(img, event), out = readout(img);
    if (!cell || !out) { return; }
    out.textContent = img.dataset.rowLabel + ' ' + img.__rows[cell.row] + ', ' + img.dataset.columnLabel + ' ' +
      cell.column + ': ' + number(cell.value);
  });
  document.addEventListener('mouseout', (event) => {
    const img = event.target;
    if (img && img.classList && img.classList.contains('values-image') && readout(img)) {
      readout(img).textContent = 'point at a cell to read its value';
    }
  });
  return {
    read: function (img, x, y) {  // the readout's cell at client coordinates (x, y), for tests and tools
      return cellAt(img, {clientX: x, clientY: y});
    },
    save: function (img, format, name, download, field) {  // field: a CSV cell, quoted where it must be
      const cells = parsed(img);
      if (format === 'csv') {
        const lines = [[img.dataset.rowLabel, img.dataset.columnLabel, 'value'].map(field).join(',')];
        cells.forEach((row, i) => row.forEach((v, j) => lines.push(
          [field(img.__rows[i]), j, field(v)].join(','))));
        download(name, new Blob([lines.join('\\n') + '\\n'], {type: 'text/csv'}));
        return;
      }
      const rows = cells.length, columns = rows ? cells[0].length : 0;
      const scale = Math.max(1, Math.floor(EXPORT_PIXELS / Math.max(rows, columns, 1)));
      const canvas = document.createElement('canvas');
      canvas.width = columns * scale; canvas.height = rows * scale;
      const context = canvas.getContext('2d');
      context.imageSmoothingEnabled = false;
      context.drawImage(img, 0, 0, canvas.width, canvas.height);
      canvas.toBlob((blob) => download(name, blob), 'image/png');
    },
  };
})()});
"""

"""The page's script that draws a tensor's histogram (:func:`comgra_ndbg.gui.views.histogram_view`) on its
canvas, reads out the bar under the pointer and saves the histogram as PNG and its bins as CSV.

The canvas carries the bins' counts and edges; the script draws every histogram canvas whose bins it has not
drawn yet as soon as it is put in the page (a ``MutationObserver``'s callback runs before the browser's next
paint, so the bars show in the same frame as the rest of the view), and again when it is resized.
Axes get round-numbered ticks, the bars the theme's colour, the text the page's. Functions live in
``window.dash_clientside.comgraHistogram``; :data:`comgra_ndbg.gui.clientside.SCRIPT` inlines this script
and calls ``save`` from its export callback.
"""
from __future__ import annotations

import json

from comgra_ndbg.gui import ids

__all__ = ["HISTOGRAM_SCRIPT", "MARGIN"]

MARGIN = {"left": 52, "right": 12, "top": 8, "bottom": 36}  # around the bars, in CSS pixels

HISTOGRAM_SCRIPT = """
window.dash_clientside = Object.assign({}, window.dash_clientside, {comgraHistogram: (function () {
  const M = %(margin)s, PANEL = %(panel)s;
  function bins(canvas) {
    if (canvas.__stamp !== canvas.dataset.stamp) {
      canvas.__stamp = canvas.dataset.stamp;
      canvas.__counts = JSON.parse(canvas.dataset.counts || '[]');
      canvas.__edges = JSON.parse(canvas.dataset.edges || '[]');
    }
    return {counts: canvas.__counts, edges: canvas.__edges};
  }
  function ticks(low, high, count, least) {
    // About `count` round numbers (1, 2 or 5 times a power of ten apart, at least `least`) from low to high.
    const raw = Math.max((high - low) / Math.max(count, 1), least || 0);
    const power = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map((f) => f * power).find((s) => s >= raw) || 10 * power;
    const found = [];
    for (let v = Math.ceil(low / step) * step; v <= high + step * 1e-9; v += step) { found.push([v, step]); }
    return found;
  }
  function label(v, step) {
    if (Math.abs(v) < step * 1e-9) { return '0'; }
    if (Math.abs(v) >= 1e5 || step < 1e-4) { return v.toExponential(Math.max(0, Math.min(3, Math.round(
      Math.log10(Math.abs(v) / step))))).replace('e+', 'e'); }
    return v.toFixed(Math.max(0, -Math.floor(Math.log10(step) + 1e-9)));
  }
  function paint(canvas, target, width, height, scale, title) {
    // Draw `canvas`'s bins on `target` (the canvas itself, or one to save, with the title above the bars),
    // width × height CSS pixels.
    const {counts, edges} = bins(canvas);
    const ctx = target.getContext('2d'), above = title ? 22 : 0;
    target.width = Math.round(width * scale); target.height = Math.round((height + above) * scale);
    ctx.setTransform(scale, 0, 0, scale, 0, 0);
    const style = getComputedStyle(canvas), text = style.color, grid = style.borderTopColor;
    if (title) {
      ctx.fillStyle = style.backgroundColor; ctx.fillRect(0, 0, width, height + above);
      ctx.fillStyle = text; ctx.font = '13px ' + style.fontFamily; ctx.textBaseline = 'top';
      ctx.fillText(title, 8, 6);
      ctx.translate(0, above);
    }
    const w = width - M.left - M.right, h = height - M.top - M.bottom;
    if (!counts.length || w <= 0 || h <= 0) { return; }
    const low = edges[0], high = edges[edges.length - 1], top = Math.max(...counts, 1);
    const x = (v) => M.left + (v - low) / (high - low) * w, y = (c) => M.top + h - c / top * h;
    ctx.font = '11px ' + style.fontFamily; ctx.fillStyle = text; ctx.strokeStyle = grid; ctx.lineWidth = 1;
    ctx.textAlign = 'right'; ctx.textBaseline = 'middle';
    ticks(0, top, Math.max(2, Math.floor(h / 40)), 1).forEach(([c, step]) => {
      ctx.beginPath(); ctx.moveTo(M.left, Math.round(y(c)) + 0.5); ctx.lineTo(M.left + w, Math.round(y(c)) + 0.5);
      ctx.stroke(); ctx.fillText(label(c, step), M.left - 6, y(c));
    });
    ctx.fillStyle = canvas.dataset.colour;
    counts.forEach((c, i) => {
      if (!c) { return; }
      const left = x(edges[i]), right = x(edges[i + 1]);
      ctx.fillRect(left, y(c), Math.max(right - left - 0.5, 1), M.top + h - y(c));
    });
    ctx.fillStyle = text; ctx.textAlign = 'center'; ctx.textBaseline = 'top';
    ticks(low, high, Math.max(2, Math.floor(w / 70))).forEach(([v, step]) => {
      ctx.fillRect(Math.round(x(v)), M.top + h, 1, 4); ctx.fillText(label(v, step), x(v), M.top + h + 6);
    });
    ctx.fillText('value', M.left + w / 2, M.top + h + 21);
    ctx.save(); ctx.translate(12, M.top + h / 2); ctx.rotate(-Math.PI / 2); ctx.fillText('count', 0, -6);
    ctx.restore();
  }
  const sized = window.ResizeObserver ? new ResizeObserver((entries) => entries.forEach((e) => draw(e.target)))
                                     : null;
  function draw(canvas) {
    const width = canvas.clientWidth, height = canvas.clientHeight;
    if (sized && !canvas.__sized) { canvas.__sized = true; sized.observe(canvas); }  // redrawn when resized
    if (!width || !height) { return; }  // not laid out (a tab not shown): drawn when it gets a size
    paint(canvas, canvas, width, height, window.devicePixelRatio || 1);
    canvas.__drawn = canvas.dataset.stamp;
  }
  function drawNew() {
    document.querySelectorAll('canvas.histogram-canvas').forEach((canvas) => {
      if (canvas.__drawn !== canvas.dataset.stamp) { draw(canvas); }
    });
  }
  // A histogram put in the page (or given other bins) is drawn before the browser paints the change.
  new MutationObserver(drawNew).observe(document.documentElement, {childList: true, subtree: true, attributes: true,
                                                                   attributeFilter: ['data-stamp']});
  new MutationObserver(() => document.querySelectorAll('canvas.histogram-canvas').forEach(draw))
    .observe(document.documentElement, {attributes: true, attributeFilter: ['data-theme']});  // the text colour
  function readout(canvas) { return canvas.closest('.histogram-view').querySelector('.histogram-readout'); }
  function binAt(canvas, clientX) {
    const {counts, edges} = bins(canvas), box = canvas.getBoundingClientRect();
    const i = Math.floor((clientX - box.left - M.left) / (box.width - M.left - M.right) * counts.length);
    return i >= 0 && i < counts.length ? {index: i, low: edges[i], high: edges[i + 1], count: counts[i]} : null;
  }
  const number = (v) => Number(v).toPrecision(4).replace(/\\.?0+(e|$)/, '$1');
  document.addEventListener('mousemove', (event) => {
    const canvas = event.target;
    if (!canvas || !canvas.classList || !canvas.classList.contains('histogram-canvas')) { return; }
    const bin = binAt(canvas, event.clientX), out = readout(canvas);
    if (out) {
      out.textContent = bin ? number(bin.low) + ' to ' + number(bin.high) + ': ' + bin.count +
        (bin.count === 1 ? ' value' : ' values') : 'point at a bar to read its count';
    }
  });
  return {
    drawn: function (canvas) { return canvas.__drawn === canvas.dataset.stamp; },
    bin: function (canvas, clientX) { return binAt(canvas, clientX); },
    save: function (format, name, download, field) {  // field: a CSV cell, quoted where it must be
      const canvas = document.querySelector('#' + PANEL + ' canvas.histogram-canvas');
      if (!canvas) { return false; }
      const {counts, edges} = bins(canvas);
      if (format === 'csv') {
        const lines = ['low,high,count'].concat(counts.map((c, i) => [edges[i], edges[i + 1], c].map(field).join(',')));
        download(name, new Blob([lines.join('\\n') + '\\n'], {type: 'text/csv'}));
        return true;
      }
      const copy = document.createElement('canvas');
      const title = canvas.closest('.histogram-view').querySelector('.histogram-title').textContent;
      paint(canvas, copy, canvas.clientWidth, canvas.clientHeight, 2, title);
      copy.toBlob((blob) => download(name, blob), 'image/png');
      return true;
    },
  };
})()});
""" % {"margin": json.dumps(MARGIN), "panel": json.dumps(ids.HISTOGRAM)}

"""The page's stylesheet (light and dark themes, from 1024 px wide up) and its template with the keyboard
shortcuts, inlined so that there is no asset folder to install.

Keys, when no text field has the focus: ←/→ the previous / next recorded step, Shift+←/→ the previous /
next step with a snapshot of the tensor, ↑/↓ the previous / next node, F fit the graph, C centre it on the
selected node. A key presses the same button a click would, so it goes through the same callback.
"""
from __future__ import annotations

import json

from comgra_ndbg.gui import ids
from comgra_ndbg.gui.clientside import SCRIPT

__all__ = ["CSS", "KEYS_SCRIPT", "index_string"]

CSS = """
:root { --bg: #f6f7f9; --panel: #ffffff; --text: #1f2937; --muted: #6b7280; --border: #e5e7eb;
        --head: #1f2937; --head-text: #ffffff; --accent: #D62728; --hover: #fff7ed; --current: #fff1f2;
        --button: #f8fafc; --button-border: #cbd5e1; --button-hover: #e2e8f0; --table-head: #f1f5f9; }
:root[data-theme="dark"] { --bg: #0b1220; --panel: #111827; --text: #e5e7eb; --muted: #9ca3af; --border: #273244;
        --head: #030712; --head-text: #f9fafb; --accent: #F87171; --hover: #2a2116; --current: #3a1d22;
        --button: #1f2937; --button-border: #374151; --button-hover: #374151; --table-head: #1f2937; }
body { font-family: -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; margin: 0; color: var(--text);
       background: var(--bg); font-size: 14px; }
.header { display: flex; align-items: baseline; gap: 16px; padding: 8px 16px; background: var(--head);
          color: var(--head-text); flex-wrap: wrap; }
.header h1 { font-size: 17px; margin: 0; font-weight: 600; }
.header .path { color: #cbd5e1; font-size: 12px; overflow-wrap: anywhere; }
.header .status { margin-left: auto; font-size: 12px; color: #e5e7eb; }
.header .theme { font-size: 12px; }
.controls { display: flex; flex-wrap: wrap; gap: 6px 16px; padding: 8px 16px; background: var(--panel);
            border-bottom: 1px solid var(--border); align-items: center; }
.selector { display: flex; align-items: center; gap: 4px; }
.selector label { font-size: 12px; color: var(--muted); margin-right: 2px; }
.selector .dropdown { width: 140px; }
.selector .dropdown.wide { width: 260px; }
.stepper, .tool { border: 1px solid var(--button-border); background: var(--button); color: var(--text);
                  border-radius: 4px; cursor: pointer; padding: 2px 7px; font-size: 12px; line-height: 18px; }
.stepper:hover, .tool:hover { background: var(--button-hover); }
.step-row { display: flex; align-items: center; gap: 8px; padding: 4px 16px 8px; background: var(--panel);
            border-bottom: 1px solid var(--border); flex-wrap: wrap; }
.step-row .slider { flex: 1; min-width: 240px; }
.step-box { width: 90px; }
.step-label { min-width: 190px; font-size: 13px; font-weight: 600; }
.main { display: flex; gap: 12px; padding: 12px 16px; align-items: flex-start; }
.left { flex: 0 0 42%; min-width: 0; background: var(--panel); border: 1px solid var(--border); border-radius: 6px;
        padding: 8px; box-sizing: border-box; }
.right { flex: 1; min-width: 0; background: var(--panel); border: 1px solid var(--border); border-radius: 6px;
         padding: 8px; box-sizing: border-box; }
@media (max-width: 1279px) {
  .main { flex-direction: column; }
  .left, .right { flex: 1 1 auto; width: 100%; }
}
.toolbar { display: flex; flex-wrap: wrap; gap: 6px 8px; align-items: center; margin-bottom: 6px; font-size: 12px; }
.toolbar .search { width: 230px; }
.toolbar .colour { width: 170px; }
.graph-canvas { width: 100%; height: 560px; border: 1px solid var(--border); border-radius: 4px; }
.hover { font-size: 12px; color: var(--muted); min-height: 16px; margin-top: 4px; overflow-wrap: anywhere; }
.scale { display: flex; align-items: center; gap: 6px; font-size: 11px; color: var(--muted); margin-top: 4px; }
.scale .bar { width: 160px; height: 10px; border-radius: 3px;
              background: linear-gradient(90deg, #440154, #3b528b, #21918c, #5ec962, #fde725); }
.legend { font-size: 11px; color: var(--muted); display: flex; flex-wrap: wrap; gap: 10px; margin-top: 4px; }
.legend span.dot { display: inline-block; width: 10px; height: 10px; border-radius: 5px; margin-right: 3px; }
.tensor-header { font-weight: 600; margin: 6px 0; overflow-wrap: anywhere; }
.row { display: flex; gap: 12px; align-items: flex-start; flex-wrap: wrap; }
.row > .half { flex: 1 1 320px; min-width: 0; }
.plot { position: relative; }
.plot .exports { position: absolute; right: 4px; top: 2px; z-index: 5; display: flex; gap: 4px; }
.plot .exports button { font-size: 10px; padding: 0 5px; line-height: 16px; opacity: 0.75; }
.plot .exports button:hover { opacity: 1; }
.data-table, .data-table table { border-collapse: collapse; font-size: 12px; }
.data-table th, .data-table td { border-bottom: 1px solid var(--border); padding: 2px 8px; text-align: left; }
.data-table th { background: var(--table-head); font-weight: 600; }
.data-table td:nth-child(n+2) { font-variant-numeric: tabular-nums; }
.scroll { overflow-x: auto; max-width: 100%; }
.message { color: var(--muted); padding: 12px; font-style: italic; }
.message.error { color: #b91c1c; font-style: normal; white-space: pre-wrap; font-family: monospace; }
.histogram-title { font-size: 13px; margin: 4px 80px 2px 0; overflow-wrap: anywhere; }
.histogram-canvas { display: block; width: 100%; color: var(--text); background: var(--panel);
                    border-top: 0 solid var(--border); cursor: crosshair; }
.histogram-readout { min-height: 16px; margin-left: 52px; font-size: 11px; font-variant-numeric: tabular-nums; }
.values-title { font-size: 13px; margin: 4px 80px 4px 0; }
.values-frame { display: flex; gap: 4px; }
.values-rows { display: flex; flex-direction: column; justify-content: space-between; min-width: 64px;
               font-size: 11px; color: var(--muted); text-align: right; }
.values-image { flex: 1; min-width: 0; width: 100%; image-rendering: pixelated; border: 1px solid var(--border);
                cursor: crosshair; }
.values-columns, .values-scale, .values-readout { margin-left: 68px; font-size: 11px; color: var(--muted); }
.values-columns { display: flex; justify-content: space-between; }
.values-scale { display: flex; align-items: center; gap: 6px; margin-top: 4px; }
.values-scale .values-bar { width: 180px; height: 10px; border-radius: 3px; }
.values-readout { min-height: 16px; margin-top: 2px; color: var(--text); font-variant-numeric: tabular-nums; }
.values-controls { display: flex; gap: 12px; align-items: center; font-size: 12px; flex-wrap: wrap; }
.message.warning { color: #92400e; background: #fef3c7; font-style: normal; border-radius: 4px; }
.message.healthy { color: #166534; background: #dcfce7; font-style: normal; border-radius: 4px; }
.analyze { border: 1px solid var(--head); background: var(--head); color: var(--head-text); border-radius: 4px;
           padding: 3px 10px; cursor: pointer; font-size: 12px; }
.analyze-status { font-size: 12px; color: var(--muted); }
.hypothesis { border: 1px solid var(--border); border-left: 4px solid #F28C28; border-radius: 4px;
              padding: 6px 10px; margin: 6px 0; cursor: pointer; }
.hypothesis:hover, .event-row:hover { background: var(--hover); }
.hypothesis.current { border-left-color: var(--accent); background: var(--current); }
.hypothesis-head { display: flex; align-items: center; gap: 8px; }
.hypothesis .rank { font-weight: 700; min-width: 24px; }
.hypothesis .bar { display: inline-block; width: 60px; height: 8px; background: var(--border); border-radius: 4px;
                   overflow: hidden; flex: 0 0 60px; }
.hypothesis .bar span { display: block; height: 100%; background: #D62728; }
.hypothesis .percent { font-variant-numeric: tabular-nums; min-width: 36px; font-weight: 600; }
.hypothesis .sentence { font-weight: 600; }
.hypothesis .facts { font-size: 12px; color: var(--muted); margin: 2px 0 2px 32px; }
.hypothesis .remedy, .evidence .remedy { font-size: 13px; margin: 4px 0 4px 32px; color: #059669; }
.hypothesis .chain { font-size: 12px; margin-left: 32px; font-family: monospace; }
.evidence { border: 1px solid var(--border); border-radius: 6px; padding: 6px 10px; margin: 6px 0 12px; }
.evidence .remedy { margin-left: 0; font-weight: 600; }
.event-row { cursor: pointer; }
.event-row.current td { background: var(--current); }
.Select-control, .dash-dropdown { background: var(--panel); color: var(--text); }
.tab-container .tab { background: var(--panel) !important; color: var(--text) !important;
                      border-color: var(--border) !important; }
.tab-container .tab--selected { border-top: 2px solid var(--accent) !important; }
.tab-container .tab { padding: 8px 6px !important; font-size: 13px; min-width: 0; }
kbd { border: 1px solid var(--button-border); border-radius: 3px; padding: 0 3px; font-size: 11px; }
"""

# Keyboard shortcuts: each does what a click on its button does.
KEYS_SCRIPT = """
document.addEventListener('keydown', function (event) {
  const target = event.target;
  if (event.ctrlKey || event.metaKey || event.altKey) { return; }
  if (target && (['INPUT', 'TEXTAREA', 'SELECT'].includes(target.tagName) || target.isContentEditable)) { return; }
  const press = (id) => { const b = document.getElementById(id); if (b) { b.click(); event.preventDefault(); } };
  const keys = %s;
  // ← and → move the step slider at once (stepscript's stepBy), as its buttons do, without a click on a button
  // whose own update the page would first have to process
  const step = (delta) => {
    const stepping = (window.dash_clientside || {}).comgraStep;
    if (stepping) { stepping.stepBy(delta); event.preventDefault(); }
  };
  if (event.key === 'ArrowLeft') { if (event.shiftKey) { press(keys.snapshotPrev); } else { step(-1); } }
  else if (event.key === 'ArrowRight') { if (event.shiftKey) { press(keys.snapshotNext); } else { step(1); } }
  else if (event.key === 'ArrowUp') { press(keys.nodePrev); }
  else if (event.key === 'ArrowDown') { press(keys.nodeNext); }
  else if (event.key === 'f' || event.key === 'F') { press(keys.fit); }
  else if (event.key === 'c' || event.key === 'C') { press(keys.centre); }
});
""" % json.dumps({"snapshotPrev": ids.stepper_button_id(ids.SNAPSHOT_STEPPER, -1),
                  "snapshotNext": ids.stepper_button_id(ids.SNAPSHOT_STEPPER, 1),
                  "nodePrev": ids.stepper_button_id("node", -1), "nodeNext": ids.stepper_button_id("node", 1),
                  "fit": ids.GRAPH_FIT, "centre": ids.GRAPH_CENTRE})

# Set the theme before the page is drawn, so a dark view does not flash light first. And leave out one
# warning that is not true here: dash-cytoscape always hands cytoscape.js its wheelSensitivity prop, whose
# default is cytoscape's own default (1), and cytoscape.js warns of a "custom wheel sensitivity" whenever
# the option is present at all; no prop value avoids it. Every other message reaches the console.
THEME_SCRIPT = """
(function () {
  const theme = new URLSearchParams(window.location.search).get('theme');
  if (theme === 'dark') { document.documentElement.dataset.theme = 'dark'; }
  const warn = console.warn.bind(console);
  console.warn = function (first, ...rest) {
    if (typeof first === 'string' && first.startsWith('You have set a custom wheel sensitivity')) { return; }
    warn(first, ...rest);
  };
})();
"""


def index_string(title: str, prefix: str = "/") -> str:
    """Dash's page template with the stylesheet, the browser-side functions and the keyboard shortcuts
    inlined. plotly.js (its cartesian bundle, 1.5 MB: :mod:`comgra_ndbg.gui.bundle`), which Dash loads only
    once the page is drawn, is asked for at once (``prefix``: the app's ``requests_pathname_prefix``), so the
    timeline is drawn sooner. So are the page's layout and its callbacks, which Dash's renderer asks for only
    once its 2 MB of scripts have run: the server builds the layout (the first view included) while the browser
    runs them, and the renderer's own requests (same address, mode and credentials) are answered by these."""
    plotly = f"{prefix}_dash-component-suites/plotly/package_data/plotly.min.js"
    return ("<!DOCTYPE html><html><head>{%metas%}<title>" + title + "</title>"
            f'<link rel="preload" as="script" href="{plotly}">'
            + "".join(f'<link rel="preload" as="fetch" crossorigin="anonymous" href="{prefix}{name}">'
                      for name in ("_dash-layout", "_dash-dependencies")) + "{%favicon%}{%css%}<style>" + CSS
            + "</style><script>" + THEME_SCRIPT + "</script></head><body>{%app_entry%}<footer>{%config%}{%scripts%}"
            "<script>" + SCRIPT + KEYS_SCRIPT + "</script>{%renderer%}</footer></body></html>")

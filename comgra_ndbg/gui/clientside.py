"""What the browser does without asking the server: the graph's selection highlight and statistic colours,
fit and centre, the hover line, the theme, the options of the node lists as the user types, reading a zoom
of the timeline, and saving plots as PNG and CSV; with :mod:`comgra_ndbg.gui.stepscript`, stepping, with
:mod:`comgra_ndbg.gui.tapscript` taps, with :mod:`comgra_ndbg.gui.valuescript` and
:mod:`comgra_ndbg.gui.histogramscript` the element values' readout and the histogram's drawing.

The functions live in ``window.dash_clientside.comgra`` (:data:`SCRIPT`, which ends with the stepping
and tap scripts, inlined in the page by :func:`comgra_ndbg.gui.style.index_string`) and are wired by
:func:`register_clientside`. The graph's
state comes from the server as one small store (:data:`ids.GRAPH_VIEW`: the selected item, the colours,
whether to centre), applied to cytoscape with classes and a ``heat`` data field, so stepping or tapping
never resends the graph's elements or stylesheet.
"""
from __future__ import annotations

import json

from dash import ALL, ClientsideFunction, Dash, Input, Output, State

from comgra_ndbg.gui import ids
from comgra_ndbg.gui.stepscript import STEP_SCRIPT, register_stepping
from comgra_ndbg.gui.histogramscript import HISTOGRAM_SCRIPT
from comgra_ndbg.gui.tapscript import TAP_SCRIPT
from comgra_ndbg.gui.valuescript import VALUES_SCRIPT

__all__ = ["NODE_MATCHES", "SCRIPT", "register_clientside"]

NODE_MATCHES = 60  # the names a node list shows at once; typing narrows them down

SCRIPT = """
window.dash_clientside = Object.assign({}, window.dash_clientside, {comgra: (function () {
  const GRAPH = %(graph)s, VALUES_IMAGE = %(values)s, HISTOGRAM = %(histogram)s;
  const NODE_MATCHES = %(matches)d;
  const none = () => window.dash_clientside.no_update;
  const cyOf = () => { const box = document.getElementById(GRAPH); return box && box._cyreg ? box._cyreg.cy : null; };
  let lit = {cy: null, selected: undefined};  // the selection whose lineage the graph shows now
  function highlight(cy, selected) {
    // Restyling 500 nodes and 3,000 edges costs a redraw: a tap is highlighted at once, and the server's
    // answer naming the same selection then changes nothing.
    if (lit.cy === cy && lit.selected === (selected || null)) { return; }
    lit = {cy: cy, selected: selected || null};
    // Only the elements whose classes change are touched: a class removed and added again would still make
    // cytoscape restyle the element, and a tap moves the highlight of a few of 3,500 elements, not of all.
    const sel = selected ? cy.getElementById(selected) : cy.collection();
    const lineage = sel.length ? {up: sel.predecessors(), down: sel.successors()} : null;
    const wanted = {focus: sel, up: lineage ? lineage.up : cy.collection(), down: lineage ? lineage.down : cy.collection(),
                    faded: lineage ? cy.elements().not(sel).not(lineage.up).not(lineage.down).not('node.frame')
                                   : cy.collection()};
    cy.batch(() => {
      Object.keys(wanted).forEach((name) => {
        cy.elements('.' + name).not(wanted[name]).removeClass(name);
        wanted[name].filter((e) => !e.hasClass(name)).addClass(name);
      });
    });
  }
  let painted = {cy: null, colours: undefined};  // the colours the graph shows now, as JSON
  function colour(cy, colours) {
    const shown = JSON.stringify(colours || null);
    if (painted.cy === cy && painted.colours === shown) { return; }
    painted = {cy: cy, colours: shown};
    cy.batch(() => {
      cy.nodes().forEach((n) => {
        const c = colours ? colours[n.id()] : undefined;
        if (c) { if (n.data('heat') !== c) { n.data('heat', c); } } else if (n.data('heat')) { n.removeData('heat'); }
      });
    });
  }
  let drawn = null;  // the elements last fitted into the view
  let moved = false;  // the user zoomed or panned since: a resize no longer refits
  function fit(cy) {
    cy.fit(cy.elements(), 24);
    if (cy.zoom() > 1.6) { cy.zoom(1.6); cy.center(); }
  }
  function fitSoon(cy, target) {
    // The canvas may still change size while the page settles: fit now and again once it has. A frame
    // just opened fills the view; otherwise the whole graph does.
    const fitNow = () => {
      if (!(target && target.length)) { fit(cy); return; }
      cy.fit(target, 30);
      if (cy.zoom() > 1.6) { cy.zoom(1.6); cy.center(target); }
      else if (cy.zoom() < 0.6) {  // a long row of boxes: its start readable, the rest a pan away
        cy.zoom(0.6);
        const box = target.boundingBox();
        cy.pan({x: 30 - box.x1 * 0.6, y: cy.height() / 2 - (box.y1 + box.y2) / 2 * 0.6});
      }
    };
    moved = false;
    fitNow();
    window.requestAnimationFrame(() => window.requestAnimationFrame(() => { if (!moved) { fitNow(); } }));
    if (!cy.scratch('_comgraWatch')) {
      cy.scratch('_comgraWatch', true);
      cy.on('resize', () => { if (!moved) { fit(cy); } });
      const box = cy.container();
      ['wheel', 'mousedown', 'touchstart'].forEach((name) => box.addEventListener(name, () => { moved = true; },
                                                                                  {passive: true}));
    }
  }
  function hoverText(data) {
    const extra = data.kind === 'node' ? ' (' + data.role + ')' :
      ' · module, ' + data.members + ' nodes · click to ' + (data.kind === 'box' ? 'open' : 'close');
    return data.full + extra;
  }
  function listen(cy) {
    if (cy.scratch('_comgraTap')) { return; }
    cy.scratch('_comgraTap', true);
    // The view of a pressed node (or module box) is asked for as the button goes down and shown when it comes
    // up on the same element (tapscript): the request leaves before the tap's highlight is even drawn. A
    // tapped node's lineage is restyled at the tap, in cytoscape's own event, and the server's answer then
    // names the same selection and leaves the graph as it is.
    const taps = () => window.dash_clientside.comgraTap;
    cy.on('tapstart', 'node', (event) => { taps().press(event.target.id(), event.target.data('kind') || 'node'); });
    cy.on('tap', 'node', (event) => {
      const kind = event.target.data('kind') || 'node';
      if (kind === 'node') { highlight(cy, event.target.id()); }
      taps().tap(event.target.id(), kind);
    });
    // dash-cytoscape resizes the canvas 50 ms after every press on it ('tapstart'), which clears and redraws
    // the whole graph and reports a new extent to Dash, on the frames that show a tap's answer: only a
    // canvas whose box changed size is resized (window resizes reach cytoscape's renderer directly). Of the
    // rest, what a press needs is kept: the canvas's place on the page is read again at the next pointer
    // event, so clicks land where they point after the page above the graph changed height.
    const resize = cy.resize.bind(cy);
    let size = null;
    cy.resize = function () {
      const box = cy.container(), renderer = cy.renderer();
      const now = box ? box.clientWidth + 'x' + box.clientHeight : null;
      if (now === null || now !== size || !renderer) {
        size = now;
        return resize();
      }
      renderer.invalidateContainerClientCoordsCache();
      return cy;
    };
    // The hover line is written here rather than by a callback on dash-cytoscape's mouseoverNodeData: a
    // callback costs a round of Dash's work, which a click right after the pointer arrives has to wait for.
    cy.on('mouseover', 'node', (event) => {
      const line = document.getElementById(%(hover)s);
      if (line) { line.textContent = hoverText(event.target.data()); }
    });
  }
  function apply(view, elements, attempt) {
    const cy = cyOf();
    if (!cy || (view && view.selected && !cy.getElementById(view.selected).length && attempt < 20)) {
      window.requestAnimationFrame(() => apply(view, elements, (attempt || 0) + 1));
      return;
    }
    listen(cy);
    if (elements !== drawn && cy.nodes().length) {
      drawn = elements;
      lit = {cy: null, selected: undefined};  // new elements carry no classes or colours yet
      painted = {cy: null, colours: undefined};
      fitSoon(cy, view && view.fit ? cy.getElementById(view.fit) : null);
    }
    colour(cy, view ? view.colours : null);
    highlight(cy, view ? view.selected : null);
    if (view && view.centre && view.selected) {
      const sel = cy.getElementById(view.selected);
      if (sel.length) {
        moved = true;  // the view is placed on the selection: a late refit would move it away
        cy.stop();
        cy.animate({center: {eles: sel}, zoom: Math.max(cy.zoom(), 0.8), duration: 150});
      }
    }
  }
  function download(name, blob) {
    const a = document.createElement('a');
    a.href = URL.createObjectURL(blob); a.download = name; document.body.appendChild(a); a.click();
    setTimeout(() => { URL.revokeObjectURL(a.href); a.remove(); }, 1000);
  }
  const cell = (v) => { const s = v === null || v === undefined ? '' : String(v);
                        return /[",\\n]/.test(s) ? '"' + s.replace(/"/g, '""') + '"' : s; };
  function plotCsv(div) {
    const lines = [];
    (div.data || []).forEach((t) => {
      if (t.z) {
        lines.push(['trace', 'x', 'y', 'z'].join(','));
        t.z.forEach((row, i) => row.forEach((z, j) => lines.push(
          [cell(t.name || t.type), cell(t.x ? t.x[j] : j), cell(t.y ? t.y[i] : i), cell(z)].join(','))));
      } else {
        lines.push(['trace', 'x', 'y'].join(','));
        (t.x || []).forEach((x, i) => lines.push([cell(t.name || t.type), cell(x), cell(t.y ? t.y[i] : '')].join(',')));
      }
    });
    return lines.join('\\n') + '\\n';
  }
  return {
    recolour: function (colours) { const cy = cyOf(); if (cy) { colour(cy, colours); } },  // stepscript's
    graphSync: function (view, elements) { apply(view, elements, 0); return Date.now(); },
    tools: function (_fitClicks, _centreClicks, view) {
      const cy = cyOf();
      const trigger = window.dash_clientside.callback_context.triggered.map((t) => t.prop_id)[0] || '';
      if (!cy) { return none(); }
      const selected = lit.cy === cy && lit.selected ? lit.selected : (view && view.selected);  // a tap's too
      if (trigger.startsWith(%(fit)s)) { moved = true; fit(cy); }
      else if (selected && cy.getElementById(selected).length) {
        cy.animate({center: {eles: cy.getElementById(selected)}, duration: 150});
      }
      return Date.now();
    },
    nodeMatches: function (typed, names, chosen) {
      // The options of the graph's search and of the overlay's node list: the names that contain what is
      // typed (the first ones when nothing is), after the chosen ones. A list of every node would make each
      // dropdown index all substrings of 500 long names when the page loads, some 100 ms of the browser's time.
      // The chosen names stay among the options, so the dropdown never drops a value for being missing from
      // them (a value the dropdown's options lack when they change is cleared).
      const kept = Array.isArray(chosen) ? chosen : (chosen ? [chosen] : []);
      const text = (typed || '').toLowerCase().trim();
      const found = [];
      for (const name of names || []) {
        if (found.length >= NODE_MATCHES) { break; }
        if ((!text || name.toLowerCase().includes(text)) && !kept.includes(name)) { found.push(name); }
      }
      return kept.concat(found);
    },
    nodeSearch: function (typed, names, chosen) {
      // The node selector's options: the chosen node, and while something is typed the names that contain it.
      // The server sends the chosen node alone with every new selection (a tap's answer sets both at once, so
      // the value is never missing from the options the dropdown holds).
      if (!typed) { return chosen ? [chosen] : []; }
      return window.dash_clientside.comgra.nodeMatches(typed, names, chosen);
    },
    zoomRange: function (relayout, shown) {
      // The steps the timeline was zoomed or panned to, or 'all' when a zoomed timeline was reset to the whole
      // run; the server then sends that range in its detail. Other layout changes ask nothing: autosize, the
      // y axis, and the autorange plotly.js reports when it first draws a plot that shows the whole run.
      if (!relayout) { return none(); }
      if (relayout['xaxis.autorange']) { return Array.isArray(shown) ? 'all' : none(); }
      const low = relayout['xaxis.range[0]'], high = relayout['xaxis.range[1]'];
      if (low !== undefined && high !== undefined) { return [low, high]; }
      return Array.isArray(relayout['xaxis.range']) ? relayout['xaxis.range'] : none();
    },
    theme: function (theme) { document.documentElement.dataset.theme = theme || 'light'; return theme; },
    save: function (clicks) {
      const triggered = window.dash_clientside.callback_context.triggered;
      if (!triggered.length || !triggered[0].value) { return none(); }
      const id = JSON.parse(triggered[0].prop_id.split('.n_clicks')[0]);
      const stamp = new Date().toISOString().slice(0, 19).replace(/[:T]/g, '-');
      const name = 'comgra-' + id.target + '-' + stamp + '.' + id.format;
      if (id.target === GRAPH) {
        const cy = cyOf(); if (!cy) { return none(); }
        if (id.format === 'png') { download(name, cy.png({output: 'blob', full: true, scale: 2, bg: '#ffffff'})); }
        else {
          const rows = ['id,label,kind,role,members,colour'];
          cy.nodes().forEach((n) => rows.push([n.id(), n.data('label'), n.data('kind'), n.data('role'),
            n.data('members'), n.data('heat') || ''].map(cell).join(',')));
          download(name, new Blob([rows.join('\\n') + '\\n'], {type: 'text/csv'}));
        }
        return Date.now();
      }
      if (id.target === HISTOGRAM) {
        return window.dash_clientside.comgraHistogram.save(id.format, name, download, cell) ? Date.now() : none();
      }
      if (id.target === VALUES_IMAGE) {
        const img = document.getElementById(VALUES_IMAGE); if (!img) { return none(); }
        window.dash_clientside.comgraValues.save(img, id.format, name, download, cell);
        return Date.now();
      }
      const div = document.querySelector('#' + CSS.escape(id.target) + ' .js-plotly-plot') ||
                  document.getElementById(id.target);
      if (!div || !window.Plotly) { return none(); }
      if (id.format === 'png') {
        window.Plotly.toImage(div, {format: 'png', scale: 2}).then((url) => fetch(url)).then((r) => r.blob())
          .then((blob) => download(name, blob));
      } else { download(name, new Blob([plotCsv(div)], {type: 'text/csv'})); }
      return Date.now();
    },
  };
})()});
""" % {"graph": json.dumps(ids.GRAPH), "fit": json.dumps(ids.GRAPH_FIT), "matches": NODE_MATCHES,
       "hover": json.dumps(ids.GRAPH_HOVER), "values": json.dumps(ids.VALUES_IMAGE),
       "histogram": json.dumps(ids.HISTOGRAM)} + STEP_SCRIPT + TAP_SCRIPT + VALUES_SCRIPT + HISTOGRAM_SCRIPT


def register_clientside(app: Dash) -> None:
    """Wire the browser-side functions of :data:`SCRIPT` to the page's components."""
    def fn(name: str) -> ClientsideFunction:
        return ClientsideFunction(namespace="comgra", function_name=name)

    register_stepping(app)
    app.clientside_callback(fn("graphSync"), Output(ids.CLIENT + "-graph", "data"), Input(ids.GRAPH_VIEW, "data"),
                            Input(ids.GRAPH, "elements"))
    app.clientside_callback(fn("tools"), Output(ids.CLIENT + "-tools", "data"), Input(ids.GRAPH_FIT, "n_clicks"),
                            Input(ids.GRAPH_CENTRE, "n_clicks"), State(ids.GRAPH_VIEW, "data"),
                            prevent_initial_call=True)
    app.clientside_callback(fn("nodeMatches"), Output(ids.GRAPH_SEARCH, "options"),
                            Input(ids.GRAPH_SEARCH, "search_value"), Input(ids.NODE_NAMES, "data"),
                            Input(ids.GRAPH_SEARCH, "value"))
    app.clientside_callback(fn("nodeSearch"), Output(ids.NODE, "options", allow_duplicate=True),
                            Input(ids.NODE, "search_value"), State(ids.NODE_NAMES, "data"), State(ids.NODE, "value"),
                            prevent_initial_call=True)
    app.clientside_callback(fn("nodeMatches"), Output(ids.OVERLAY_NODES, "options"),
                            Input(ids.OVERLAY_NODES, "search_value"), Input(ids.NODE_NAMES, "data"),
                            Input(ids.OVERLAY_NODES, "value"))
    app.clientside_callback(fn("zoomRange"), Output(ids.TIMELINE_RANGE, "data"), Input(ids.TIMELINE, "relayoutData"),
                            State(ids.TIMELINE_RANGE, "data"), prevent_initial_call=True)
    app.clientside_callback(fn("theme"), Output(ids.CLIENT + "-theme", "data"), Input(ids.THEME, "value"))
    app.clientside_callback(fn("save"), Output(ids.CLIENT + "-save", "data"),
                            Input({"type": ids.EXPORT_TYPE, "target": ALL, "format": ALL}, "n_clicks"),
                            prevent_initial_call=True)


CLIENT_STORES = tuple(ids.CLIENT + suffix for suffix in ("-graph", "-tools", "-theme", "-save"))

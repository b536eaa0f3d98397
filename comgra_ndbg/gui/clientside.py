"""What the browser does without asking the server: the graph's selection highlight and statistic colours,
fit and centre, the hover line, the theme, moving the step slider by the ◀ ▶ buttons and arrow keys, showing
a nearby step from the window the server sent (:mod:`comgra_ndbg.gui.stepping`) and asking the server for
any other, the browser's address and back / forward, the options of the node lists as the user types,
reading a zoom of the timeline, and saving plots as PNG and CSV.

The functions live in ``window.dash_clientside.comgra`` (:data:`SCRIPT`, inlined in the page by
:func:`comgra_ndbg.gui.style.index_string`) and are wired by :func:`register_clientside`. The graph's
state comes from the server as one small store (:data:`ids.GRAPH_VIEW`: the selected item, the colours,
whether to centre), applied to cytoscape with classes and a ``heat`` data field, so stepping or tapping
never resends the graph's elements or stylesheet.
"""
from __future__ import annotations

import json

from dash import ALL, ClientsideFunction, Dash, Input, Output, State

from comgra_ndbg.gui import ids

__all__ = ["FORGET", "NODE_MATCHES", "SCRIPT", "register_clientside"]

NODE_MATCHES = 60  # the names a node list shows at once; typing narrows them down

# What the view callback remembers having sent for the step shown (callbacks._fresh's keys): forgotten when
# the page shows another step itself, so the server's next answer sends them for the step then shown.
FORGET = ("panel", "timeline_step", "address", "sent:step", "sent:step_box", "step_label", "graph_state", "graph_paint",
          "colour_scale", "step_data")

SCRIPT = """
window.dash_clientside = Object.assign({}, window.dash_clientside, {comgra: (function () {
  const GRAPH = %(graph)s;
  const NODE_MATCHES = %(matches)d;
  const THUMB = %(thumb)s;
  const FORGET = %(forget)s;
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
  // ---- a step shown without the server (gui/stepping.py sends the views of the steps around the current one)
  let held = null;  // the window of steps the server sent last, when the page can show its steps
  let pending = null;  // the slider position the last step button asked for, and when
  let shown = {position: null, step: null, snapshot: true, stats: false};  // the step the page shows now
  let known = null;  // the address of the view shown: set by the server's answer or by a step shown here
  let addressAt = null;  // the address the browser's history is to show next
  function showAddress(address) {
    // The address of each view is a new entry of the browser's history, as a link to it would be. It is
    // written after the view is painted: pushState takes a few milliseconds the paint need not wait for.
    const first = addressAt === null;
    addressAt = address;
    if (first) {
      window.requestAnimationFrame(() => setTimeout(() => {
        if (addressAt !== null && addressAt !== window.location.search) {
          window.history.pushState({}, '', window.location.pathname + addressAt);
        }
        addressAt = null;
      }, 0));
    }
  }
  window.addEventListener('popstate', () => {
    // Back or forward: the view of the address the browser now shows.
    const search = window.location.search;
    addressAt = null;
    pending = null;  // the next step starts from the step of that view, not from the last one asked for
    if (known !== null && search !== known) {
      known = search;
      window.dash_clientside.set_props(%(ask)s, {data: asked('url', search)});
    }
  });
  function adopt(data) {
    held = data && data.local ? data : null;
    shown = {position: data ? data.position : null, step: data ? data.step : null,
             snapshot: !held || held.snapshot_shown, stats: !!(held && held.stats_shown)};
  }
  function localStep(position) {
    // Show the step at slider position `position` from the window held and tell the server's stores, so its
    // next answer starts from this step and sends again what it last sent for another one; false (and nothing
    // changed) when the server must draw it: outside the window, or a snapshot whose views were not sent.
    const d = held;
    const i = d ? position - d.first : -1;
    if (!d || !shown.stats || i < 0 || i >= d.steps.length || d.stats[i] === null) { return false; }
    const plot = (id) => document.querySelector('#' + id + ' .js-plotly-plot');
    const timeline = plot(%(timeline)s), histogram = plot(%(histogram)s);
    if (!window.Plotly || !timeline || !timeline.layout || !histogram || !histogram.layout ||
        !document.getElementById(%(table)s) || !(shown.snapshot || document.getElementById(%(note)s))) {
      return false;
    }
    const step = d.steps[i], set = window.dash_clientside.set_props, Patch = window.dash_clientside.Patch;
    const panel = d.panels[i], values = d.stats[i];
    const note = panel ? null : d.notes[d.note[i]].replace('{step}', String(step));
    const table = d.head + d.names.map((name, k) => values[k] === null ? '' : '\\n| ' + name + ' | ' + values[k] + ' |')
      .join('');
    const wasSnapshot = shown.snapshot;
    shown = {position: position, step: step, snapshot: !!panel, stats: true};
    known = d.address.replace(/([?&]step=)-?[0-9]+/, '$1' + step);
    set(%(table)s, {children: table});
    set(%(header)s, {children: d.header[0] + ' · step ' + step + ' ' + d.header[1]});
    set(%(label)s, {children: 'step ' + step + ' · ' + (position + 1) + d.label_tail});
    if (panel) {  // a snapshot's histogram and element values, as the server draws them
      window.Plotly.react(histogram, panel.histogram.data, panel.histogram.layout);
      set(%(values)s, {children: panel.values});
    } else if (wasSnapshot) {  // a note in place of the snapshot shown
      const figure = JSON.parse(JSON.stringify(d.note_figure));
      figure.layout.annotations[0].text = note;
      window.Plotly.react(histogram, figure.data, figure.layout);
      const said = JSON.parse(JSON.stringify(d.note_values));
      said.props.children = note;
      set(%(values)s, {children: said});
    } else {
      set(%(note)s, {children: note});
      retitle(histogram, note);
    }
    const box = document.getElementById(%(box)s);  // dcc.Input sets its field itself too: no render needed
    if (box && document.activeElement !== box) { box.value = step; }
    showAddress(known);
    set(%(selection)s, {data: new Patch().assign(['selection', 'step'], step).assign(['wanted', 'step'], step)
      .build()});
    set(%(keys)s, {data: FORGET.reduce((patch, name) => patch.delete([name]), new Patch()).build()});
    if ((timeline.layout.shapes || []).length) { moveMarker(timeline, step); }
    const cy = cyOf();
    if (d.colours && cy) {
      const colours = {};
      d.items.forEach((item, k) => { colours[item] = d.colours[i][k]; });
      colour(cy, colours);
      set(%(scale)s, {children: new Patch().assign([0], d.scale[0] + 'at step ' + step + d.scale[1]).build()});
    }
    return true;
  }
  // plotly.js's relayout of one shape or one annotation's text redoes the plot's axes, some 10 ms a plot: the
  // marker and the note are changed in place instead. The figure's layout and plotly.js's full layout are
  // told the new values, so any later redraw (a zoom, a resize) draws them as shown; where the plot is not
  // drawn as expected, relayout does it.
  function moveMarker(gd, step) {
    const full = gd._fullLayout, xa = full && full.xaxis;
    const path = gd.querySelector('.shapelayer path[data-index="0"]');
    const drawn = path ? /^M[^,L]+,([^L]+)L[^,]+,(.+)$/.exec(path.getAttribute('d') || '') : null;
    if (!drawn || !xa || xa.type !== 'linear' || !(full.shapes || []).length) {
      window.Plotly.relayout(gd, {'shapes[0].x0': step, 'shapes[0].x1': step});
      return;
    }
    gd.layout.shapes[0].x0 = gd.layout.shapes[0].x1 = full.shapes[0].x0 = full.shapes[0].x1 = step;
    const x = (xa._offset + xa.l2p(step)).toFixed(2);
    path.setAttribute('d', 'M' + x + ',' + drawn[1] + 'L' + x + ',' + drawn[2]);
  }
  function retitle(gd, text) {
    const full = gd._fullLayout, node = gd.querySelector('.annotation-text');
    if (!node || node.children.length || !full || !(full.annotations || []).length) {
      window.Plotly.relayout(gd, {'annotations[0].text': text});
      return;
    }
    gd.layout.annotations[0].text = full.annotations[0].text = text;
    node.textContent = text;
    node.setAttribute('data-unformatted', text);
  }
  function asked(trigger, value) { return [trigger, value, Date.now()]; }
  // The server's answers: the window of steps it drew and the address of its view, read from Dash's store as
  // each answer is applied (a callback on them would cost every answer one more round of Dash's scheduling
  // before its paint). The browser's address then shows the view's; on the page's first look, an address
  // other than the one the page was made for (a page opened without its address reaching the server) is
  // asked for.
  function prop(state, id, name) {
    const path = state.paths && state.paths.strs ? state.paths.strs[id] : undefined;
    let component = path ? state.layout : undefined;
    for (const key of path || []) { component = component === undefined ? undefined : component[key]; }
    return component && component.props ? component.props[name] : undefined;
  }
  let seen = {data: undefined, address: undefined};
  function answered() {
    const state = window.store.getState();
    const data = prop(state, %(data)s, 'data'), address = prop(state, %(address)s, 'data');
    if (data !== seen.data) { seen.data = data; adopt(data); }
    if (address === seen.address || address === undefined) { return; }
    seen.address = address;
    const search = window.location.search;
    if (known === null && search !== (address || '')) {
      known = search;
      window.dash_clientside.set_props(%(ask)s, {data: asked('url', search)});
    } else if (known === null || (address || '') !== known) {
      known = address || '';
      showAddress(known);
    }
  }
  (function watch() {
    if (window.store && window.store.getState().paths) { window.store.subscribe(answered); answered(); }
    else { setTimeout(watch, 20); }
  })();
  let drawn = null;  // the elements last fitted into the view
  let moved = false;  // the user zoomed or panned since: a resize no longer refits
  function stepBy(delta) {
    // Presses quicker than the page updates (a held key) start from the position the last one asked for;
    // a step of the window held is shown at once, any other is the one request to the server. The slider's
    // thumb says where it is and how far it goes, so no callback has to keep track of that on every step.
    const thumb = document.querySelector(THUMB);
    if (!thumb) { return; }
    const shown = Number(thumb.getAttribute('aria-valuenow')) || 0;
    const last = Number(thumb.getAttribute('aria-valuemax')) || 0;
    const from = pending !== null && performance.now() - pending.at < 400 ? pending.position : shown;
    const target = Math.min(Math.max(from + delta, 0), last);
    pending = {position: target, at: performance.now()};
    if (target !== from) {
      localStep(target);  // shown at once when the window holds it; else the slider's move asks the server (ask)
      window.dash_clientside.set_props(%(step)s, {value: target});
    }
  }
  document.addEventListener('click', (event) => {
    const button = event.target && event.target.closest ? event.target.closest(%(buttons)s) : null;
    if (button) { stepBy(button.id === %(prev)s ? -1 : 1); }
  }, true);
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
  function listen(cy) {
    // A tapped node's lineage is drawn at the tap, in cytoscape's own event, before the server is asked;
    // the server's answer then names the same selection and leaves the graph as it is. (Drawing it in a task
    // of its own, after the tap's request has left, was measured no faster: its redraw then falls on the
    // frames that show the answer.)
    if (cy.scratch('_comgraTap')) { return; }
    cy.scratch('_comgraTap', true);
    cy.on('tap', 'node', (event) => {
      if (event.target.data('kind') === 'node') { highlight(cy, event.target.id()); }
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
    stepBy: stepBy,  // not a callback: the ← and → keys step through it (style.KEYS_SCRIPT)
    ask: function (position, typed) {
      // What the server must answer of a slider move or a typed step: a step the page cannot show itself, or
      // a step number other than the one shown. (The server's own answers setting these do not call this.)
      const fired = (window.dash_clientside.callback_context.triggered || []).map((t) => t.prop_id);
      if (fired.includes(%(box)s + '.value')) {
        return typeof typed === 'number' && typed !== shown.step ? asked('step_box', typed) : none();
      }
      if (typeof position === 'number' && shown.position !== null && position !== shown.position &&
          !localStep(position)) {
        return asked('step', position);
      }
      return none();
    },
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
    hover: function (data) {
      if (!data) { return ''; }
      const extra = data.kind === 'node' ? ' (' + data.role + ')' :
        ' · module, ' + data.members + ' nodes · click to ' + (data.kind === 'box' ? 'open' : 'close');
      return data.full + extra;
    },
    nodeMatches: function (typed, names, chosen) {
      // The options of the graph's search and of the overlay's node list: the names that contain what is
      // typed (the first ones when nothing is), after the chosen ones. A list of every node would make each
      // dropdown index all substrings of 500 long names when the page loads, some 100 ms of the browser's time.
      // The chosen names stay among the options, so the dropdown never drops a value for being missing from
      // them. (The node selector keeps every name: the server sets its value on every tap, and a value the
      // dropdown's options lack when they change is cleared.)
      const kept = Array.isArray(chosen) ? chosen : (chosen ? [chosen] : []);
      const text = (typed || '').toLowerCase().trim();
      const found = [];
      for (const name of names || []) {
        if (found.length >= NODE_MATCHES) { break; }
        if ((!text || name.toLowerCase().includes(text)) && !kept.includes(name)) { found.push(name); }
      }
      return kept.concat(found);
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
""" % {"graph": json.dumps(ids.GRAPH), "fit": json.dumps(ids.GRAPH_FIT),
       "step": json.dumps(ids.STEP), "prev": json.dumps(ids.STEP_PREV), "matches": NODE_MATCHES,
       "thumb": json.dumps(f"#{ids.STEP} [role='slider']"),
       "buttons": json.dumps(f"#{ids.STEP_PREV}, #{ids.STEP_NEXT}"), "timeline": json.dumps(ids.TIMELINE),
       "histogram": json.dumps(ids.HISTOGRAM), "table": json.dumps(ids.STATS_TABLE + "-table"),
       "note": json.dumps(ids.VALUES_NOTE), "header": json.dumps(ids.TENSOR_HEADER), "values": json.dumps(ids.VALUES),
       "label": json.dumps(ids.STEP_LABEL), "box": json.dumps(ids.STEP_BOX), "selection": json.dumps(ids.SELECTION),
       "keys": json.dumps(ids.KEYS), "scale": json.dumps(ids.COLOUR_SCALE), "forget": json.dumps(FORGET),
       "ask": json.dumps(ids.STEP_ASK), "data": json.dumps(ids.STEP_DATA), "address": json.dumps(ids.ADDRESS)}


def register_clientside(app: Dash) -> None:
    """Wire the browser-side functions of :data:`SCRIPT` to the page's components."""
    def fn(name: str) -> ClientsideFunction:
        return ClientsideFunction(namespace="comgra", function_name=name)

    app.clientside_callback(fn("ask"), Output(ids.STEP_ASK, "data"), Input(ids.STEP, "value"),
                            Input(ids.STEP_BOX, "value"), prevent_initial_call=True)
    app.clientside_callback(fn("graphSync"), Output(ids.CLIENT + "-graph", "data"), Input(ids.GRAPH_VIEW, "data"),
                            Input(ids.GRAPH, "elements"))
    app.clientside_callback(fn("tools"), Output(ids.CLIENT + "-tools", "data"), Input(ids.GRAPH_FIT, "n_clicks"),
                            Input(ids.GRAPH_CENTRE, "n_clicks"), State(ids.GRAPH_VIEW, "data"),
                            prevent_initial_call=True)
    app.clientside_callback(fn("hover"), Output(ids.GRAPH_HOVER, "children"), Input(ids.GRAPH, "mouseoverNodeData"))
    app.clientside_callback(fn("nodeMatches"), Output(ids.GRAPH_SEARCH, "options"),
                            Input(ids.GRAPH_SEARCH, "search_value"), Input(ids.NODE_NAMES, "data"),
                            Input(ids.GRAPH_SEARCH, "value"))
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

"""The step shown in the browser: the page's script that shows a step of the window the server sent
(:mod:`comgra_ndbg.gui.stepping`) without asking, moves the slider by the ◀ ▶ buttons and the arrow keys,
asks the server (one request, through the ask store) for any other step, a typed step or an address, and
keeps the browser's address and back / forward.

The functions live in ``window.dash_clientside.comgraStep`` (:data:`STEP_SCRIPT`, inlined in the page after
:data:`comgra_ndbg.gui.clientside.SCRIPT`, whose graph colouring it uses) and the one callback is wired by
:func:`register_stepping`. The window and the address of each answer are read from Dash's store as the
answer is applied (``window.store.subscribe``): a callback on them would cost every answer, a tap's too, one
more round of Dash's scheduling before its paint.
"""
from __future__ import annotations

import json

from dash import ClientsideFunction, Dash, Input, Output

from comgra_ndbg.gui import ids

__all__ = ["FORGET", "STEP_SCRIPT", "register_stepping"]

# What the view callback remembers having sent for the step shown (callbacks._fresh's keys): forgotten when
# the page shows another step itself, so the server's next answer sends them for the step then shown.
FORGET = ("panel", "timeline_step", "address", "sent:step", "sent:step_box", "step_label", "graph_state", "graph_paint",
          "colour_scale", "step_data")

STEP_SCRIPT = """
window.dash_clientside = Object.assign({}, window.dash_clientside, {comgraStep: (function () {
  const THUMB = %(thumb)s;
  const FORGET = %(forget)s;
  const none = () => window.dash_clientside.no_update;
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
    const timeline = plot(%(timeline)s);
    if (!window.Plotly || !timeline || !timeline.layout || !document.getElementById(%(histogram)s) ||
        !document.getElementById(%(table)s) ||
        !(shown.snapshot || (document.getElementById(%(note)s) && document.getElementById(%(histogramNote)s)))) {
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
      set(%(histogram)s, {children: panel.histogram});
      set(%(values)s, {children: panel.values});
    } else if (wasSnapshot) {  // notes in place of the snapshot shown
      [[%(histogram)s, d.note_histogram], [%(values)s, d.note_values]].forEach(([id, empty]) => {
        const said = JSON.parse(JSON.stringify(empty));
        said.props.children = note;
        set(id, {children: said});
      });
    } else {
      set(%(note)s, {children: note});
      set(%(histogramNote)s, {children: note});
    }
    const box = document.getElementById(%(box)s);  // dcc.Input sets its field itself too: no render needed
    if (box && document.activeElement !== box) { box.value = step; }
    showAddress(known);
    set(%(selection)s, {data: new Patch().assign(['selection', 'step'], step).assign(['wanted', 'step'], step)
      .build()});
    set(%(keys)s, {data: FORGET.reduce((patch, name) => patch.delete([name]), new Patch()).build()});
    if ((timeline.layout.shapes || []).length) { moveMarker(timeline, step); }
    if (d.colours) {
      const colours = {};
      d.items.forEach((item, k) => { colours[item] = d.colours[i][k]; });
      window.dash_clientside.comgra.recolour(colours);
      set(%(scale)s, {children: new Patch().assign([0], d.scale[0] + 'at step ' + step + d.scale[1]).build()});
    }
    return true;
  }
  // plotly.js's relayout of one shape redoes the plot's axes, some 10 ms a plot: the step marker is moved in
  // place instead. The figure's layout and plotly.js's full layout are told the new position, so any later
  // redraw (a zoom, a resize) draws it as shown; where the plot is not drawn as expected, relayout does it.
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
  const asking = {window: false};
  function askWindow() {
    const timeline = document.querySelector('#' + %(timeline)s + ' .js-plotly-plot');
    if (!(timeline && timeline._fullLayout)) { setTimeout(askWindow, 100); return; }
    const ask = () => window.dash_clientside.set_props(%(ask)s, {data: asked('window', null)});
    if (window.requestIdleCallback) { window.requestIdleCallback(ask, {timeout: 1000}); } else { setTimeout(ask, 200); }
  }
  function answered() {
    const state = window.store.getState();
    const data = prop(state, %(data)s, 'data'), address = prop(state, %(address)s, 'data');
    if (data !== seen.data) {
      seen.data = data;
      adopt(data);
      if (data && !data.local && !asking.window) {  // the page's first view came without its window: asked
        asking.window = true;  // for once the timeline is drawn and the page idle, so the first paint does not
        askWindow();  // wait for it nor share the page's time with its answer
      }
    }
    if (address === seen.address || address === undefined) { return; }
    seen.address = address;
    const withoutStep = (a) => (a || '').replace(/([?&])step=-?[0-9]+/, '$1');
    if (held && data === seen.data && withoutStep(address) !== withoutStep(held.address)) {
      adopt({position: shown.position, step: shown.step, local: false});  // another view: its window is not held
    }
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

  return {
    stepBy: stepBy,  // not a callback: the ← and → keys step through it (style.KEYS_SCRIPT)
    prop: prop,  // a component's property in Dash's store (tapscript's too)
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
    }
  };
})()});
""" % {"step": json.dumps(ids.STEP), "prev": json.dumps(ids.STEP_PREV),
       "thumb": json.dumps(f"#{ids.STEP} [role='slider']"),
       "buttons": json.dumps(f"#{ids.STEP_PREV}, #{ids.STEP_NEXT}"), "timeline": json.dumps(ids.TIMELINE),
       "histogram": json.dumps(ids.HISTOGRAM), "histogramNote": json.dumps(ids.HISTOGRAM_NOTE),
       "table": json.dumps(ids.STATS_TABLE + "-table"),
       "note": json.dumps(ids.VALUES_NOTE), "header": json.dumps(ids.TENSOR_HEADER), "values": json.dumps(ids.VALUES),
       "label": json.dumps(ids.STEP_LABEL), "box": json.dumps(ids.STEP_BOX), "selection": json.dumps(ids.SELECTION),
       "keys": json.dumps(ids.KEYS), "scale": json.dumps(ids.COLOUR_SCALE), "forget": json.dumps(FORGET),
       "ask": json.dumps(ids.STEP_ASK), "data": json.dumps(ids.STEP_DATA), "address": json.dumps(ids.ADDRESS)}


def register_stepping(app: Dash) -> None:
    """Wire :data:`STEP_SCRIPT`'s one callback: a slider move or a typed step it cannot show, to the server."""
    app.clientside_callback(ClientsideFunction(namespace="comgraStep", function_name="ask"),
                            Output(ids.STEP_ASK, "data"), Input(ids.STEP, "value"), Input(ids.STEP_BOX, "value"),
                            prevent_initial_call=True)

"""A tap on the graph in the browser: the page's script that asks the tap route
(:mod:`comgra_ndbg.gui.direct`) for the tapped item's view as the mouse button goes down and applies the
answer as Dash applies a callback's.

A press on a node sends the request at once; the tap (the button released on the same node) then waits for
that answer, so the server works while the button is still down and while the browser draws the
highlight. An answer is applied only if the view it was computed from is still the one shown (the selection
and keys stores unchanged, no callback of Dash's under way); otherwise it is asked for again from the view
now shown, and after two such misses, or when the route cannot be reached, the tap is passed to the view
callback through the ask store, as any other action (so is a tap whose answer the route marks ``ask``).
The values of the view callback's own inputs (the selectors) are set without running Dash's callbacks on
them, as Dash does with a callback's own outputs; every other output is set with ``set_props``, so the
callbacks reading it run as after a callback.

The functions live in ``window.dash_clientside.comgraTap`` (:data:`TAP_SCRIPT`, inlined in the page after
:data:`comgra_ndbg.gui.stepscript.STEP_SCRIPT`); :data:`comgra_ndbg.gui.clientside.SCRIPT` calls ``press``
and ``tap`` from cytoscape's events.
"""
from __future__ import annotations

import json

from comgra_ndbg.gui import ids
from comgra_ndbg.gui.direct import ROUTE

__all__ = ["TAP_SCRIPT"]

TAP_SCRIPT = """
window.dash_clientside = Object.assign({}, window.dash_clientside, {comgraTap: (function () {
  const RETRIES = 2;
  const VIEW = %(selection)s + '.data';  // an output of the view callback alone
  let flight = null;  // the last item pressed or tapped: {item, store, keys, answer (a promise), tapped}
  const dash = () => window.store && window.store.getState ? window.store : null;
  const prop = (state, id, name) => window.dash_clientside.comgraStep.prop(state, id, name);
  function route() {
    const config = document.getElementById('_dash-config');
    let prefix = '/';
    try { prefix = JSON.parse(config.textContent).requests_pathname_prefix || '/'; } catch (error) { prefix = '/'; }
    return prefix + %(route)s;
  }
  function busy(state) {
    // The view callback under way: its answer, computed from the view before this tap, would land after it.
    // (Other callbacks, a long analysis say, do not write the view's stores: a tap need not wait for them.)
    const callbacks = state.callbacks || {};
    return Object.keys(callbacks).some((name) => name !== 'stored' && name !== 'completed' &&
      Array.isArray(callbacks[name]) && callbacks[name].some((entry) =>
        String((entry && entry.callback && entry.callback.output) || '').includes(VIEW)));
  }
  function ask(item) {
    const state = dash().getState();
    const entry = {item: item, store: prop(state, %(selection)s, 'data'), keys: prop(state, %(keys)s, 'data'),
                   tapped: false};
    entry.answer = fetch(route(), {method: 'POST', headers: {'Content-Type': 'application/json'},
                                   body: JSON.stringify({item: item, store: entry.store, keys: entry.keys})})
      .then((response) => (response.ok ? response.json() : null)).catch(() => null);
    return entry;
  }
  function viaDash(item) {
    window.dash_clientside.set_props(%(ask)s, {data: ['graph', item, Date.now()]});
  }
  function current(entry) {
    const state = dash().getState();
    return prop(state, %(selection)s, 'data') === entry.store && prop(state, %(keys)s, 'data') === entry.keys;
  }
  function apply(answer) {
    const store = dash(), state = store.getState(), quiet = answer.quiet || [];
    Object.keys(answer.outputs).forEach((id) => {
      const path = state.paths && state.paths.strs ? state.paths.strs[id] : undefined;
      if (path === undefined) { return; }  // not on the page now (a tab not shown), as Dash leaves it
      if (quiet.includes(id)) {
        store.dispatch({type: 'ON_PROP_CHANGE', payload: {itempath: path, props: answer.outputs[id],
                                                          renderType: 'callback', source: 'response'}});
      } else {
        window.dash_clientside.set_props(id, answer.outputs[id]);
      }
    });
  }
  function settle(entry, misses) {
    entry.answer.then((answer) => {
      if (flight !== entry) { return; }  // a later tap took its place
      if (answer === null || answer.ask) { flight = null; viaDash(entry.item); return; }
      const store = dash();
      if (busy(store.getState())) {  // wait for Dash's answer, then see whether this one still fits
        const stop = store.subscribe(() => {
          if (!busy(store.getState())) { stop(); settle(entry, misses); }
        });
        return;
      }
      if (!current(entry)) {  // the view changed since the request left: ask again from the one shown now
        if (misses >= RETRIES) { flight = null; viaDash(entry.item); return; }
        const again = ask(entry.item);
        again.tapped = true;
        flight = again;
        settle(again, misses + 1);
        return;
      }
      flight = null;
      apply(answer);
    });
  }
  const usable = () => !!(dash() && dash().getState().paths && window.fetch && window.dash_clientside.set_props);
  const same = (a, b) => a[0] === b[0] && a[1] === b[1];
  return {
    press: function (id, kind) {
      // The button went down on a node: its view is asked for now, in case the button comes up on it.
      if (!usable() || (flight && flight.tapped)) { return; }
      flight = ask([id, kind]);
    },
    tap: function (id, kind) {
      const item = [id, kind];
      if (!usable()) { viaDash(item); return; }
      if (!flight || flight.tapped || !same(flight.item, item)) { flight = ask(item); }
      flight.tapped = true;
      settle(flight, 0);
    },
  };
})()});
""" % {"route": json.dumps(ROUTE), "selection": json.dumps(ids.SELECTION), "keys": json.dumps(ids.KEYS),
       "ask": json.dumps(ids.STEP_ASK)}

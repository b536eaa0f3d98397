"""Where the time of a step change and a node tap goes in the browser, on the recording of
:mod:`benchmarks.gui_latency` (a 500-node, 10,000-step run).

Each action is timed from its input event to the updated paint, as :mod:`benchmarks.gui_latency` times
it, and split into the parts of its critical path, from marks the page takes as it goes:

- *input + request prep*: the key or click handled, Dash's callback prepared and its inputs serialised,
  until the request is sent;
- *network + server*: the request sent until the answer's headers arrive (the view callback runs here);
- *body + JSON parse*: the answer's body read and parsed;
- *render until shown*: the outputs applied (React renders, ``Plotly.react`` per figure, cytoscape restyle)
  until every part of the page the action changes shows it;
- *paint*: the two animation frames after that.

Also printed per action: the time inside ``Plotly.react`` per plot and inside the graph's browser-side
update, and Chromium's own counters of main-thread script, layout and style time (``Performance.getMetrics``;
they include the pauses between actions); and, over all the actions, the script self time of each library
(Dash's renderer and React, plotly.js, cytoscape, Dash's core components, the page's own script, garbage
collection) from a CPU profile of the page (``Profiler``), with ``--top N`` the N functions of most self time.

Run: ``python benchmarks/gui_trace.py [--path /tmp/comgra-gui-bench] [--actions 30]`` (``uptime`` first).
"""
from __future__ import annotations

import argparse
import collections
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import gui_latency  # noqa: E402
from benchmarks.gui_latency import ensure_recording, first_paint, serve, settle  # noqa: E402

# In the page: times of each view request (sent, answered, body read, parsed) and of each Plotly.react and
# graph update, in performance.now() milliseconds.
MARKS = """
if (!window.__marked) {
  window.__marked = true;
  window.__marks = {requests: [], plots: [], graph: []};
  const original = window.fetch;
  window.fetch = function (...args) {
    const url = String(args[0]);
    const direct = url.includes('_comgra/tap');  // the tap route: it answers the view's outputs too
    if (!url.includes('_dash-update-component') && !direct) { return original.apply(this, args); }
    const body = (args[1] || {}).body || '';
    const entry = {sent: performance.now(), bytesOut: body.length,
                   outputs: direct ? 'tap route: selection-store' : (JSON.parse(body).output || '')};
    window.__marks.requests.push(entry);
    return original.apply(this, args).then((response) => {
      entry.answered = performance.now();
      const text = response.text.bind(response);
      response.json = () => text().then((t) => {
        entry.read = performance.now(); entry.bytesIn = t.length;
        const value = JSON.parse(t);
        entry.parsed = performance.now();
        entry.changed = Object.keys((direct ? (value || {}).outputs : (value || {}).response) || {}).join(' ');
        return value;
      });
      return response;
    });
  };
  let plotly;
  function wrap(P) {
    if (!P || P.__timed) { return P; }
    P.__timed = true;
    for (const name of ['react', 'newPlot', 'relayout', 'restyle']) {
      const fn = P[name];
      if (typeof fn !== 'function') { continue; }
      P[name] = function (gd, ...rest) {
        const start = performance.now();
        const box = gd && gd.closest ? gd.closest('[id]') : null;
        const out = fn.call(this, gd, ...rest);
        const sync = performance.now() - start;
        const entry = {name: name, plot: box ? box.id : '?', start: start, sync: sync};
        window.__marks.plots.push(entry);
        if (out && out.then) { out.then(() => { entry.done = performance.now(); }); }
        return out;
      };
    }
    return P;
  }
  Object.defineProperty(window, 'Plotly', {configurable: true, get: () => plotly,
                                           set: (P) => { plotly = wrap(P); }});
}
"""
WRAP_GRAPH = """
const c = window.dash_clientside && window.dash_clientside.comgra;
if (c && !c.__timed) {
  c.__timed = true;
  const sync = c.graphSync;
  c.graphSync = function (...args) {
    const start = performance.now();
    const out = sync.apply(this, args);
    window.__marks.graph.push({start: start, took: performance.now() - start});
    return out;
  };
}
"""
# Script self time by the library whose file it is in (from a CPU profile of the page).
SCRIPTS = (("plotly", "plotly.js"), ("cytoscape", "cytoscape"), ("dash_renderer", "Dash renderer + React"),
           ("react", "Dash renderer + React"), ("dcc", "dash core components"), ("dash_html", "Dash renderer + React"),
           ("dash_table", "dash table"))
# Chromium's cumulative counters (Performance.getMetrics), seconds, read before and after each action.
COUNTERS = {"ScriptDuration": "script", "LayoutDuration": "layout", "RecalcStyleDuration": "style",
            "TaskDuration": "all main-thread tasks"}


def browser_with_trace() -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(gui_latency.CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(str(gui_latency.CHROMEDRIVER)), options=options)
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": 1440, "height": 1000, "deviceScaleFactor": 1, "mobile": False})
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": gui_latency.COUNT_REQUESTS + MARKS})
    driver.execute_cdp_cmd("Performance.enable", {"timeDomain": "threadTicks"})
    return driver


def _script_part(url: str) -> str:
    """The library a script file belongs to, by its address."""
    for needle, part in SCRIPTS:
        if needle in url:
            return part
    return "page's own script" if url else "other (native, GC, idle)"


def top_functions(profile: dict[str, Any], count: int) -> list[tuple[str, float]]:
    """The ``count`` functions of most self time in a CDP CPU profile, ms, as ``name (file:line)``."""
    names = {}
    for node in profile["nodes"]:
        frame = node["callFrame"]
        names[node["id"]] = (f"{frame['functionName'] or '(anonymous)'} ({frame.get('url', '').rsplit('/', 1)[-1]}"
                             f":{frame.get('lineNumber', 0)}:{frame.get('columnNumber', 0)})")
    totals: collections.Counter[str] = collections.Counter()
    for sample, delta in zip(profile["samples"], profile["timeDeltas"]):
        if not names[sample].startswith(("(idle)", "(program)")):
            totals[names[sample]] += delta / 1000
    return totals.most_common(count)


def profile_split(profile: dict[str, Any]) -> dict[str, float]:
    """Milliseconds of self time per library in a CDP CPU profile (idle left out)."""
    parts = {}
    for node in profile["nodes"]:
        frame = node["callFrame"]
        if frame["functionName"] in ("(idle)", "(program)"):
            parts[node["id"]] = None
        elif frame["functionName"] == "(garbage collector)":
            parts[node["id"]] = "garbage collection"
        else:
            parts[node["id"]] = _script_part(frame.get("url", ""))
    totals: collections.Counter[str] = collections.Counter()
    for sample, delta in zip(profile["samples"], profile["timeDeltas"]):
        part = parts.get(sample)
        if part is not None:
            totals[part] += delta / 1000
    return dict(totals)


def counters(driver: Any) -> dict[str, float]:
    return {m["name"]: m["value"] for m in driver.execute_cdp_cmd("Performance.getMetrics", {})["metrics"]
            if m["name"] in COUNTERS}


def run_actions(driver: Any, kind: str, count: int, rng: random.Random) -> list[dict[str, Any]]:
    """Each action's marks: from its input event to the updated paint, with the requests it sent."""
    found = []
    act = gui_latency.step_changes if kind == "step" else gui_latency.node_taps
    for _ in range(count):
        driver.execute_script("window.__marks.requests = []; window.__marks.plots = []; window.__marks.graph = [];")
        driver.execute_script(WRAP_GRAPH)
        driver.execute_script(
            "window.__inputAt = null; document.addEventListener(arguments[0], () => { window.__inputAt = "
            "performance.now(); window.__inputTs = performance.timeOrigin + performance.now(); }, "
            "{capture: true, once: true});", "keydown" if kind == "step" else "mousedown")
        before = counters(driver)
        (seconds, requests), = act(driver, 1, rng)
        after = counters(driver)
        marks = driver.execute_script("return [window.__inputAt, window.__marks, performance.now(), "
                                      "performance.timeOrigin];")
        found.append({"seconds": seconds, "requests": requests, "input": marks[0], "marks": marks[1],
                      "counters": {COUNTERS[k]: (after[k] - before[k]) * 1000 for k in COUNTERS}})
    return found


def split(action: dict[str, Any]) -> dict[str, float] | None:
    """The critical path of one action, ms per part (None when it sent no request or timed out)."""
    requests = [r for r in action["marks"]["requests"] if "parsed" in r and "selection-store" in r["outputs"]
                and r["sent"] >= (action["input"] or 0)]
    if not requests or action["input"] is None or action["seconds"] == float("inf"):
        return None
    first, last = requests[0], requests[-1]
    end = action["input"] + action["seconds"] * 1000
    painted = end - 33.3  # two animation frames at 60 Hz: the paint measure of gui_latency
    parts = {"input + request prep": first["sent"] - action["input"],
             "network + server": last["answered"] - first["sent"],
             "body + JSON parse": last["parsed"] - last["answered"],
             "render until shown": max(painted - last["parsed"], 0.0), "paint (2 frames)": end - max(painted,
                                                                                                     last["parsed"])}
    for plot in action["marks"]["plots"]:
        parts[f"  Plotly.{plot['name']} {plot['plot']} (sync)"] = parts.get(
            f"  Plotly.{plot['name']} {plot['plot']} (sync)", 0.0) + plot["sync"]
    parts["  graph update (sync)"] = sum(g["took"] for g in action["marks"]["graph"])
    for name, ms in action["counters"].items():
        parts[f"  main thread: {name}"] = ms
    parts["bytes sent"], parts["bytes answered"] = last["bytesOut"], last.get("bytesIn", 0)
    return parts


def report(label: str, actions: list[dict[str, Any]], work: dict[str, float]) -> None:
    splits = [s for s in (split(a) for a in actions) if s is not None]
    total = sorted(a["seconds"] * 1000 for a in actions)
    print(f"\n{label} ({len(actions)} actions, {len(splits)} with a request): median {statistics.median(total):.1f} ms, "
          f"p95 {total[int(0.95 * (len(total) - 1))]:.1f} ms")
    names = list(dict.fromkeys(name for s in splits for name in s))
    for name in names:
        values = [s.get(name, 0.0) for s in splits]
        unit = "" if name.startswith("bytes") else " ms"
        print(f"  {name:44s} median {statistics.median(values):8.1f}{unit}   mean {statistics.mean(values):8.1f}{unit}")
    changed = collections.Counter(r.get("changed", "") for a in actions for r in a["marks"]["requests"])
    print("  outputs answered (most common): " + "; ".join(f"{n}× [{c}]" for c, n in changed.most_common(2)))
    print("  script self time per action, by library (CPU profile, mean):")
    for name, ms in sorted(work.items(), key=lambda kv: -kv[1]):
        print(f"    {name:42s} {ms / len(actions):8.1f} ms")


def open_step(driver: Any, url: str, step: int) -> None:
    """The view of ``step``, opened by its address and settled, with the page's marks set up again."""
    driver.get(url.rstrip("/") + f"/?step={step}")
    deadline = time.perf_counter() + 30
    while not driver.find_element("id", gui_latency.ids.STEP_LABEL).text.startswith(f"step {step} "):
        if time.perf_counter() > deadline:
            raise RuntimeError(f"the explorer at {url} did not show step {step}")
        time.sleep(0.05)
    settle(driver)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--path", type=Path, default=Path("/tmp/comgra-gui-bench"))
    parser.add_argument("--actions", type=int, default=30)
    parser.add_argument("--top", type=int, default=0, help="also print the functions of most self time")
    parser.add_argument("--tap-step", type=int, default=None,
                        help="tap on the view of this step (e.g. one with a snapshot) instead of the last one stepped to")
    args = parser.parse_args()
    ensure_recording(args.path, gui_latency.gui_recording.STEPS)
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    server, url = serve(args.path)
    driver = browser_with_trace()
    rng = random.Random(0)
    try:
        first_paint(driver, url)
        settle(driver)
        driver.execute_cdp_cmd("Profiler.enable", {})
        driver.execute_cdp_cmd("Profiler.setSamplingInterval", {"interval": 200})
        for kind, label in (("step", "step change (→/←)"), ("tap", "node tap")):
            if kind == "tap" and args.tap_step is not None:
                open_step(driver, url, args.tap_step)
                label += f" at step {args.tap_step}"
            driver.execute_cdp_cmd("Profiler.start", {})
            actions = run_actions(driver, kind, args.actions, rng)
            profile = driver.execute_cdp_cmd("Profiler.stop", {})["profile"]
            report(label, actions, profile_split(profile))
            for name, ms in top_functions(profile, args.top):
                print(f"    {ms / len(actions):7.2f} ms  {name}")
    finally:
        driver.quit()
        server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

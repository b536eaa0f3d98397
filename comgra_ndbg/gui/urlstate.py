"""The view state as the page's address: every selector and option, so a link reopens the same view.

``?trial=b&type=long&step=40&node=model.blocks.2.fc1&kind=grad&stat=rms&tab=diagnosis&focus=h0`` — only
what differs from the defaults is written; lists are comma-separated. Reading an address gives back the
*wanted* values and the options; the explorer resolves them as it resolves any choice, so an address that
names a step or a node the recording lacks opens the nearest valid view instead of failing.
"""
from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, urlencode

from comgra_ndbg.gui.state import Selection, ViewOptions

__all__ = ["from_address", "to_address"]

# Selection field -> query key (same order as written).
SELECTION_KEYS = {"trial": "trial", "step_type": "type", "step": "step", "iteration": "iteration", "node": "node",
                  "tensor": "tensor", "kind": "kind", "sample": "sample", "stat": "stat", "boxes": "boxes"}
# ViewOptions field -> query key.
OPTION_KEYS = {"tab": "tab", "focus": "focus", "colour": "colour", "show_implied": "implied",
               "show_unused": "unused", "overlay_nodes": "overlay", "overlay_trials": "trials", "log_y": "logy",
               "ema": "ema", "follow": "follow", "theme": "theme", "values_mode": "values", "values_page": "page",
               "compare_mode": "compare", "compare_trial": "ctrial", "compare_step": "cstep"}
INTS = ("step", "iteration", "sample", "values_page", "compare_step")
LISTS = ("boxes", "overlay_nodes", "overlay_trials")
FLAGS = ("show_implied", "show_unused", "log_y", "follow")


def _text(name: str, value: Any) -> str:
    if name in LISTS:
        return ",".join(value)
    if name in FLAGS:
        return "1" if value else "0"
    return f"{value:g}" if isinstance(value, float) else str(value)


def to_address(selection: Selection, options: ViewOptions) -> str:
    """The query string (with ``?``; empty for the defaults of everything but the selection) of a view.

    >>> s = Selection("a", "short", 11, 0, "output", "output", "value", stat="rms", boxes=("+model",))
    >>> to_address(s, ViewOptions(tab="diagnosis", log_y=True, overlay_nodes=("h", "x")))
    '?trial=a&type=short&step=11&node=output&tensor=output&kind=value&stat=rms&boxes=%2Bmodel&tab=diagnosis&overlay=h%2Cx&logy=1'
    """
    pairs = []
    for name, key in SELECTION_KEYS.items():
        value = getattr(selection, name)
        if value is None or (name == "stat" and value == "mean") or (name == "iteration" and value == 0) or (
                name in LISTS and not value):
            continue
        pairs.append((key, _text(name, value)))
    defaults = ViewOptions()
    for name, key in OPTION_KEYS.items():
        value = getattr(options, name)
        if value != getattr(defaults, name):
            pairs.append((key, _text(name, "" if value is None else value)))
    return "?" + urlencode(pairs) if pairs else ""


def from_address(search: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(wanted, options)`` named by a query string; unknown keys and unreadable values are left out.

    >>> from_address("?trial=b&step=40&boxes=*,-m.enc&logy=1&ema=0.9&overlay=h,x&bogus=1&sample=x")
    ({'trial': 'b', 'step': 40, 'boxes': ['*', '-m.enc']}, {'log_y': True, 'ema': 0.9, 'overlay_nodes': ['h', 'x']})
    """
    wanted: dict[str, Any] = {}
    options: dict[str, Any] = {}
    by_key = {**{k: ("selection", n) for n, k in SELECTION_KEYS.items()},
              **{k: ("options", n) for n, k in OPTION_KEYS.items()}}
    for key, text in parse_qsl((search or "").lstrip("?"), keep_blank_values=True):
        if key not in by_key:
            continue
        where, name = by_key[key]
        value: Any = text
        try:
            if name in INTS:
                value = int(text)
            elif name == "ema":
                value = min(max(float(text), 0.0), 0.999)
            elif name in FLAGS:
                value = text == "1"
            elif name in LISTS:
                value = [part for part in text.split(",") if part]
        except ValueError:
            continue
        (wanted if where == "selection" else options)[name] = value
    return wanted, options

"""Selection logic as pure functions: valid choices, resolving what the user wants, prev/next stepping.

The explorer remembers what the user last *asked for* (``wanted``) separately from what is shown (the
resolved :class:`Selection`). Resolving keeps every wanted value that is valid in the new context and
replaces only the ones that are not, by the nearest valid value (steps, iterations) or a sensible default.
Because ``wanted`` is never overwritten by a fallback, a choice comes back as soon as it is valid again:
picking an input node shows its ``value`` (it has no ``update``), and going back to a parameter node shows
its ``update`` again. This is how "changing one selector never resets the others needlessly" is kept.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from comgra_ndbg.graph.compound import ModuleBoxes
from comgra_ndbg.gui.ranks import rank_key, split_rank_key
from comgra_ndbg.gui.state import AGGREGATE, ReaderCache, Selection
from comgra_ndbg.stats.statistics import STATISTICS
from comgra_ndbg.store import schema

__all__ = ["Choices", "opened", "resolve", "revealed", "snapshot_neighbour", "step_neighbour", "tensor_label",
           "toggled", "wanted_from_trigger"]

KIND_ORDER = (schema.KIND_VALUE, schema.KIND_GRAD, schema.KIND_UPDATE)
DEFAULT_NODE_ROLES = ("output", "loss")  # the first node shown: what the network produced


@dataclass(frozen=True)
class Choices:
    """The valid values of every selector for one resolved selection (labels next to values)."""

    trials: list[str]
    step_types: list[str]
    steps: np.ndarray
    iterations: list[int]
    nodes: list[str]
    tensors: list[tuple[str, str]]  # (full name, label within the node)
    kinds: list[str]
    samples: list[int]
    ranks: list[int] = field(default_factory=list)  # of a distributed trial; empty for a single process

    def options(self, selector: str) -> list[Any]:
        """The plain values of a selector, in display order (``None`` stands for the batch aggregate)."""
        return {
            "trial": list(self.trials),
            "step_type": list(self.step_types),
            "step": [int(s) for s in self.steps],
            "iteration": list(self.iterations),
            "node": list(self.nodes),
            "tensor": [name for name, _ in self.tensors],
            "kind": list(self.kinds),
            "sample": [None, *self.samples],
            "rank": list(self.ranks),
        }[selector]


def tensor_label(tensor: str, node: str) -> str:
    """A tensor's name within its node: ``weight`` for ``model.fc.weight`` in node ``model.fc``.

    >>> tensor_label("model.fc.weight", "model.fc"), tensor_label("hidden", "hidden")
    ('weight', 'hidden')
    """
    return tensor[len(node) + 1:] if tensor.startswith(node + ".") else tensor


def resolve(cache: ReaderCache, wanted: dict[str, Any]) -> tuple[Selection, Choices]:
    """The selection closest to ``wanted`` that the recording can show, and the valid choices around it.

    Without a wanted step or step type, the first view shows the last step where the chosen tensor has a
    snapshot (of whichever step type), so it has element values to show.
    """
    selection, choices = _resolve(cache, wanted)
    if wanted.get("step") is None and wanted.get("step_type") is None and selection.tensor and selection.kind:
        snapshots = cache.snapshot_steps(selection.trial, selection.tensor, selection.kind)
        if len(snapshots) and selection.step not in snapshots:
            recording = cache.recording(selection.trial)
            last = int(np.max(snapshots))
            return _resolve(cache, {**wanted, "step": last, "step_type": recording.step_type_of(last)})
    return selection, choices


def _resolve(cache: ReaderCache, wanted: dict[str, Any]) -> tuple[Selection, Choices]:
    trials = list(cache.trials)
    name, named_rank = split_rank_key(wanted.get("trial") or "")
    name = name if name in trials else trials[0]
    ranks = cache.ranks(name)
    rank = next((r for r in (wanted.get("rank"), named_rank) if r in ranks), ranks[0] if ranks else None)
    trial = rank_key(name, rank)  # every read below is of this rank
    recording = cache.recording(trial)
    step_types = [t for t in recording.step_types if len(cache.steps_of_type(trial, t))]
    step_type = wanted.get("step_type") if wanted.get("step_type") in step_types else _default_step_type(
        recording, step_types)
    steps = cache.steps_of_type(trial, step_type) if step_type else np.zeros(0, np.int64)

    entries = tuple(wanted.get("boxes") or ())
    drawn = cache.drawn(trial, step_type, entries) if step_type else None
    nodes = list(drawn.order) if drawn is not None else list(recording.nodes)
    node = _pick_node(recording, nodes, wanted)
    stored = cache.stored_graph(trial, step_type) if step_type else None
    if stored is not None and node in stored.graph.node_names:
        members = stored.graph.node(node).tensors
    else:
        members = tuple(t.name for t in recording.tensors_of(node)) if node else ()
    tensors = [(name, tensor_label(name, node)) for name in members]
    sizes = cache.memo(trial, ("sizes",), lambda r: {t.name: int(np.prod(t.shape)) for t in r.tensors})
    tensor = _pick_tensor(tensors, wanted.get("tensor"), sizes)

    kinds = sorted(recording.kinds(tensor), key=_kind_rank) if tensor else []
    kind = wanted.get("kind") if wanted.get("kind") in kinds else (kinds[0] if kinds else None)
    step = _nearest(steps, wanted.get("step"), default=_default_step(cache, trial, steps, tensor, kind))
    iterations = _valid_iterations(cache, trial, tensor, kind, step)
    iteration = _nearest(np.array(iterations), wanted.get("iteration"), default=iterations[0]) if iterations else 0
    samples = _valid_samples(cache, trial, tensor, kind, step, iteration)
    sample = wanted.get("sample") if wanted.get("sample") in samples else None
    stat = wanted.get("stat") if wanted.get("stat") in STATISTICS else "mean"

    selection = Selection(trial=trial, step_type=step_type, step=step, iteration=int(iteration), node=node,
                          tensor=tensor, kind=kind, sample=sample, stat=stat, boxes=entries,
                          generation=cache.generation(trial))
    return selection, Choices(trials, step_types, steps, iterations, nodes, tensors, kinds, samples, ranks)


def toggled(entries: tuple[str, ...], path: str, collapsed: tuple[str, ...]) -> tuple[str, ...]:
    """Box ``entries`` (see :class:`~comgra_ndbg.gui.state.Selection`) after a click on box ``path``: opened
    when it is ``collapsed``, closed when it is open.

    >>> toggled(("-a", "+b"), "a", ("a",)), toggled((), "b", ())
    (('+b', '+a'), ('-b',))
    """
    kept = tuple(e for e in entries if e[1:] != path)
    return (*kept, ("+" if path in collapsed else "-") + path)


def revealed(entries: tuple[str, ...], boxes: ModuleBoxes, collapsed: tuple[str, ...], node: str) -> tuple[str, ...]:
    """Box ``entries`` with every collapsed box around ``node`` opened, so that it is drawn."""
    for path in boxes.ancestors(node):
        if path in collapsed:
            entries = toggled(entries, path, collapsed)
    return entries


def opened(command: str) -> tuple[str, ...]:
    """Box entries of a graph command: ``expand`` opens every box, ``default`` goes back to the first view.

    >>> opened("expand"), opened("default")
    (('*',), ())
    """
    return ("*",) if command == "expand" else ()


def wanted_from_trigger(wanted: dict[str, Any], trigger: Any, value: Any, current: Selection | None,
                        choices: Choices | None, cache: ReaderCache) -> dict[str, Any]:
    """``wanted`` after the user acted on ``trigger`` with ``value``; never mutates its input.

    Triggers: a selector name; ``"stepper"`` with ``(selector, delta)`` (selector ``"snapshot"``: the
    previous / next step with a snapshot of the tensor); ``"graph"`` with a tapped node's id (a box's tap
    opens or closes it: ``(id, "box")`` or ``(id, "frame")``); ``"search"`` with a node; ``"timeline"`` and
    ``"step_box"`` with a step; ``"jump"`` with ``(node, step, kind)`` or ``(node, step, kind, item)``;
    ``"boxes"`` with ``"expand"`` or ``"default"``. A timeline, step box or jump step goes to the nearest
    recorded step (and its step type); a jump keeps the node and kind when it names no node the recording
    has (the optimizer). Choosing a node that a collapsed box hides opens the boxes around it."""
    wanted = dict(wanted)
    if trigger is None or value is None:
        return wanted
    recording = cache.recording(current.trial if current is not None else cache.trials[0])
    if trigger == "stepper":
        selector, delta = value
        if current is None or choices is None:
            return wanted
        if selector == "step":
            wanted["step"] = step_neighbour(choices.steps, current.step, delta)
        elif selector == "snapshot":
            step = snapshot_neighbour(cache, current, delta)
            if step is not None:
                wanted.update(step=step, step_type=recording.step_type_of(step))
        else:
            wanted[selector] = _neighbour(choices.options(selector), getattr(current, selector), delta)
            if selector == "node":
                wanted["boxes"] = _reveal(cache, current, wanted)
    elif trigger == "step":  # the slider gives a position among the shown step type's steps
        if choices is not None and len(choices.steps):
            wanted["step"] = int(choices.steps[int(np.clip(int(value), 0, len(choices.steps) - 1))])
    elif trigger == "sample":
        wanted["sample"] = None if value == AGGREGATE else int(value)
    elif trigger == "graph" and isinstance(value, (tuple, list)) and value[1] in ("box", "frame"):
        if current is not None:
            drawn = cache.drawn(current.trial, current.step_type, current.boxes)
            if drawn is not None:
                wanted["boxes"] = list(toggled(tuple(current.boxes), str(value[0])[4:], drawn.collapsed))
    elif trigger in ("graph", "node", "search"):
        wanted["node"] = value[0] if isinstance(value, (tuple, list)) else value
        if trigger != "graph":
            wanted["boxes"] = _reveal(cache, current, wanted)
    elif trigger in ("timeline", "jump", "step_box"):
        node, step, kind, item = (list(value) + [""])[:4] if trigger == "jump" else (None, value, None, "")
        try:
            step = _nearest(np.sort(recording.steps), int(float(step)), default=None)
        except (TypeError, ValueError):
            return wanted
        if step is None:
            return wanted
        wanted["step_type"] = recording.step_type_of(step)
        wanted["step"] = step
        if node and node in recording.nodes:  # not a pseudo-node such as the optimizer
            wanted["node"] = node
            if kind:
                wanted["kind"] = kind
            wanted["boxes"] = _reveal(cache, current, wanted)
    elif trigger == "boxes":
        wanted["boxes"] = list(opened(value))
    else:
        wanted[trigger] = value
    return wanted


def _reveal(cache: ReaderCache, current: Selection | None, wanted: dict[str, Any]) -> list[str]:
    """The wanted box entries with the boxes around the wanted node opened."""
    entries = tuple(wanted.get("boxes") or ())
    if current is None or not wanted.get("node"):
        return list(entries)
    drawn, boxes = cache.drawn(current.trial, current.step_type, entries), cache.boxes(current.trial,
                                                                                       current.step_type)
    if drawn is None or boxes is None:
        return list(entries)
    return list(revealed(entries, boxes[0], drawn.collapsed, wanted["node"]))


def snapshot_neighbour(cache: ReaderCache, current: Selection, delta: int) -> int | None:
    """The step with a snapshot of the selected tensor before (``delta < 0``) or after the selected step,
    of any step type; the first or last one when there is none further; None without snapshots."""
    if current.tensor is None or current.kind is None:
        return None
    steps = np.sort(cache.snapshot_steps(current.trial, current.tensor, current.kind))
    if not len(steps):
        return None
    step = current.step if current.step is not None else int(steps[0])
    if delta < 0:
        before = steps[steps < step]
        return int(before[-1]) if len(before) else int(steps[0])
    after = steps[steps > step]
    return int(after[0]) if len(after) else int(steps[-1])


def step_neighbour(steps: np.ndarray, step: int | None, delta: int) -> int | None:
    """The recorded step ``delta`` positions away from ``step`` (clamped to the first / last one).

    >>> step_neighbour(np.array([0, 5, 10]), 5, +1), step_neighbour(np.array([0, 5, 10]), 0, -1)
    (10, 0)
    """
    if not len(steps):
        return None
    position = int(np.searchsorted(steps, step)) if step is not None else 0
    return int(steps[int(np.clip(position + delta, 0, len(steps) - 1))])


def _neighbour(options: list[Any], value: Any, delta: int) -> Any:
    if not options:
        return value
    position = options.index(value) if value in options else 0
    return options[int(np.clip(position + delta, 0, len(options) - 1))]


def _nearest(values: np.ndarray, wanted: Any, *, default: int | None) -> int | None:
    """The value in sorted ``values`` closest to ``wanted`` (ties go to the earlier one)."""
    if not len(values) or wanted is None:
        return default
    position = int(np.searchsorted(values, int(wanted)))
    candidates = [values[i] for i in (position - 1, position) if 0 <= i < len(values)]
    return int(min(candidates, key=lambda v: (abs(int(v) - int(wanted)), int(v))))


def _pick_node(recording: Any, nodes: list[str], wanted: dict[str, Any]) -> str | None:
    """The wanted node, else the node holding the wanted tensor, else the output (or loss), else the first."""
    if not nodes:
        return None
    if wanted.get("node") in nodes:
        return wanted["node"]
    holder = {t.name: t.node for t in recording.tensors}
    if holder.get(wanted.get("tensor")) in nodes:
        return holder[wanted["tensor"]]
    roles = {t.node: t.role for t in recording.tensors}
    for role in DEFAULT_NODE_ROLES:
        for name in nodes:
            if roles.get(name) == role:
                return name
    return nodes[0]


def _default_step_type(recording: Any, step_types: list[str]) -> str:
    """The step type of the last recorded step (where a run that failed shows it)."""
    if not step_types:
        return ""
    last = recording.step_type_of(int(recording.steps[-1])) if len(recording.steps) else step_types[0]
    return last if last in step_types else step_types[0]


def _default_step(cache: ReaderCache, trial: str, steps: np.ndarray, tensor: str | None,
                  kind: str | None) -> int | None:
    """The last step with a snapshot of the tensor (so the first view has element values), else the last."""
    if not len(steps):
        return None
    if tensor is None or kind is None:
        return int(steps[-1])

    def compute(_: Any) -> int:
        snapshots = np.intersect1d(cache.snapshot_steps(trial, tensor, kind), steps)
        return int(snapshots[-1]) if len(snapshots) else int(steps[-1])
    return cache.memo(trial, ("default-step", tensor, kind, len(steps), int(steps[-1])), compute)


def _pick_tensor(tensors: list[tuple[str, str]], wanted: str | None, sizes: dict[str, int]) -> str | None:
    """The wanted tensor, else the one with the same name within its node (``weight`` stays ``weight``),
    else the node's largest tensor."""
    if not tensors:
        return None
    names = [name for name, _ in tensors]
    if wanted in names:
        return wanted
    if wanted:
        leaf = wanted.rpartition(".")[2]
        for name, label in tensors:
            if label == leaf or label.endswith("." + leaf):
                return name
    return max(names, key=lambda n: (sizes.get(n, 0), n))


def _kind_rank(kind: str) -> tuple[int, str]:
    return (KIND_ORDER.index(kind), "") if kind in KIND_ORDER else (len(KIND_ORDER), kind)


def _valid_iterations(cache: ReaderCache, trial: str, tensor: str | None, kind: str | None,
                      step: int | None) -> list[int]:
    """Iterations of the step in which the tensor was recorded (all of them when it has no summaries)."""
    if step is None:
        return [0]
    count = cache.iterations(trial).get(int(step), 1)
    if count <= 1 or tensor is None or kind is None:
        return list(range(max(count, 1)))
    present = [i for i in range(count) if step in cache.series_rows(trial, tensor, kind, i)[0]]
    return present or list(range(count))


def _valid_samples(cache: ReaderCache, trial: str, tensor: str | None, kind: str | None, step: int | None,
                   iteration: int) -> list[int]:
    if tensor is None or kind is None or step is None:
        return []
    snapshot = cache.snapshot(trial, tensor, kind, step, iteration)
    return [] if snapshot is None else [int(i) for i in snapshot.sample_index]

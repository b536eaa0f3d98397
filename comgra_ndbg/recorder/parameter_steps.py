"""Tracked parameters on the recorder's side: ``track_module``, their values at the start of a step (copied
for the updates, in the same pass as their summaries) and their updates at its end (a mixin of ``Recorder``;
``parameters`` holds them)."""
from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter

import numpy as np
import torch

from comgra_ndbg.errors import InvalidArgumentError, InvalidTensorError, RecorderStateError
from comgra_ndbg.recorder.snapshot import take_update_snapshot
from comgra_ndbg.recorder.step_record import SummaryRows, zeros
from comgra_ndbg.recorder.tiers import optimizer_settings
from comgra_ndbg.recorder.validation import check_name, check_text
from comgra_ndbg.store import schema

__all__ = ["ParameterSteps"]

_REQUIRES_GRAD = attrgetter("requires_grad")


class ParameterSteps:
    """``track_module``, and the parameter values and updates of ``Recorder``'s steps; not used on its own."""

    def track_module(self, name: str, module: torch.nn.Module, *, node_suffix: str = "",
                     gradients_in_hook: bool = False, node_prefixes: Sequence[str] = ()) -> None:
        """Record every parameter of ``module`` (value, gradient, update), named ``name.<parameter path>``.

        Each parameter belongs to the node named by its owning module's path (plus ``node_suffix``), so a
        ``Linear`` is one node holding ``weight`` and ``bias``; a parameter whose name starts with one of
        ``node_prefixes`` (the first that matches) belongs to the node named by that prefix instead, so
        ``node_prefixes=["model.encoder"]`` makes all of the encoder's parameters one node.
        ``gradients_in_hook=True`` reduces each
        gradient in its post-accumulate-grad hook as soon as it is accumulated (the last accumulation of a
        step wins), for loops that clear ``.grad`` before ``record_gradients()`` or ``finish_step()`` runs;
        a caller that knows where each backward pass ends reads them there instead, with no hook per
        parameter (``poll_parameter_gradients``).
        """
        if not self.enabled:
            return
        self._check_open_recorder("track_module")
        if not isinstance(module, torch.nn.Module):
            raise InvalidTensorError(f"track_module({name!r}, ...) needs a torch.nn.Module, got "
                                     f"{type(module).__name__}")
        check_name(name, "module names")
        if name in self._parameters.modules:
            raise InvalidArgumentError(f"a module is already tracked as {name!r}; give each module its own name")
        if self._step_open:
            raise RecorderStateError(f"track_module({name!r}) was called inside step {self._step}; call it before "
                                     f"the first start_step()")
        if not isinstance(node_suffix, str):
            raise InvalidArgumentError(f"node_suffix must be a str, got {type(node_suffix).__name__}")
        check_text("node_suffix", node_suffix)
        if isinstance(node_prefixes, str) or any(not isinstance(p, str) or not p for p in node_prefixes):
            raise InvalidArgumentError(f"node_prefixes must be a list of non-empty str, got {node_prefixes!r}")
        for prefix in node_prefixes:
            check_name(prefix, "node_prefixes")
        left_out = self._parameters.track(name, module, node_suffix=node_suffix,
                                          on_gradient=self._on_parameter_grad if gradients_in_hook else None,
                                          node_prefixes=tuple(node_prefixes))
        for full, why in left_out:
            self._skipped(full, "parameter", why)

    def _resync_parameters(self, step: int) -> None:
        """Follow the parameters assigned to tracked modules since the last step (``ParameterTracker.resync``),
        each noted in the log (category ``parameter_replaced``) and warned about once."""
        if not self._parameters._assigned:  # (the usual step: one attribute read)
            return
        try:
            changed = self._parameters.resync()
        except Exception as error:  # a recorder problem must not break the training run
            self._warn("following a replaced parameter", error)
            return
        for name, old, new in changed:
            if old is None:
                message = (f"parameter {name!r} was added to a tracked module before step {step}; it is not "
                           f"recorded (the parameters are those the module had when it was tracked: track it "
                           f"from the start, or start a new recorder)")
            else:
                what = (f"a new tensor (shape {tuple(old.shape)} -> {tuple(new.shape)})" if old.shape != new.shape
                        else "a new tensor")
                message = (f"parameter {name!r} was assigned {what} before step {step}; it is recorded from the "
                           f"new tensor from this step on")
            self._add_log(step, schema.LOG_REPLACED, name, message, {"shape": list(new.shape)})
            self._note_once(f"replaced {name}", message)
        self._series_of_parameters.clear()
        if self.on_parameters_replaced is not None and any(old is not None for _, old, _ in changed):
            self.on_parameters_replaced()

    def _start_parameters(self) -> None:
        tracker = self._parameters
        tracker.watch()
        tracker.forget_gradients()  # accumulated between steps: not this step's
        series = self._parameter_series(schema.KIND_VALUE)
        state = self._tier_state
        measure = self.record_updates
        self._tier_stepped = 0  # steps of optimizers holding tracked parameters in this step so far
        if state is not None and self._summarize and measure:
            self._tiered = True
            due, self._tier_reason = state.decide(self._step, tracker.marks())
            measure = due or self._snapshot  # an update snapshot needs the start-of-step copy
        if self._summarize:
            if measure:
                indices = tracker.capture(self._reducer)
            else:
                indices = self._reducer.add_many([value for _, value in tracker.values()])
            self._value_blocks.append((series, indices))
            if self._tiered:
                self._tier_rows = indices
        elif measure:
            tracker.capture()
        if self._snapshot:
            starts = self._start_snapshots = {}
            for sid, (tid, value) in zip(series.tolist(), tracker.values()):
                data = starts[tid] = self._take(value, False)
                self._snaps.append((sid, 0, data))

    def _tier_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Every optimizer's step is about to run (a global pre-hook, installed with the tiers): when it holds
        tracked parameters and its settings jumped, the open step measures its updates from here, with the
        parameters copied before the optimizer changes them (``tiers``)."""
        tracker, state = self._parameters, self._tier_state
        if not tracker.holds(optimizer):
            return
        sentinel = self._sentinel_step
        step = (self._step if self._step_open else sentinel if sentinel is not None else
                self._last_step if self._last_step is not None else -1)
        stepped = self._tier_stepped
        self._tier_stepped += 1
        if not state.settings_jumped(step, id(optimizer), optimizer_settings(optimizer)):
            return
        # after another optimizer of the model stepped, a copy now would show its parameters as unchanged:
        # the hold measures the steps after instead
        if tracker.captured or stepped:
            return
        if self._step_open and self._tiered:
            tracker.capture()
            self._tier_reason = "; ".join(filter(None, (self._tier_reason, "tiers: an optimizer's settings jumped")))
        elif not self._step_open and sentinel is not None:
            tracker.capture()  # the sentinel step measures this update (``sentinel_steps``)

    def _observe_tier_values(self, rows: np.ndarray) -> None:
        """The parameter value rows of a tiered step (``tiers``): whether the next steps measure updates."""
        reason = self._tier_state.observe_values(self._step, rows)
        if reason and not self._tier_reason:
            self._tier_reason = reason + ": the next steps are measured in full"

    def _observe_tier_gradients(self, rows: SummaryRows) -> None:
        """The parameter gradient rows among a tiered step's ``rows``, watched as a sentinel step's are (a jump,
        a non-finite or a missing gradient holds the next steps in full)."""
        tids = self._parameters.tensor_ids()
        key = ("found", schema.KIND_GRAD, len(tids))
        series = self._series_of_parameters.get(key)
        if series is None:  # kept once every parameter has a gradient series (a series id never changes)
            find = self.catalog.find_series
            series = np.array([-1 if (sid := find(tid, schema.KIND_GRAD)) is None else sid for tid in tids],
                              dtype=np.int64)  # creates no series
            if (series >= 0).all():
                self._series_of_parameters[key] = series
        order = np.argsort(rows.series, kind="stable")
        at = np.minimum(np.searchsorted(rows.series[order], series), max(len(order) - 1, 0))
        found = (len(order) > 0) & (rows.series[order][at] == series) if len(order) else np.zeros(len(series), bool)
        requires = np.array(list(map(_REQUIRES_GRAD, self._parameters.parameters())), dtype=bool)
        missing = bool((requires & ~found).any())
        grads = rows.data[order[at]] if found.all() else None
        reason = self._tier_state.observe_gradients(self._step, grads, missing)
        if reason and not self._tier_reason:
            self._tier_reason = reason + ": the next steps are measured in full"

    def _parameter_series(self, kind: str) -> np.ndarray:
        """Series ids of every tracked parameter's ``kind``, in ``ParameterTracker.tensor_ids()`` order."""
        tids = self._parameters.tensor_ids()
        key = (kind, len(tids))
        cached = self._series_of_parameters.get(key)
        if cached is None:
            cached = self._series_of_parameters[key] = np.array([self.catalog.series_id(tid, kind) for tid in tids],
                                                                dtype=np.int64)
            cached.flags.writeable = False  # shared by the steps' records
        return cached

    def _finish_parameters(self) -> None:
        if self._tiered:
            self._tier_state.finish(self._step, self._parameters.marks())
        if not self._parameters.captured:
            return
        keep = self._parameters.update_mask()  # a frozen parameter that did not move has no update
        everything = False not in keep.tolist()  # (numpy's reduction costs more on a few values)
        if everything:
            series = self._parameter_series(schema.KIND_UPDATE)
        else:
            series = np.array([self.catalog.series_id(tid, schema.KIND_UPDATE) for tid, kept
                               in zip(self._parameters.tensor_ids(), keep.tolist()) if kept], dtype=np.int64)
        if self._summarize:
            indices = self._parameters.summarize_updates(self._reducer)
            at = self._step_rows.add(series, zeros(len(series)), indices if everything else
                                     np.asarray(indices, dtype=np.int64)[keep])
            if self._tiered:
                self._step_rows.take(self._reducer, wait=True)
                self._tier_state.observe_updates(self._step_rows.read(at, self._report_failed), keep)
        if self._snapshot:
            self._take_updates(self._parameters.update_pairs(), keep)
        self._parameters.release()

    def _take_updates(self, pairs: list[tuple[int, torch.Tensor, torch.Tensor]], keep: np.ndarray) -> None:
        """The update snapshots of the parameters ``keep`` marks, read at the elements their value snapshots at
        the step's start already hold where those are at hand."""
        elements = self._snapshot_limits()[1]
        starts = self._start_snapshots
        for (tid, value, start), kept in zip(pairs, keep.tolist()):
            if kept:
                self._snaps.append((self.catalog.series_id(tid, schema.KIND_UPDATE), 0,
                                    take_update_snapshot(value, start, max_elements=elements,
                                                         start_snapshot=starts.get(tid), on_device=True)))

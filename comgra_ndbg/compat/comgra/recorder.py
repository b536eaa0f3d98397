"""``ComgraRecorder``: Comgra 0.11.5's recorder API, recorded by this library's ``Recorder``.

Every public method of Comgra's ``ComgraRecorder`` is here with Comgra's signature and meaning; each call
becomes calls of the Recorder's public API (see ``docs/comgra.md`` for the full table):

==============================================  ====================================================================
Comgra                                          here
==============================================  ====================================================================
``ComgraRecorder(root, group, trial_id, …)``    ``Recorder(root / group, trial=trial_id, mode="w", overwrite=True)``
decision maker ("recording" a step)             the snapshot policy (:mod:`.decisions`)
``start_batch(step, batch_size, type, …)``      ``start_step(step, step_type=type)`` (``None``: decided later)
``start_iteration`` / ``finish_iteration``      ``start_iteration`` / ``finish_iteration``
``register_tensor(name, t, is_input=True, …)``  ``register_tensor(name, t, role="input", node=…)``
``add_tensor_connection(src, sink)``            ``add_dependency(src, sink)``
``record_current_gradients(name)``              ``record_gradients()`` (first set), ``record_gradients(name)``
``record_kpi_in_graph(group, name, value)``     ``record_kpi("group/name", value)``
``add_note`` / ``finalize``                     ``add_note`` / ``close``
==============================================  ====================================================================

Iterations. Comgra registers initial values (``is_initial_value=True``) and parameters in iteration
-1, before the first forward pass. Here a step that registers initial values keeps them in iteration 0
and numbers its forward passes from 1 (so iteration 0's graph is not a cycle through the state node);
a step without initial values numbers its passes from 0, as Comgra does.

With ``comgra_is_active=False`` every call returns at once (``track_module`` only remembers module names,
so that ``get_name_of_module`` works, which in Comgra raises ``KeyError``).
"""
from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from comgra_ndbg.compat.comgra import checks
from comgra_ndbg.compat.comgra.decisions import ComgraSnapshots, ComgraSummaries, StepState, check_decision_maker
from comgra_ndbg.compat.comgra.registration import Registrations
from comgra_ndbg.errors import (DuplicateTensorError, InvalidArgumentError, InvalidTensorError, RecorderStateError,
                                UnknownModuleError)
from comgra_ndbg.recorder import Recorder
from comgra_ndbg.recorder.policy import as_policy

__all__ = ["ComgraRecorder"]

ALL_SAMPLES = 2 ** 31 - 1
"""``num_samples`` for ``max_num_batch_size_to_record=None``: every sample of the batch."""

_LAYER_OPTIONS = ("path", "trial", "enabled", "mode", "overwrite", "snapshots", "num_samples", "parameter_groups")


class ComgraRecorder(Registrations):
    """Comgra's recorder: the trial goes to ``comgra_root_path/group/trial_id/``, a recording of this library
    (``comgra-ndbg gui comgra_root_path/group`` shows the group with its trials).

    ``recorder_options`` (not in Comgra) passes further keyword arguments to the underlying
    :class:`~comgra_ndbg.Recorder`, e.g. ``{"summaries": 10}`` to summarize every 10th step only;
    ``recorder`` is that Recorder, for calls of the native API.
    """

    def __init__(
        self,
        comgra_root_path: str | Path,
        group: str,
        trial_id: str,
        decision_maker_for_recordings: Any,
        max_num_batch_size_to_record: int | None = None,
        prefixes_for_grouping_module_parameters_visually: Sequence[str] | None = None,
        prefixes_for_grouping_module_parameters_in_nodes: Sequence[str] | None = None,
        comgra_is_active: bool = True,
        max_num_mappings_to_save_at_once_during_serialization: int = 10000,
        type_of_serialization: str = "msgpack",
        calculate_svd_and_other_expensive_operations_of_parameters: bool = True,
        *,
        recorder_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.comgra_is_active = bool(comgra_is_active)
        self.trial_id = trial_id
        self.module_to_name: dict[torch.nn.Module, str] = {}
        self.training_step: int | None = None
        self.type_of_execution: str | None = None
        self.iteration: int | None = None
        self.current_batch_size: int | None = None
        self.recorder = Recorder("", enabled=False)
        self._reset_step()
        if not self.comgra_is_active:
            return
        root = Path(comgra_root_path).resolve()
        if not root.is_dir():
            raise InvalidArgumentError(f"comgra_root_path {str(root)!r} is not an existing folder; create it first "
                                       f"(Comgra requires it to exist)")
        if not isinstance(group, str) or not group or "/" in group or "\\" in group or group in (".", ".."):
            raise InvalidArgumentError(f"group must name one folder inside comgra_root_path, got {group!r}")
        if not isinstance(trial_id, str) or not trial_id:  # '' would make the group folder the trial's
            raise InvalidArgumentError(f"trial_id must name one folder inside the group folder (Comgra writes the "
                                       f"trial to comgra_root_path/group/trial_id), got {trial_id!r}; e.g. "
                                       f"'trial_0' or 'lr3e-4'")
        check_decision_maker(decision_maker_for_recordings)
        if max_num_batch_size_to_record is not None and (isinstance(max_num_batch_size_to_record, bool) or not
                                                         isinstance(max_num_batch_size_to_record, int)
                                                         or max_num_batch_size_to_record < 1):
            raise InvalidArgumentError(f"max_num_batch_size_to_record must be None (every sample) or an int >= 1, got "
                                       f"{max_num_batch_size_to_record!r}")
        visually, in_nodes = checks.check_prefixes(prefixes_for_grouping_module_parameters_visually or [""],
                                                   prefixes_for_grouping_module_parameters_in_nodes or [])
        self.decision_maker_for_recordings = decision_maker_for_recordings
        self.max_num_batch_size_to_record = max_num_batch_size_to_record
        self.prefixes_for_grouping_module_parameters_visually = visually
        self.prefixes_for_grouping_module_parameters_in_nodes = in_nodes
        self.group_path = root / group
        self.trial_path = self.group_path / trial_id
        options = dict(recorder_options or {})
        unknown = sorted(set(options) - set(inspect.signature(Recorder).parameters))
        if unknown:
            raise InvalidArgumentError(f"recorder_options has keys Recorder does not take: {unknown}; see "
                                       f"help(comgra_ndbg.Recorder) for its keyword arguments")
        taken = sorted(set(options) & set(_LAYER_OPTIONS))
        if taken:
            raise InvalidArgumentError(f"recorder_options may not set {taken}: ComgraRecorder sets them from Comgra's "
                                       f"arguments (snapshots come from decision_maker_for_recordings)")
        self._warner = checks.Warner()
        self._warn_about_arguments(max_num_mappings_to_save_at_once_during_serialization, type_of_serialization,
                                   calculate_svd_and_other_expensive_operations_of_parameters)
        self._state = StepState()
        summaries = ComgraSummaries(as_policy(options.pop("summaries", 1), name="summaries"), self._state)
        snapshots = ComgraSnapshots(decision_maker_for_recordings, self._state)
        self.recorder = Recorder(self.group_path, trial=trial_id, mode="w", overwrite=True, summaries=summaries,
                                 snapshots=snapshots, num_samples=max_num_batch_size_to_record or ALL_SAMPLES,
                                 parameter_groups=[prefix for prefix in visually if prefix], **options)
        self._stage = "inactive"
        self._kpi_timepoints: dict[tuple[str, str | None], int] = {}

    def _warn_about_arguments(self, mappings: int, serialization: str, svd: bool) -> None:
        if mappings != 10000:
            self._warner.once("mappings", "max_num_mappings_to_save_at_once_during_serialization has no equivalent: "
                                          "steps are written in blocks to HDF5; the value is ignored")
        if serialization != "msgpack":
            self._warner.once("serialization", f"type_of_serialization={serialization!r} has no equivalent: the "
                                               f"recording is HDF5; the value is ignored")
        if svd:
            self._warner.once("svd", "calculate_svd_and_other_expensive_operations_of_parameters=True has no "
                                     "equivalent: no singular values are computed (pass False to silence this)")

    # ---- setup ---------------------------------------------------------------------------------------------
    def recording_is_active(self) -> bool:
        """Whether Comgra records (snapshots) the current step: its decision maker's answer, unless
        ``start_batch`` overrode it; True while the type of execution is still undecided."""
        return self.comgra_is_active and self._records(self.type_of_execution)

    def _records(self, type_of_execution: str | None) -> bool:
        state = self._state
        if state.override is not None:
            return state.override
        if state.none_due:
            return False
        if type_of_execution is None:
            return True
        return bool(self.decision_maker_for_recordings.is_record_on_this_step(self.training_step, type_of_execution))

    def track_module(self, module_name: str, module: torch.nn.Module) -> None:
        """Record every parameter of ``module`` (and its submodules) as ``module_name.<path>``."""
        if not isinstance(module, torch.nn.Module):
            raise InvalidTensorError(f"track_module({module_name!r}, ...) needs a torch.nn.Module, got "
                                     f"{type(module).__name__}")
        if not isinstance(module_name, str) or not module_name or "." in module_name:
            raise InvalidArgumentError(f"track_module: module_name must be a non-empty str without '.', got "
                                       f"{module_name!r} (Comgra joins module names with '.')")
        if self.comgra_is_active and self._stage != "inactive":
            raise RecorderStateError(f"track_module({module_name!r}) inside a batch; track modules before "
                                     f"start_batch() or between finish_batch() and the next start_batch()")
        names = {sub: f"{module_name}.{path}" if path else module_name for path, sub in module.named_modules()}
        known = [self.module_to_name[sub] for sub in names if sub in self.module_to_name]
        if known:
            raise InvalidArgumentError(f"track_module({module_name!r}): this module (or one inside it) is already "
                                       f"tracked as {known[0]!r}; track each module once, under one name")
        if module_name in self.module_to_name.values():
            raise InvalidArgumentError(f"track_module({module_name!r}): another module is already tracked under "
                                       f"that name; give each module its own name")
        self.module_to_name.update(names)
        if not self.comgra_is_active:
            return
        self._check_parameter_prefixes(module_name, module)
        self.recorder.track_module(module_name, module,
                                   node_prefixes=self.prefixes_for_grouping_module_parameters_in_nodes)

    def _check_parameter_prefixes(self, module_name: str, module: torch.nn.Module) -> None:
        visually = self.prefixes_for_grouping_module_parameters_visually
        for path, _ in module.named_parameters():
            name = f"{module_name}.{path}"
            if not any(name.startswith(prefix) for prefix in visually):
                raise InvalidArgumentError(f"the parameter {name!r} is covered by none of the prefixes in "
                                           f"prefixes_for_grouping_module_parameters_visually {visually}; Comgra "
                                           f"requires every parameter to be covered (add a prefix such as "
                                           f"{module_name!r})")

    def get_name_of_module(self, module: torch.nn.Module) -> str:
        """The name ``track_module`` gave ``module`` (``root.sub.layer`` for a submodule)."""
        try:
            return self.module_to_name[module]
        except KeyError:
            raise UnknownModuleError(f"get_name_of_module: this {type(module).__name__} was not given to "
                                     f"track_module() and is not inside a module that was; track its root module "
                                     f"first") from None

    def add_note(self, note: Any) -> None:
        """Attach ``str(note)`` to the current (or last) step; shown in the GUI's Notes & problems tab."""
        if self.comgra_is_active:
            self.recorder.add_note(str(note))

    # ---- steps ---------------------------------------------------------------------------------------------
    def start_batch(self, training_step: int, current_batch_size: int,
                    type_of_execution: str | None = "main_execution_type",
                    record_all_tensors_per_batch_index_by_default: bool = True,
                    override__recording_is_active: bool | None = None) -> None:
        """Begin training step ``training_step`` (strictly increasing) with its batch size and type of execution
        (``None``: decided at its end by ``decide_recording_of_batch``). ``override__recording_is_active``:
        ``True`` records the step whatever the decision maker says, ``False`` records nothing of it."""
        if not self.comgra_is_active:
            return
        if self._stage != "inactive":
            raise RecorderStateError(f"start_batch({training_step}) while step {self.training_step} is open; call "
                                     f"finish_batch() at the end of each step")
        if isinstance(training_step, bool) or not isinstance(training_step, int) or training_step < 0:
            raise InvalidArgumentError(f"start_batch: training_step must be an int >= 0, got {training_step!r}")
        if self.training_step is not None and training_step <= self.training_step:
            raise RecorderStateError(f"start_batch({training_step}) after step {self.training_step}; Comgra requires "
                                     f"the training_step to increase from one batch to the next")
        if isinstance(current_batch_size, bool) or not isinstance(current_batch_size, int) or current_batch_size < 1:
            raise InvalidArgumentError(f"start_batch: current_batch_size must be an int >= 1, got "
                                       f"{current_batch_size!r}")
        if type_of_execution is not None:
            checks.check_type_of_execution(type_of_execution, "start_batch")
        if override__recording_is_active not in (None, True, False):
            raise InvalidArgumentError(f"override__recording_is_active must be None, True or False, got "
                                       f"{override__recording_is_active!r}")
        state = self._state
        before = (self.training_step, self.type_of_execution, state.override, state.none_due)
        state.none_due = (override__recording_is_active is None and state.declared and not any(
            self.decision_maker_for_recordings.is_record_on_this_step(training_step, recorded)
            for recorded in state.recorded_types))
        state.override = override__recording_is_active
        self.training_step, self.type_of_execution = training_step, type_of_execution
        if self.recording_is_active() and not self.module_to_name:
            self.training_step, self.type_of_execution, state.override, state.none_due = before
            raise RecorderStateError("no module is tracked yet; call track_module() on your model before recording "
                                     "(Comgra requires it)")
        self.current_batch_size = current_batch_size
        self.iteration = None
        self._stage = "started"
        self._reset_step()
        self._per_sample_default = bool(record_all_tensors_per_batch_index_by_default)
        if not self._per_sample_default:
            self._warner.once("per_sample", "record_all_tensors_per_batch_index_by_default=False has no equivalent: "
                                            "snapshots keep the values of the first max_num_batch_size_to_record "
                                            "samples of every batched tensor")
        self.recorder.start_step(training_step, type_of_execution)
        self._recording = self.recorder.is_recording

    def start_iteration(self) -> None:
        """Begin the next forward pass (iteration) of the step."""
        if not self.comgra_is_active:
            return
        if self._stage not in ("started", "after_iteration"):
            raise RecorderStateError(self._order_message("start_iteration()", "after start_batch() or "
                                                                               "finish_iteration()"))
        self._stage = "forward"
        if self.iteration is None:
            self.iteration = 0
            if self._initial_values:  # iteration 0 holds them: the passes count from 1
                self.recorder.start_iteration()
                self.recorder.finish_iteration()
                self._offset = 1
        else:
            self.iteration += 1
        self.recorder.start_iteration()

    def finish_iteration(self) -> None:
        """End the current iteration."""
        if not self.comgra_is_active:
            return
        if self._stage != "forward":
            raise RecorderStateError(self._order_message("finish_iteration()", "after start_iteration()"))
        self._stage = "after_iteration"
        self.recorder.finish_iteration()

    def declare_that_all_different_types_of_execution_have_been_encountered(self) -> None:
        """Promise that no new type of execution will come: a step started without a type is then not
        recorded tentatively when no known type is due. A new type after this raises at ``finish_batch``."""
        if self.comgra_is_active:
            self._state.declared = True

    def decide_recording_of_batch(self, type_of_execution: str, category_per_sample: Sequence[str]) -> None:
        """Settle the type of execution of a step started with ``type_of_execution=None``; when the step is
        recorded, its snapshots keep a sample choice balanced over ``category_per_sample`` (one str per
        sample). For a step that has a type this only checks that the types agree."""
        if not self.comgra_is_active:
            return
        if self._stage == "inactive":
            raise RecorderStateError("decide_recording_of_batch() outside a batch; call it before finish_batch()")
        if self.type_of_execution is not None:
            if type_of_execution != self.type_of_execution:
                raise InvalidArgumentError(f"decide_recording_of_batch({type_of_execution!r}) for a step that "
                                           f"start_batch() gave the type {self.type_of_execution!r}; they must agree")
            return
        checks.check_type_of_execution(type_of_execution, "decide_recording_of_batch")
        categories = None
        if self._records(type_of_execution):
            categories = list(category_per_sample)
            if len(categories) != self.current_batch_size or not all(isinstance(c, str) for c in categories):
                raise InvalidArgumentError(f"decide_recording_of_batch: category_per_sample must hold one str per "
                                           f"sample of the batch ({self.current_batch_size}), got {len(categories)} "
                                           f"items of types {sorted({type(c).__name__ for c in categories})}")
        self.recorder.decide_step(type_of_execution, sample_categories=categories)
        self.type_of_execution = type_of_execution

    def finish_batch(self) -> None:
        """End the step: its summaries (and, if Comgra records it, its snapshots) are written."""
        if not self.comgra_is_active:
            return
        if self._stage == "inactive":
            raise RecorderStateError("finish_batch() without start_batch(); call start_batch() at the beginning of "
                                     "each step")
        recording = self.recording_is_active()
        if recording and self._stage != "after_iteration":
            raise RecorderStateError(self._order_message("finish_batch()", "after finish_iteration()"))
        self._stage = "inactive"
        self._reset_step()
        if self.type_of_execution is None:  # Comgra records nothing of a step whose type was never decided
            self.recorder.discard_step()
            if recording:
                raise RecorderStateError(f"step {self.training_step} was started with type_of_execution=None; call "
                                         f"decide_recording_of_batch() before finish_batch() (the step is not "
                                         f"recorded)")
            return
        self.recorder.finish_step()
        state = self._state
        if recording:
            new = self.type_of_execution not in state.recorded_types
            state.recorded_types[self.type_of_execution] = self.training_step
            if state.declared and new:
                raise RecorderStateError(f"declare_that_all_different_types_of_execution_have_been_encountered() was "
                                         f"called too early: the type of execution {self.type_of_execution!r} was "
                                         f"not encountered before (step {self.training_step} is recorded)")

    def finalize(self) -> None:
        """Write everything buffered and consolidate the trial into ``recording.h5``; the recorder is closed."""
        if self.comgra_is_active:
            self.recorder.close()

    # ---- gradients and KPIs ----------------------------------------------------------------------------------
    def record_current_gradients(self, name_of_loss_group: str,
                                 set_gradients_to_zero_if_not_a_parameter: bool = False) -> None:
        """Record the gradients that the backward passes since the previous call produced on every registered
        tensor and tracked parameter. The step's first set is kind ``grad`` (what the analysis reads), each
        further set kind ``grad:<name_of_loss_group>``. The gradients are taken by hooks, which keep no ``.grad``;
        ``set_gradients_to_zero_if_not_a_parameter=True`` clears the ``.grad`` that autograd leaves on registered
        leaf tensors (an input that registration made require a gradient), as Comgra does on the steps it
        records. A second set in a step warns once that it holds the new passes only (Comgra: the accumulated
        ``.grad``)."""
        if not self.comgra_is_active:
            return
        if self.recording_is_active() and self.type_of_execution is None:
            raise RecorderStateError("record_current_gradients() in a step started with type_of_execution=None; "
                                     "call decide_recording_of_batch() first (Comgra requires it, because a set "
                                     "of gradients cannot be recorded late)")
        if not isinstance(name_of_loss_group, str) or not name_of_loss_group:
            raise InvalidArgumentError(f"name_of_loss_group must be a non-empty str, got {name_of_loss_group!r}")
        if name_of_loss_group in self._gradient_sets:
            raise DuplicateTensorError(f"record_current_gradients({name_of_loss_group!r}) was already called in step "
                                       f"{self.training_step}; give each set of gradients its own name")
        first = not self._gradient_sets
        if not first:
            self._warner.once("gradient_sets", "a second set of gradients in a step (record_current_gradients) holds "
                                               "what the backward passes since the previous set added, for parameters "
                                               "and registered tensors alike; Comgra records each tensor's accumulated "
                                               ".grad, the same only when zero_grad() and "
                                               "set_gradients_to_zero_if_not_a_parameter=True separate the sets")
        self._gradient_sets.append(name_of_loss_group)
        if self._recording:
            self.recorder.record_gradients(None if first else name_of_loss_group)
        if set_gradients_to_zero_if_not_a_parameter and self.recording_is_active():
            for entries in self._by_tensor.values():  # as Comgra: only a leaf keeps a .grad (hooks take the rest)
                for entry in entries:
                    if entry.kind != "parameter" and entry.tensor.is_leaf and entry.tensor.grad is not None:
                        entry.tensor.grad = None

    def record_kpi_in_graph(self, kpi_group: str, kpi_name: str, val: float | torch.Tensor,
                            timepoint: int | None = None, record_even_if_recording_is_inactive: bool = False) -> None:
        """Record a scalar as the KPI ``kpi_group`` (``kpi_group/kpi_name`` when ``kpi_name`` is not empty),
        one curve per type of execution in the KPIs tab. Every value is kept, on every step that records."""
        if not self.comgra_is_active:
            return
        if not (self._recording or record_even_if_recording_is_inactive or self.recording_is_active()):
            return
        if not isinstance(kpi_group, str) or not kpi_group or not isinstance(kpi_name, str):
            raise InvalidArgumentError(f"record_kpi_in_graph: kpi_group must be a non-empty str and kpi_name a str, "
                                       f"got {kpi_group!r}, {kpi_name!r}")
        name = f"{kpi_group}/{kpi_name}" if kpi_name else kpi_group
        if timepoint is not None and timepoint != self.training_step:
            self._warner.once("timepoint", "record_kpi_in_graph(timepoint=...) other than the training step has no "
                                           "equivalent: KPIs are stored at the training step")
        when = self.training_step if timepoint is None else timepoint
        last = self._kpi_timepoints.get((name, self.type_of_execution))
        if last is not None and when is not None and when <= last:
            raise RecorderStateError(f"record_kpi_in_graph({kpi_group!r}, {kpi_name!r}) at timepoint {when} after "
                                     f"timepoint {last}; Comgra requires a newer timepoint on each call")
        self._kpi_timepoints[(name, self.type_of_execution)] = when
        self.recorder.record_kpi(name, val)

    def _order_message(self, call: str, where: str) -> str:
        return (f"{call} is called in the wrong place (stage {self._stage!r} of step {self.training_step}); Comgra "
                f"expects it {where}")

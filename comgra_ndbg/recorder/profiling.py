"""The recorder's side of per-layer profiling (a mixin of ``Recorder``): ``profile=`` and
:meth:`ProfileRecording.profile_module`; the measuring itself is ``profiler.ModuleProfiler``."""
from __future__ import annotations

from functools import partial
from typing import Any

from torch import nn

from comgra_ndbg.errors import InvalidArgumentError
from comgra_ndbg.recorder.profile_config import as_profile_config
from comgra_ndbg.recorder.profiler import ModuleProfiler
from comgra_ndbg.recorder.validation import check_name

__all__ = ["ProfileRecording"]


class ProfileRecording:
    """Per-layer profiling of ``Recorder``; not used on its own."""

    def _init_profile(self, profile: Any) -> None:
        config = as_profile_config(profile)
        self._profiler = None if config is None else ModuleProfiler(config, self._warn)

    def profile_module(self, name: str, module: nn.Module) -> None:
        """Profile ``module`` and every module inside it (named ``name`` and ``name.<path>``) on the steps the
        recorder's ``profile=`` policy picks; ``NeuralDbg(profile=...)`` calls this for its model. Does
        nothing unless the recorder was created with ``profile=``.

        Call it before the first step. Process memory and step time are recorded with or without it.
        """
        if not self.enabled or self._profiler is None:
            return
        self._check_open_recorder("profile_module")
        if not isinstance(module, nn.Module):
            raise InvalidArgumentError(f"profile_module(name, module) needs a torch.nn.Module, got "
                                       f"{type(module).__name__}")
        check_name(name, "module names")
        self._profiler.attach(name, module)

    def _profile_start(self, step: int, step_type: str | None) -> None:
        if self._profiler is not None:
            if not self._profiler.names:
                self._note_once("profile_no_module", "Recorder(profile=...) profiles the modules given to "
                                "rec.profile_module(name, module), and none was given: only step time and process "
                                "memory are recorded; call rec.profile_module('model', model) before the first step")
            self._guard("profiling", partial(self._profiler.start_step, step, step_type))

    def _profile_finish(self) -> None:
        if self._profiler is not None:
            self._guard("profiling", partial(self._profiler.finish_step, self._step, self._step_type, self._writer))

    def _profile_discard(self) -> None:
        if self._profiler is not None:
            self._profiler.discard()

    def _profile_close(self) -> None:
        if self._profiler is not None:
            self._guard("profiling", partial(self._profiler.close, self._writer))

"""KPIs and notes: scalars recorded for every step, recorded or skipped, and free text (a mixin of
``Recorder``). KPI tensors are read at the end of the step, in one copy with everything else."""
from __future__ import annotations

import numpy as np
import torch

from comgra_ndbg.errors import InvalidArgumentError, InvalidTensorError, RecorderStateError
from comgra_ndbg.recorder import native
from comgra_ndbg.recorder.validation import check_name, check_text

__all__ = ["KpiRecording"]


class KpiRecording:
    """``record_kpi`` and ``add_note`` of ``Recorder``; not used on its own."""

    def record_kpi(self, name: str, value: float | torch.Tensor, *, step_type: str | None = None) -> None:
        """Record a scalar KPI (e.g. the loss) for the current step — or, between steps, the last one.

        KPIs are kept for every step, recorded or skipped by the policies. A host tensor is read at once;
        device tensors are read at the end of the step, in one copy with everything else, not with
        ``.item()`` (which would wait for the device at every KPI). ``step_type`` files the value under
        another step type than the step's own: a validation pass run after a training step records its
        metrics with ``step_type="validation"`` at that step, so ``Recording.kpi(name, "validation")`` and
        the GUI's KPI plot show them as a curve of their own.
        """
        if not self.enabled:
            return
        if (type(value) is torch.Tensor and step_type is None and self._step_open and not self._replayed
                and not self._closed):
            kpi = self._known_kpis.get(name)  # (a name checked before, recorder open: the checks below hold)
            if (kpi is not None and value.is_cpu and value.dim() == 0 and value.layout is torch.strided
                    and not value.dtype.is_complex):  # the usual loss tensor, at every step: read as below
                self._kpis.append((kpi, float(native.scalar(value))))  # (read from memory: no tensor op)
                return
        self._check_open_recorder("record_kpi")
        check_name(name, "KPI names")
        if step_type is not None:
            if not isinstance(step_type, str) or not step_type:
                raise InvalidArgumentError(f"step_type of KPI {name!r} must be a non-empty str (or None for the "
                                           f"step's own type), got {step_type!r}")
            check_name(step_type, "step types")
        if isinstance(value, torch.Tensor):
            if value.is_nested:
                raise InvalidTensorError(f"KPI {name!r} must be a scalar, got a nested tensor; reduce it first")
            if value.numel() != 1:
                raise InvalidTensorError(f"KPI {name!r} must be a scalar, got a tensor of shape "
                                         f"{tuple(value.shape)}; reduce it first (e.g. .mean())")
            if value.is_complex() or value.is_meta or value.layout is not torch.strided:
                raise InvalidTensorError(f"KPI {name!r} must be a real number, got a {value.dtype} tensor on "
                                         f"{value.device} ({value.layout}); pass e.g. its .abs() or .real")
            value = value.detach().reshape(())
            if value.is_cpu:  # no device to wait for: the value it holds now, whatever the loop does to it later
                value = float(native.scalar(value))
        elif isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise InvalidTensorError(f"KPI {name!r} must be a number or a one-element tensor, got "
                                     f"{type(value).__name__}")
        else:
            try:
                value = float(value)
            except OverflowError:
                raise InvalidArgumentError(f"KPI {name!r} = {value} does not fit a float64; record it scaled (e.g. "
                                           f"its log10)") from None
        if self._last_step is None:
            raise RecorderStateError(f"record_kpi({name!r}) before any step; call start_step() first")
        if self._replayed:  # already in the recording, from before the trial was continued
            return
        kpi = self.catalog.kpi_id(name)
        self._known_kpis[name] = kpi
        own_type = None if step_type is None else self.catalog.step_type_id(step_type)
        if self._step_open:
            self._kpis.append((kpi, value) if own_type is None else (kpi, value, own_type))
        else:
            if self._skipped_steps:
                self._write_skipped()
            type_id = self.catalog.step_type_id(self._last_step_type) if own_type is None else own_type
            number = float(value.item()) if isinstance(value, torch.Tensor) else float(value)
            self._writer.add_kpi(self._last_step, kpi, number, type_id)

    def _record_known_kpi(self, kpi: int, value: float | torch.Tensor) -> None:
        """``record_kpi`` for an internal caller that recorded this KPI through ``record_kpi`` before (``kpi``:
        its ``catalog.kpi_id``) and passes a plain float or a detached 0-d real tensor: no checks, the open
        step only."""
        if self._step_open and not self._replayed:
            self._kpis.append((kpi, value))

    def add_note(self, text: str) -> None:
        """Attach a free-text note to the current (or last) step, e.g. "lr lowered to 1e-4"."""
        if not self.enabled:
            return
        self._check_open_recorder("add_note")
        if self._skipped_steps:
            self._write_skipped()
        check_text("a note", text)
        self._writer.add_note(-1 if self._last_step is None else self._last_step, text)

    def _write_kpis(self, type_id: int) -> dict[str, float]:
        if not self._kpis:
            return {}
        # Device tensors are read in one copy; a CPU tensor is read directly (no device to wait for).
        tensors = [entry[1] for entry in self._kpis if isinstance(entry[1], torch.Tensor) and not entry[1].is_cpu]
        host = iter(torch.stack([t.to(torch.float64) for t in tensors]).cpu().tolist()) if tensors else iter(())
        values = {}
        for kpi, value, *own_type in self._kpis:  # own_type: (type id,) of a KPI filed under another step type
            if isinstance(value, torch.Tensor):
                number = float(native.scalar(value)) if value.is_cpu else next(host)
            else:
                number = float(value)
            self._writer.add_kpi(self._step, kpi, number, own_type[0] if own_type else type_id)
            if not own_type:  # what the flight recorder's triggers see: this step's own KPIs
                values[self.catalog.kpi_names[kpi]] = number
        return values

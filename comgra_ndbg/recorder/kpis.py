"""KPIs and notes: scalars recorded for every step, recorded or skipped, and free text (a mixin of
``Recorder``). KPI tensors are read at the end of the step, in one copy with everything else."""
from __future__ import annotations

import numpy as np
import torch

from comgra_ndbg.errors import InvalidArgumentError, InvalidTensorError, RecorderStateError
from comgra_ndbg.recorder.validation import check_name, check_text

__all__ = ["KpiRecording"]


class KpiRecording:
    """``record_kpi`` and ``add_note`` of ``Recorder``; not used on its own."""

    def record_kpi(self, name: str, value: float | torch.Tensor) -> None:
        """Record a scalar KPI (e.g. the loss) for the current step — or, between steps, the last one.

        KPIs are kept for every step, recorded or skipped by the policies. Tensors are read at the end of
        the step, in one copy with everything else, not with ``.item()``.
        """
        if not self.enabled:
            return
        self._check_open_recorder("record_kpi")
        check_name(name, "KPI names")
        if isinstance(value, torch.Tensor):
            if value.is_nested:
                raise InvalidTensorError(f"KPI {name!r} must be a scalar, got a nested tensor; reduce it first")
            if value.numel() != 1:
                raise InvalidTensorError(f"KPI {name!r} must be a scalar, got a tensor of shape "
                                         f"{tuple(value.shape)}; reduce it first (e.g. .mean())")
            if value.is_complex() or value.device.type == "meta" or value.layout != torch.strided:
                raise InvalidTensorError(f"KPI {name!r} must be a real number, got a {value.dtype} tensor on "
                                         f"{value.device} ({value.layout}); pass e.g. its .abs() or .real")
            value = value.detach().reshape(())
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
        if self._step_open:
            self._kpis.append((kpi, value))
        else:
            type_id = self.catalog.step_type_id(self._last_step_type)
            self._writer.add_kpi(self._last_step, kpi, float(value), type_id)

    def add_note(self, text: str) -> None:
        """Attach a free-text note to the current (or last) step, e.g. "lr lowered to 1e-4"."""
        if not self.enabled:
            return
        self._check_open_recorder("add_note")
        check_text("a note", text)
        self._writer.add_note(-1 if self._last_step is None else self._last_step, text)

    def _write_kpis(self, type_id: int) -> dict[str, float]:
        if not self._kpis:
            return {}
        # Device tensors are read in one copy; a CPU tensor is read directly (no device to wait for).
        tensors = [v for _, v in self._kpis if isinstance(v, torch.Tensor) and not v.is_cpu]
        host = iter(torch.stack([t.to(torch.float64) for t in tensors]).cpu().tolist()) if tensors else iter(())
        values = {}
        for kpi, value in self._kpis:
            if isinstance(value, torch.Tensor):
                number = float(value.item()) if value.is_cpu else next(host)
            else:
                number = float(value)
            self._writer.add_kpi(self._step, kpi, number, type_id)
            values[self.catalog.kpi_names[kpi]] = number
        return values

"""Evaluation passes: forward passes outside training, recorded as cheap summaries of their own step type.

``EvalRecording`` is a mixin of ``NeuralDbg`` and works on its state. A forward pass of the model without
gradients (``torch.no_grad()``, inference mode) or with the model in ``eval()`` mode is an evaluation pass.
It never opens or splits a training step. Instead, the outputs of the chosen modules (and of the model) are
reduced on their device into three mergeable sums per node — finite elements, Σ|x| and Σx² (two vector
norms) — summed over the consecutive evaluation passes of one evaluation run (a validation
loop), and read to the host in one copy when the run ends: at the next training pass, or at ``close()``.

Why not a step of its own: step numbers are unique in a trial and number the training steps, which
evaluation must not disturb. An evaluation run is filed instead as KPIs of step type :data:`EVAL` (or the
type the caller names, e.g. ``"validation"`` for the framework callbacks) at the training step it follows:

- ``eval/passes``: forward passes in the evaluation run;
- ``eval/<node>/nonfinite``: share of the node's output elements that were NaN or ±Inf;
- ``eval/<node>/abs_mean``: mean absolute value (NaN when an element was not finite);
- ``eval/<node>/rms``: root mean square (NaN when an element was not finite).

An error that only evaluation shows — a code path taken only in ``eval()`` mode that divides by an unset
temperature, BatchNorm running statistics that went non-finite — is then in the recording, and non-finite
evaluation outputs of a model whose weights are finite are reported as the loop invariant
``nonfinite_evaluation`` (with non-finite weights they are the training's failure, found there). An
evaluation run before the first training step (a sanity check) has no step to be filed at and is counted
only. Passes with gradients in ``eval()`` mode that an optimizer step follows were training in the wrong
mode (the invariant ``eval_mode_training``): their run is dropped, not filed as evaluation.

What it costs: three reductions per output tensor of an evaluation pass and one host copy per run; training
passes pay one attribute check. Nothing here changes a tensor, a flag or a random number generator, so
training computes bit-identically with and without it.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from comgra_ndbg.instrument.hooks import INPUT, call_node, node_name, output_names, tensor_leaves
from comgra_ndbg.instrument.loop_rules import Violation, names_text

__all__ = ["EVAL", "EvalRecording", "eval_kpis"]

EVAL = "eval"
"""The step type of evaluation runs recorded by ``NeuralDbg`` (``record_eval=True``)."""
PASSES = "eval/passes"


def eval_kpis(sums: dict[str, list[float]], passes: int) -> dict[str, float]:
    """The KPIs of one evaluation run from each node's ``[count, non-finite, Σ|x|, Σx²]`` (see the module
    docstring); a node without elements gets no KPI, and one with non-finite elements a NaN ``abs_mean`` and
    ``rms`` (its sums are not finite).

    >>> eval_kpis({"model.fc": [4.0, 0.0, 8.0, 16.0], "model.out": [4.0, 1.0, float("inf"), float("inf")]}, 2)
    ... # doctest: +NORMALIZE_WHITESPACE
    {'eval/passes': 2.0, 'eval/model.fc/nonfinite': 0.0, 'eval/model.fc/abs_mean': 2.0, 'eval/model.fc/rms': 2.0,
     'eval/model.out/nonfinite': 0.25, 'eval/model.out/abs_mean': nan, 'eval/model.out/rms': nan}
    """
    out = {PASSES: float(passes)}
    for node, (count, nonfinite, abs_sum, square_sum) in sums.items():
        if count <= 0:
            continue
        out[f"eval/{node}/nonfinite"] = nonfinite / count
        out[f"eval/{node}/abs_mean"] = abs_sum / count if not nonfinite else float("nan")
        out[f"eval/{node}/rms"] = math.sqrt(square_sum / count) if not nonfinite else float("nan")
    return out


def _sums(tensor: torch.Tensor) -> torch.Tensor:
    """``[finite count, Σ|x|, Σx²]`` of a floating tensor on its device, in float64 where the device has it:
    three reductions, no temporary copy of the tensor but the finiteness mask."""
    x = tensor.detach()
    dtype = torch.float32 if x.device.type == "mps" else torch.float64
    return torch.stack([torch.isfinite(x).sum().to(dtype), torch.linalg.vector_norm(x, 1, dtype=dtype),
                        torch.linalg.vector_norm(x, 2, dtype=dtype).square()])


class EvalRecording:
    """Evaluation-run recording of ``NeuralDbg`` (see the module docstring); not used on its own."""

    def _init_eval(self, enabled: bool, step_type: str) -> None:
        self._eval_on = enabled
        self.eval_step_type = step_type
        self._eval_capture = False  # the running pass is an evaluation pass whose outputs are reduced
        self._eval_sums: dict[str, torch.Tensor] = {}  # node -> [finite count, Σ|x|, Σx²] on its device
        self._eval_sizes: dict[str, int] = {}  # node -> elements summed
        self._eval_run_passes = 0
        self._eval_with_grad = False  # the run holds passes with gradients on (maybe training in eval mode)
        self._eval_counts: dict[str, int] = {}
        self._eval_filed = 0  # evaluation runs filed as KPIs
        self._eval_inputs_bad: torch.Tensor | None = None  # non-finite elements of the run's inputs, on their device

    @property
    def eval_runs(self) -> int:
        """Evaluation runs recorded so far (each filed at the training step it followed)."""
        return getattr(self, "_eval_filed", 0)

    def _eval_begin(self, args: tuple = (), kwargs: dict | None = None) -> None:
        """An evaluation pass starts: its module outputs go to :meth:`_eval_output` until it ends; its floating
        inputs' non-finite elements are counted (on their device), to tell data from the model's computation."""
        if not self._eval_on or self._pass_open:
            return
        if self._inv:
            with torch.no_grad():
                for _, tensor in tensor_leaves((args, kwargs or {})):
                    if tensor.is_floating_point() and tensor.numel():
                        bad = tensor.numel() - torch.isfinite(tensor).sum()
                        known = self._eval_inputs_bad
                        self._eval_inputs_bad = bad if known is None else known + bad.to(known.device)
        self._eval_run_passes += 1
        self._eval_with_grad |= torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
        self._eval_counts = {}
        self._eval_capture = True
        self._hooks.capture = True

    def _eval_output(self, path: str, output: Any) -> None:
        """A chosen module's output in an evaluation pass: add its sums to its node's."""
        leaves = [(s, t) for s, t in tensor_leaves(output) if t.is_floating_point() and t.numel()]
        if not leaves:
            return
        with torch.no_grad():
            for (name, tensor), (suffix, _) in zip(output_names(node_name(path), leaves, self._eval_counts), leaves):
                node = call_node(name, suffix)
                row = _sums(tensor)
                self._eval_sizes[node] = self._eval_sizes.get(node, 0) + tensor.numel()
                known = self._eval_sums.get(node)
                self._eval_sums[node] = row if known is None else known + row.to(known.device)

    def _eval_end(self, output: Any) -> None:
        """The evaluation pass ended: what compiled modules stashed, and the model's own output."""
        try:
            for path, stashed, _ in self._hooks.drain():
                self._eval_output(path, stashed)
            if not self._root_selected:
                self._eval_output("", output)
        finally:
            self._eval_capture = False
            self._hooks.capture = False

    def _eval_drop(self) -> None:
        """Forget the run: its passes with gradients were training steps in eval() mode."""
        self._eval_sums, self._eval_sizes, self._eval_run_passes, self._eval_with_grad = {}, {}, 0, False
        self._eval_inputs_bad = None

    def _eval_file(self) -> None:
        """End the evaluation run: file its KPIs at the open or last training step, one host copy."""
        if not self._eval_run_passes:
            return
        sums, sizes, passes = self._eval_sums, self._eval_sizes, self._eval_run_passes
        inputs_bad = self._eval_inputs_bad
        self._eval_drop()
        rec = self.recorder
        if rec._last_step is None:  # before the first training step: no step to file it at
            return
        read = {node: row.cpu().tolist() for node, row in sums.items()} if len(
            {row.device for row in sums.values()}) > 1 else _one_copy(sums)
        host = {node: [sizes[node], sizes[node] - finite, abs_sum, square_sum]
                for node, (finite, abs_sum, square_sum) in read.items()}
        kpis = eval_kpis(host, passes)
        for name, value in kpis.items():
            rec.record_kpi(name, value, step_type=self.eval_step_type)
        self._eval_filed += 1
        broken = [node for node, row in host.items() if row[1] > 0]
        if broken and self._inv and _finite(self._parameters):
            bad = int(inputs_bad.item()) if inputs_bad is not None else 0
            self._eval_nonfinite(rec._last_step, broken, host, bad)

    def _eval_nonfinite(self, step: int, broken: list[str], host: dict[str, list[float]], inputs_bad: int) -> None:
        first = broken[0]
        share = host[first][1] / host[first][0]
        evidence = {"nodes": broken[:20], "num_nodes": len(broken), "share": share, "step_type": self.eval_step_type,
                    "inputs_nonfinite": inputs_bad}
        if inputs_bad:
            evidence["outputs"] = evidence.pop("nodes")  # (the node at fault is the input)
            self._inv_report(Violation(
                "nonfinite_evaluation_data", step, INPUT,
                f"evaluation passes after step {step} were given inputs with {inputs_bad} non-finite element(s), and "
                f"their outputs are non-finite from '{first}' on: the evaluation data, not the model, holds NaN or "
                f"Inf", evidence=evidence))
            return
        self._inv_report(Violation(
            "nonfinite_evaluation", step, first,
            f"evaluation passes after step {step} produced non-finite outputs in {names_text(broken, 3)} "
            f"({share:.0%} of the elements of '{first}', the first in forward order): a computation taken only in "
            f"evaluation (a model.eval() branch, BatchNorm running statistics, an unset calibration constant) "
            f"breaks there", evidence=evidence))


def _finite(parameters: list[torch.Tensor]) -> bool:
    """Whether every trainable parameter is finite (one host read): non-finite evaluation outputs of a model
    with non-finite weights are the training's failure, which the analysis of the training steps names."""
    if not parameters:
        return True
    with torch.no_grad():
        return bool(torch.stack([torch.isfinite(p).all().to(parameters[0].device) for p in parameters]).all())


def _one_copy(sums: dict[str, torch.Tensor]) -> dict[str, list[float]]:
    """Every node's sums, read to the host in one copy (they share a device)."""
    if not sums:
        return {}
    stacked = torch.stack(list(sums.values())).cpu().tolist()
    return dict(zip(sums, stacked))


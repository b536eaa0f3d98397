"""One healthy loop, bare or under NeuralDbg, in this process: its losses, final state hash and (recorded)
analysis as a JSON file. ``python -m benchmarks.healthy_loops.harness CASE bare|dbg FOLDER OUT.json``."""
from __future__ import annotations

import contextlib
import hashlib
import json
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks.healthy_loops import REGISTRY


class Ctx:
    """What a case receives: ``ctx.dbg(model, optimizer=..., loss=..., trial=...)``, a context manager that
    records under NeuralDbg (``dbg`` mode) or does nothing (``bare``)."""

    def __init__(self, mode: str, folder: Path) -> None:
        self.mode, self.folder, self.trials = mode, folder, []

    def dbg(self, model: nn.Module, optimizer: Any = None, loss: Any = None, trial: str = "t") -> Any:
        if self.mode == "bare":
            return contextlib.nullcontext()
        from comgra_ndbg import NeuralDbg
        self.trials.append(trial)
        options = {k: v for k, v in (("optimizer", optimizer), ("loss", loss)) if v is not None}
        return NeuralDbg(model, path=self.folder, trial=trial, **options)


def state_hash(modules: list[nn.Module]) -> str:
    """A hash of every tensor of the modules' state dicts, bit for bit."""
    h = hashlib.sha256()
    for module in modules:
        for key, value in module.state_dict().items():
            h.update(key.encode())
            value = value.detach().cpu().contiguous().reshape(-1)
            raw = value if value.dtype == torch.bool else value.view(torch.uint8)
            h.update(raw.numpy().tobytes())
    return h.hexdigest()[:16]


def run_case(name: str, mode: str, folder: Path) -> dict:
    """Train case ``name`` (one torch thread, seed 0); with ``mode == "dbg"`` record it into ``folder`` and
    analyse every trial it recorded."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    ctx = Ctx(mode, folder)
    out: dict[str, Any] = {"case": name, "mode": mode, "exception": None, "warnings": [], "analysis": {}}
    start = time.time()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = REGISTRY[name](ctx)
            out.update(losses=[float(x) for x in result["losses"]], hash=state_hash(result["modules"]),
                       metric=result.get("metric"))
        except Exception:  # noqa: BLE001 - reported in the table
            out["exception"] = traceback.format_exc()
        if mode == "dbg" and out["exception"] is None:
            import comgra_ndbg
            for trial in ctx.trials:
                try:
                    diagnosis = comgra_ndbg.analyze(folder, trial=trial)
                    out["analysis"][trial] = {
                        "hypotheses": [{"type": h.type, "origin": h.origin, "node": h.node, "onset": h.onset,
                                        "confidence": float(h.confidence), "sentence": h.sentence}
                                       for h in diagnosis.hypotheses],
                        "notes": list(diagnosis.notes)}
                except Exception:  # noqa: BLE001 - reported in the table
                    out["analysis"][trial] = {"exception": traceback.format_exc()}
    out["warnings"] = [f"{w.category.__name__}: {w.message}" for w in caught
                       if "comgra_ndbg" in str(w.filename)]
    out["seconds"] = time.time() - start
    return out


if __name__ == "__main__":
    case_name, run_mode, run_folder, out_file = sys.argv[1:5]
    Path(out_file).write_text(json.dumps(run_case(case_name, run_mode, Path(run_folder)), default=str))

"""Framework callbacks' overhead: Lightning's ``Trainer.fit`` and Hugging Face's ``Trainer.train``, bare and
with ``ComgraCallback``, measured side by side.

The model is the 8-block 256-wide tanh MLP of ``benchmarks/overhead.py`` (batch 64, SGD), trained for
``--steps`` optimizer steps on the same data in each variant. Variants run interleaved in rounds, so
machine noise hits all of them alike. Two figures per variant, each in wall-clock time and in CPU time of
this process (steadier on a machine shared with other work), both as a ratio to the bare framework:

- *step*: the median time from one training batch's start to the next one's (a timing callback), which is
  what the callback adds to every step of a long run;
- *run*: the whole ``fit()`` / ``train()`` call, including the framework's start-up, the recorder's
  ``close()`` and, for "callback", the analysis at the end.

"callback" records with NeuralDbg's defaults (tiered, snapshots every 40th); "callback, no analysis"
passes ``analyze=False``. Run: ``python benchmarks/integrations_overhead.py [--steps 150] [--rounds 3]
[--threads 1]``.
"""
from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.overhead import BATCH, IN, MLP, OUT  # noqa: E402


class TanhMLP(MLP):
    """``benchmarks/overhead.py``'s MLP with a forward."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def _data(steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(steps * BATCH, IN, generator=g), torch.randint(0, OUT, (steps * BATCH,), generator=g)


# ---- Lightning ------------------------------------------------------------------------------------------
def lightning_run(steps: int, callback: object | None, folder: Path) -> tuple[Timed, Timed]:
    """One ``Trainer.fit`` of ``steps`` steps; returns (median step seconds, whole-run seconds)."""
    import lightning.pytorch as pl

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = TanhMLP()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.model(x)

        def training_step(self, batch: tuple, batch_idx: int) -> torch.Tensor:
            loss = nn.functional.cross_entropy(self(batch[0]), batch[1])
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class Timing(pl.Callback):
        def __init__(self) -> None:
            self.starts: list[tuple[float, float]] = []

        def on_train_batch_start(self, *args: object) -> None:
            self.starts.append(_now())

    torch.manual_seed(0)
    timing = Timing()
    x, y = _data(steps)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH)
    trainer = pl.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(folder),
                         callbacks=[timing] + ([callback] if callback is not None else []))
    started = _now()
    trainer.fit(Module(), loader)
    return _median_step(timing.starts), _since(started)


# ---- Hugging Face ---------------------------------------------------------------------------------------
def transformers_run(steps: int, callback: object | None, folder: Path) -> tuple[Timed, Timed]:
    """One ``Trainer.train`` of ``steps`` steps; returns (median step seconds, whole-run seconds)."""
    import transformers

    class Classifier(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = TanhMLP()

        def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict:
            logits = self.model(x)
            return {"logits": logits, "loss": nn.functional.cross_entropy(logits, labels)}

    class Timing(transformers.TrainerCallback):
        def __init__(self) -> None:
            self.starts: list[tuple[float, float]] = []

        def on_step_begin(self, *args: object, **kwargs: object) -> None:
            self.starts.append(_now())

    torch.manual_seed(0)
    timing = Timing()
    x, y = _data(steps)
    data = [{"x": x[i], "labels": y[i]} for i in range(len(x))]
    args = transformers.TrainingArguments(output_dir=str(folder), per_device_train_batch_size=BATCH, max_steps=steps,
                                          learning_rate=0.01, optim="sgd", logging_steps=10, save_strategy="no",
                                          report_to=[], use_cpu=True, disable_tqdm=True, dataloader_num_workers=0)
    trainer = transformers.Trainer(model=Classifier(), args=args, train_dataset=data,
                                   callbacks=[timing] + ([callback] if callback is not None else []))
    trainer.remove_callback(transformers.PrinterCallback)  # the logs printed to the terminal
    started = _now()
    trainer.train()
    return _median_step(timing.starts), _since(started)


# ---- the same loop without a framework ------------------------------------------------------------------
def plain_run(steps: int, dbg_options: dict | None, folder: Path) -> tuple[Timed, Timed]:
    """The loop written out, bare or inside ``NeuralDbg`` (what the callbacks drive); returns (median step
    seconds, whole-run seconds, with ``close()`` and, unless ``analyze=False``, the analysis)."""
    from comgra_ndbg import NeuralDbg, analyze

    torch.manual_seed(0)
    model = TanhMLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = _data(steps)
    starts = []
    started = _now()
    dbg = None
    if dbg_options is not None:
        options = dict(dbg_options)
        run_analysis = options.pop("analyze", True)
        dbg = NeuralDbg(model, folder / "runs", trial="plain", optimizer=optimizer, **options)
    for step in range(steps):
        starts.append(_now())
        batch = slice(step * BATCH, (step + 1) * BATCH)
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x[batch]), y[batch])
        loss.backward()
        optimizer.step()
    if dbg is not None:
        dbg.close()
        if run_analysis:
            analyze(dbg.path)
    return _median_step(starts), _since(started)


Timed = tuple[float, float]
"""(wall-clock seconds, CPU seconds of this process)."""


def _now() -> Timed:
    return time.perf_counter(), time.process_time()


def _since(started: Timed) -> Timed:
    now = _now()
    return now[0] - started[0], now[1] - started[1]


def _median_step(starts: list[Timed]) -> Timed:
    """Median wall-clock and CPU time between consecutive step starts, after 10 warm-up steps."""
    pairs = list(zip(starts, starts[1:]))[10:]
    return (statistics.median(b[0] - a[0] for a, b in pairs), statistics.median(b[1] - a[1] for a, b in pairs))


def _variants(framework: str) -> dict[str, Callable[[Path], object | None]]:
    if framework == "plain":
        return {"bare": lambda folder: None, "callback": lambda folder: {},
                "callback, no analysis": lambda folder: {"analyze": False}}
    if framework == "lightning":
        from comgra_ndbg.integrations.lightning import ComgraCallback
    else:
        from comgra_ndbg.integrations.transformers import ComgraCallback
    return {"bare": lambda folder: None,
            "callback": lambda folder: ComgraCallback(folder / "runs"),
            "callback, no analysis": lambda folder: ComgraCallback(folder / "runs", analyze=False)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--frameworks", nargs="+", default=["plain", "lightning", "transformers"],
                        choices=["plain", "lightning", "transformers"])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    for name in ("lightning", "lightning.pytorch", "pytorch_lightning", "transformers"):
        logging.getLogger(name).setLevel(logging.ERROR)
    runners = {"plain": plain_run, "lightning": lightning_run, "transformers": transformers_run}
    print(f"{args.steps} steps of an 8-block 256-wide tanh MLP, batch {BATCH}, {args.threads} torch thread(s), "
          f"{args.rounds} interleaved rounds; median over rounds, ratio to bare")
    for framework in args.frameworks:
        variants = _variants(framework)
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, make in variants.items():
                with tempfile.TemporaryDirectory() as folder:
                    results[name].append(runners[framework](args.steps, make(Path(folder)), Path(folder)))
        for name, measured in results.items():
            cells = []
            for what, index, unit, scale in (("step", 0, "ms", 1e3), ("run", 1, "s", 1.0)):
                for clock, label in ((0, "wall"), (1, "cpu")):
                    value = statistics.median(m[index][clock] for m in measured)
                    bare = statistics.median(m[index][clock] for m in results["bare"])
                    cells.append(f"{what} {label} {value * scale:7.2f} {unit} {value / bare:5.2f}x")
            label = "NeuralDbg" + name[len("callback"):] if framework == "plain" and name != "bare" else name
            print(f"{framework:12s} {label:22s} " + "  ".join(cells))

if __name__ == "__main__":
    main()

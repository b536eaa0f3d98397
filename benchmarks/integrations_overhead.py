"""Framework callbacks' overhead: Lightning's ``Trainer.fit`` and Hugging Face's ``Trainer.train``, bare and
with ``ComgraCallback``, measured side by side.

The model is the 8-block 256-wide tanh MLP of ``benchmarks/overhead.py`` (batch 64, SGD), trained for
``--steps`` optimizer steps on the same data in each variant. Variants run interleaved in rounds, so
machine noise hits all of them alike. Two figures per variant, both as a ratio to the bare framework:

- *step*: the median time from one training batch's start to the next one's (a timing callback), which is
  what the callback adds to every step of a long run;
- *run*: the whole ``fit()`` / ``train()`` call, including the framework's start-up, the recorder's
  ``close()`` and, for "callback", the analysis at the end.

"callback" records summaries every step and snapshots every 10th (the defaults); "callback, no analysis"
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
def lightning_run(steps: int, callback: object | None, folder: Path) -> tuple[float, float]:
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
            self.starts: list[float] = []

        def on_train_batch_start(self, *args: object) -> None:
            self.starts.append(time.perf_counter())

    torch.manual_seed(0)
    timing = Timing()
    x, y = _data(steps)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH)
    trainer = pl.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(folder),
                         callbacks=[timing] + ([callback] if callback is not None else []))
    started = time.perf_counter()
    trainer.fit(Module(), loader)
    return _median_step(timing.starts), time.perf_counter() - started


# ---- Hugging Face ---------------------------------------------------------------------------------------
def transformers_run(steps: int, callback: object | None, folder: Path) -> tuple[float, float]:
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
            self.starts: list[float] = []

        def on_step_begin(self, *args: object, **kwargs: object) -> None:
            self.starts.append(time.perf_counter())

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
    started = time.perf_counter()
    trainer.train()
    return _median_step(timing.starts), time.perf_counter() - started


# ---- the same loop without a framework ------------------------------------------------------------------
def plain_run(steps: int, dbg_options: dict | None, folder: Path) -> tuple[float, float]:
    """The loop written out, bare or inside ``NeuralDbg`` (what the callbacks drive); returns (median step
    seconds, whole-run seconds, with ``close()`` and, unless ``analyze=False``, the analysis)."""
    from comgra_ndbg import NeuralDbg, analyze

    torch.manual_seed(0)
    model = TanhMLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = _data(steps)
    starts = []
    started = time.perf_counter()
    dbg = None
    if dbg_options is not None:
        options = dict(dbg_options)
        run_analysis = options.pop("analyze", True)
        dbg = NeuralDbg(model, folder / "runs", trial="plain", optimizer=optimizer, **options)
    for step in range(steps):
        starts.append(time.perf_counter())
        batch = slice(step * BATCH, (step + 1) * BATCH)
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x[batch]), y[batch])
        loss.backward()
        optimizer.step()
    if dbg is not None:
        dbg.close()
        if run_analysis:
            analyze(dbg.path)
    return _median_step(starts), time.perf_counter() - started


def _median_step(starts: list[float]) -> float:
    gaps = [b - a for a, b in zip(starts, starts[1:])][10:]  # after 10 warm-up steps
    return statistics.median(gaps)


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
        bare_step = statistics.median(s for s, _ in results["bare"])
        bare_run = statistics.median(r for _, r in results["bare"])
        for name, measured in results.items():
            step = statistics.median(s for s, _ in measured)
            run = statistics.median(r for _, r in measured)
            label = "NeuralDbg" + name[len("callback"):] if framework == "plain" and name != "bare" else name
            print(f"{framework:12s} {label:22s} step {step * 1e3:7.2f} ms  {step / bare_step:5.2f}x   "
                  f"run {run:6.2f} s  {run / bare_run:5.2f}x")


if __name__ == "__main__":
    main()

"""Recording overhead on a CUDA GPU: bare training vs the Recorder vs NeuralDbg, side by side in one run.

Workloads (``benchmarks/gpu_models.py``): the 8-block tanh MLP at three sizes (width 256 / batch 64, the CPU
benchmark's model; 2048 / 512; 4096 / 1024), Adam; and a GPT-2-small-shaped decoder (12 layers, d_model 768,
12 heads, sequences of 512, batch 8, bf16 autocast, AdamW), eager and with every block ``torch.compile``d.
The Recorder variant registers the input (the embedding), every block's output, the logits and the loss
and tracks every parameter; NeuralDbg wraps the same loop calling ``model(x)`` (every leaf module's output);
both take summaries every step and snapshots every 10th, and "defaults" is ``NeuralDbg(model)`` as it comes.

Times are per step over the steps after the warm-up, synchronised with the GPU only at both ends; the
printed ratio is the median over ``--rounds`` rounds against bare, the variants of one workload run
interleaved in each round. "peak +%" is the peak of allocated GPU memory over bare's peak.

Run: ``python benchmarks/gpu_overhead.py [--steps 60] [--rounds 3] [--models mlp,gpt2,gpt2c]``.
"""
from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.gpu_models import Workload, gpt2, mlp  # noqa: E402
from comgra_ndbg import NeuralDbg, Recorder  # noqa: E402
from comgra_ndbg.errors import RecorderWarning  # noqa: E402

SIZES = ((256, 64), (2048, 512), (4096, 1024))
MODES = ("bare", "recorder", "neuraldbg", "defaults")


def run(workload: Workload, mode: str, steps: int, warmup: int, folder: str) -> tuple[float, int]:
    """Seconds per step of ``mode`` after ``warmup`` steps, and the peak of allocated GPU memory."""
    model, optimizer = workload.model, workload.optimizer
    rec = dbg = None
    name = f"{mode}-{workload.name.replace(' ', '_').replace('/', '_')}-{time.time_ns()}"
    if mode == "recorder":
        rec = Recorder(folder, name, summaries=1, snapshots=10)
        rec.track_module("model", model)
    elif mode == "neuraldbg":
        dbg = NeuralDbg(model, folder, trial=name, optimizer=optimizer, summaries=1, snapshots=10, detail="full")
    elif mode == "defaults":
        dbg = NeuralDbg(model, folder, trial=name, optimizer=optimizer)
    data = [workload.batch(i) for i in range(steps)]
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    for step, (x, y) in enumerate(data):
        if step == warmup:
            torch.cuda.synchronize()
            started = time.perf_counter()
        if rec is not None:
            rec.start_step(step)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=workload.autocast):
            loss = workload.loss(model, x, y, rec)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if rec is not None:
            rec.record_gradients()
        optimizer.step()
        if rec is not None:
            rec.record_kpi("loss", loss)
            rec.finish_step()
    torch.cuda.synchronize()
    per_step = (time.perf_counter() - started) / (steps - warmup)
    for closing in (rec, dbg):
        if closing is not None:
            closing.close()
    return per_step, torch.cuda.max_memory_allocated()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=70)
    parser.add_argument("--warmup", type=int, default=40, help="NeuralDbg's defaults measure the first 32 in full")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", default="mlp,gpt2,gpt2c", help="mlp, gpt2 (eager), gpt2c (compiled blocks)")
    parser.add_argument("--modes", default=",".join(MODES))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_overhead: no CUDA device here; nothing measured")
        return
    torch.backends.cuda.matmul.allow_tf32 = True
    modes = args.modes.split(",")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.steps} steps ({args.warmup} warm-up) x "
          f"{args.rounds} rounds, median time per step")
    makers = []
    for model in args.models.split(","):
        if model == "mlp":
            makers += [lambda w=w, b=b: mlp(w, b) for w, b in SIZES]
        elif model == "gpt2":
            makers.append(lambda: gpt2())
        elif model == "gpt2c":
            makers.append(lambda: gpt2(compiled=True))
    with tempfile.TemporaryDirectory() as folder:
        for make in makers:
            times: dict[str, list[float]] = {mode: [] for mode in modes}
            peaks: dict[str, int] = {}
            label = ""
            problems: dict[str, int] = {}
            for round_ in range(args.rounds):
                order = modes[round_ % len(modes):] + modes[:round_ % len(modes)]
                for mode in order:
                    gc.collect()
                    torch.cuda.empty_cache()
                    workload = make()
                    label = workload.name
                    with warnings.catch_warnings(record=True) as caught:
                        warnings.simplefilter("always", RecorderWarning)
                        seconds, peak = run(workload, mode, args.steps, args.warmup, folder)
                    problems[mode] = problems.get(mode, 0) + sum(issubclass(w.category, RecorderWarning)
                                                                 for w in caught)
                    times[mode].append(seconds)
                    peaks[mode] = max(peaks.get(mode, 0), peak)
                    del workload
                    torch.cuda.empty_cache()
            bare = statistics.median(times["bare"]) if "bare" in times else float("nan")
            print(f"  {label}:", flush=True)
            for mode, values in times.items():
                ratios = [v / b for v, b in zip(values, times.get("bare", values))]
                print(f"    {mode:<10} {statistics.median(values) * 1e3:8.3f} ms  "
                      f"{statistics.median(values) / bare:5.2f}x (rounds {min(ratios):.2f}-{max(ratios):.2f})  "
                      f"peak {peaks[mode] / 2**20:8.0f} MiB ({(peaks[mode] / peaks['bare'] - 1) * 100:+5.1f}%)"
                      + (f"  {problems[mode]} recorder warnings" if problems.get(mode) else ""), flush=True)


if __name__ == "__main__":
    main()

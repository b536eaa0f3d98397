"""Recording overhead on a CUDA GPU: bare training vs the Recorder vs NeuralDbg, side by side in one run.

Models: 8 blocks of Linear(width, width) + tanh between a 32-wide input and 10 classes, Adam, at three
sizes (width 256 / batch 64, the CPU benchmark's model; 2048 / 512; 4096 / 1024). The Recorder variant
registers the input, every block's output and the loss and tracks every parameter; NeuralDbg wraps the same
loop calling ``model(x)``; both take summaries every step and snapshots every 10th. Times are per step over
the last ``--steps - 20`` steps, synchronised with the GPU only at both ends (a recorded step copies its
statistics to the host once, which the bare loop never waits for); the printed ratio is the median over
``--rounds`` rounds against bare. Without CUDA it says so and exits.

Run: ``python benchmarks/gpu_overhead.py [--steps 200] [--rounds 3]``.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
from torch import nn

from comgra_ndbg import NeuralDbg, Recorder

SIZES = ((256, 64), (2048, 512), (4096, 1024))
DEPTH, IN, OUT = 8, 32, 10


def make_model(width: int) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Linear(IN, width)]
    for _ in range(DEPTH):
        layers += [nn.Linear(width, width), nn.Tanh()]
    return nn.Sequential(*layers, nn.Linear(width, OUT))


def run(width: int, batch: int, mode: str, steps: int, folder: str) -> float:
    """Seconds per step of ``mode`` (bare, recorder or neuraldbg) after 20 warm-up steps."""
    device = "cuda"
    torch.manual_seed(0)
    model = make_model(width).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = [(torch.randn(batch, IN, device=device), torch.randint(0, OUT, (batch,), device=device))
            for _ in range(steps)]
    rec = dbg = None
    if mode == "recorder":
        rec = Recorder(folder, f"rec-{width}-{time.time_ns()}", summaries=1, snapshots=10)
        rec.track_module("model", model)
    elif mode == "neuraldbg":
        dbg = NeuralDbg(model, folder, trial=f"ndbg-{width}-{time.time_ns()}", optimizer=optimizer, summaries=1,
                        snapshots=10)
    torch.cuda.synchronize()
    started = time.perf_counter()
    for step, (x, y) in enumerate(data):
        if step == 20:
            torch.cuda.synchronize()
            started = time.perf_counter()
        if rec is not None:
            rec.start_step(step)
            rec.register_tensor("input", x, role="input")
        if rec is None:
            out = model(x)
        else:
            out = x
            for i, layer in enumerate(model):
                out = layer(out)
                if isinstance(layer, nn.Tanh):
                    rec.register_tensor(f"block{i}", out)
        loss = nn.functional.cross_entropy(out, y)
        if rec is not None:
            rec.register_tensor("loss", loss, role="loss")
        optimizer.zero_grad()
        loss.backward()
        if rec is not None:
            rec.record_gradients()
        optimizer.step()
        if rec is not None:
            rec.record_kpi("loss", loss)
            rec.finish_step()
    torch.cuda.synchronize()
    per_step = (time.perf_counter() - started) / (steps - 20)
    for closing in (rec, dbg):
        if closing is not None:
            closing.close()
    return per_step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_overhead: no CUDA device here; nothing measured")
        return
    torch.backends.cuda.matmul.allow_tf32 = False
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.steps} steps x {args.rounds} rounds, "
          f"median time per step")
    with tempfile.TemporaryDirectory() as folder:
        for width, batch in SIZES:
            times: dict[str, list[float]] = {"bare": [], "recorder": [], "neuraldbg": []}
            for _ in range(args.rounds):
                for mode in times:
                    times[mode].append(run(width, batch, mode, args.steps, folder))
            bare = statistics.median(times["bare"])
            print(f"  width {width:>4}, batch {batch:>4}: " + ", ".join(
                f"{mode} {statistics.median(v) * 1e3:7.3f} ms ({statistics.median(v) / bare:4.2f}x)"
                for mode, v in times.items()))


if __name__ == "__main__":
    main()

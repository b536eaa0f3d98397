"""Tutorial 2: wrap an unchanged training loop with NeuralDbg and ask why it failed.

NeuralDbg instruments the model with hooks: every training step is recorded (each module's output, every
parameter with its gradient and update, the loss) without a single line of the loop changing.

The bug: a deep stack of sigmoids. Each sigmoid scales the gradient by at most 1/4, so after six of them
the first layers receive almost no gradient and the network barely learns.

    python tutorials/02_neuraldbg_unchanged_loop.py --steps 100 --path runs/tutorial-02
"""
import argparse
import os
import time

import torch
from torch import nn

from comgra_ndbg import NeuralDbg

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--steps", type=int, default=int(os.environ.get("TUTORIAL_STEPS", 100)))
parser.add_argument("--path", default=time.strftime("runs/tutorial-02-%Y%m%d-%H%M%S"))
args = parser.parse_args()
torch.set_num_threads(1)  # tiny layers: one thread is fastest
torch.manual_seed(0)

layers = [nn.Linear(16, 32), nn.Sigmoid()]
for _ in range(5):
    layers += [nn.Linear(32, 32), nn.Sigmoid()]  # the bug: sigmoids all the way down (nn.ReLU() fixes it)
model = nn.Sequential(*layers, nn.Linear(32, 4))
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
centers = torch.randn(4, 16) * 2

# optimizer= marks exact step boundaries; the tensor backward() is called on is the loss (node and KPI).
with NeuralDbg(model, args.path, trial="sigmoids", optimizer=optimizer) as dbg:
    for step in range(args.steps):  # the loop itself is exactly what it was without NeuralDbg
        y = torch.randint(0, 4, (32,))
        x = centers[y] + torch.randn(32, 16)
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
    print(f"last loss {loss.item():.3f} after {dbg.steps} steps (guessing one of four classes: 1.386)")

    # Ranked explanations, one sentence each, best first.
    print(dbg.explain_failure())
    hypotheses = dbg.get_causal_hypotheses()
    if hypotheses:
        top = hypotheses[0]
        print(f"top hypothesis: type {top.type!r}, origin {top.origin!r}, node {top.node!r}, "
              f"step {top.onset}, confidence {top.confidence:.2f}")
        # The events that follow from it, in order: where the fault spread.
        chain = dbg.trace_causal_chain(top.type)
        for event in chain.events:
            print(f"  step {event.onset}: {event.family} {event.to_state} in {event.node!r} ({event.kind})")
print(f"\nBrowse it: comgra-ndbg gui {args.path}   or   comgra-ndbg explain {args.path}")

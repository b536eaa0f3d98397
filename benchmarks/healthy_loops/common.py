"""The registry of healthy loops, and the data, model and loop they share.

A case is ``case(ctx) -> {"losses": [...], "modules": [...], "metric": ...}``: it builds its model and data
(synthetic, made in-process), trains under ``ctx.dbg(model, optimizer=..., loss=..., trial=...)`` (NeuralDbg
at its defaults, or nothing for the bare run) and returns the per-step losses and the modules whose final
state must equal the bare run's.
"""
import math

import torch
from torch import nn

REGISTRY = {}


def case(fn):
    REGISTRY[fn.__name__] = fn
    return fn


# ---------------------------------------------------------------- data
def cls_data(n=2048, d=16, k=4, seed=1):
    # the labelling teacher is the same for every seed; seed only draws the samples
    gt = torch.Generator().manual_seed(1000)
    t = nn.Sequential(nn.Linear(d, 32), nn.Tanh(), nn.Linear(32, k))
    with torch.no_grad():
        for p in t.parameters():
            p.copy_(torch.randn(p.shape, generator=gt) * (1.5 / math.sqrt(p.shape[-1])))
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    with torch.no_grad():
        y = t(x).argmax(1)
    return x, y


def reg_data(n=2048, d=8, o=2, seed=2):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, o, generator=g)
    y = torch.sin(x @ w) + 0.05 * torch.randn(n, o, generator=g)
    return x, y


def batches(x, *ys, bs=64, seed=3):
    g = torch.Generator().manual_seed(seed)
    n = x.shape[0]
    while True:
        perm = torch.randperm(n, generator=g)
        for i in range(0, n - bs + 1, bs):
            idx = perm[i:i + bs]
            yield (x[idx],) + tuple(y[idx] for y in ys)


def mlp(d=16, h=64, k=4, act=nn.ReLU):
    return nn.Sequential(nn.Linear(d, h), act(), nn.Linear(h, h), act(), nn.Linear(h, k))


def std_cls_loop(ctx, model, opt, steps=400, sched=None, loss=None, bs=64, clip=None):
    x, y = cls_data()
    it = batches(x, y, bs=bs)
    crit = loss or nn.CrossEntropyLoss()
    losses = []
    with ctx.dbg(model, optimizer=opt):
        for step in range(steps):
            xb, yb = next(it)
            opt.zero_grad()
            l = crit(model(xb), yb)
            l.backward()
            if clip:
                clip(model)
            opt.step()
            if sched is not None:
                sched.step()
            losses.append(l.item())
    return {"losses": losses, "modules": [model]}



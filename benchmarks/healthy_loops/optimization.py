"""Healthy loops: learning-rate schedules, optimizers, gradient clipping and accumulation, bf16 autocast,
activation checkpointing."""
import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.healthy_loops.common import batches, case, cls_data, mlp, reg_data, std_cls_loop


# ---------------------------------------------------------------- schedulers
@case
def onecycle(ctx):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.3, total_steps=400)
    return std_cls_loop(ctx, model, opt, 400, sched)


@case
def cosine_warm_restarts(ctx):
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=100, T_mult=1, eta_min=1e-5)
    return std_cls_loop(ctx, model, opt, 400, sched)


@case
def reduce_on_plateau(ctx):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.3, patience=1)
    x, y = cls_data()
    xv, yv = cls_data(512, seed=11)
    it = batches(x, y)
    losses = []
    with ctx.dbg(model, optimizer=opt):
        for step in range(500):
            model.train()
            xb, yb = next(it)
            opt.zero_grad()
            l = F.cross_entropy(model(xb), yb)
            l.backward()
            opt.step()
            losses.append(l.item())
            if step % 25 == 24:
                model.eval()
                with torch.no_grad():
                    vl = F.cross_entropy(model(xv), yv).item()
                sched.step(vl)
    return {"losses": losses, "modules": [model], "metric": opt.param_groups[0]["lr"]}


@case
def lambda_warmup(ctx):
    # HF-style linear warmup from 0 then linear decay
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    warm, total = 60, 450
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: s / warm if s < warm else max(0.0, (total - s) / (total - warm)))
    return std_cls_loop(ctx, model, opt, total, sched)


@case
def sequential_warmup_cosine(ctx):
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    s1 = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.01, total_iters=50)
    s2 = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=350, eta_min=0.0)
    sched = torch.optim.lr_scheduler.SequentialLR(opt, [s1, s2], milestones=[50])
    return std_cls_loop(ctx, model, opt, 400, sched)


@case
def steplr_epochs(ctx):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.3)
    ds = torch.utils.data.TensorDataset(*cls_data(1024))
    dl = torch.utils.data.DataLoader(ds, batch_size=32, shuffle=True,
                                     generator=torch.Generator().manual_seed(5))
    losses = []
    with ctx.dbg(model, optimizer=opt):
        for epoch in range(12):       # 32 batches/epoch -> 384 steps
            model.train()
            for xb, yb in dl:
                opt.zero_grad()
                l = F.cross_entropy(model(xb), yb)
                l.backward()
                opt.step()
                losses.append(l.item())
            sched.step()
    return {"losses": losses, "modules": [model]}


# ---------------------------------------------------------------- optimizers
@case
def sgd_nesterov(ctx):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4)
    return std_cls_loop(ctx, model, opt, 400)


@case
def rmsprop(ctx):
    model = mlp()
    opt = torch.optim.RMSprop(model.parameters(), lr=1e-3)
    return std_cls_loop(ctx, model, opt, 400)


@case
def adagrad(ctx):
    model = mlp()
    opt = torch.optim.Adagrad(model.parameters(), lr=0.05)
    return std_cls_loop(ctx, model, opt, 400)


@case
def lbfgs_closure(ctx):
    x, y = reg_data(512)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 2))
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4, history_size=10,
                            line_search_fn="strong_wolfe")
    losses = []
    with ctx.dbg(model, optimizer=opt):
        for step in range(300):
            def closure():
                opt.zero_grad()
                l = F.mse_loss(model(x), y)
                l.backward()
                return l
            l = opt.step(closure)
            losses.append(l.item())
    return {"losses": losses, "modules": [model]}


@case
def sgd_zero_grad_inplace(ctx):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    x, y = cls_data()
    it = batches(x, y)
    losses = []
    with ctx.dbg(model, optimizer=opt):
        for step in range(400):
            xb, yb = next(it)
            opt.zero_grad(set_to_none=False)
            l = F.cross_entropy(model(xb), yb)
            l.backward()
            opt.step()
            losses.append(l.item())
    return {"losses": losses, "modules": [model]}


@case
def sparse_embedding_sparseadam(ctx):
    V, D = 500, 16
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, V, (4096, 6), generator=g)
    wtrue = torch.randn(V, generator=g)
    y = (wtrue[tokens].sum(1) > 0).long()

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(V, D, sparse=True)
            self.head = nn.Linear(D, 2)

        def forward(self, t):
            return self.head(self.emb(t).mean(1))

    model = M()
    opt_s = torch.optim.SparseAdam(list(model.emb.parameters()), lr=1e-2)
    opt_d = torch.optim.Adam(model.head.parameters(), lr=1e-2)
    it = batches(tokens, y, bs=64)
    losses = []
    with ctx.dbg(model):
        for step in range(500):
            tb, yb = next(it)
            opt_s.zero_grad(); opt_d.zero_grad()
            l = F.cross_entropy(model(tb), yb)
            l.backward()
            opt_s.step(); opt_d.step()
            losses.append(l.item())
    return {"losses": losses, "modules": [model]}


# ---------------------------------------------------------------- gradient manipulation
@case
def clip_value(ctx):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return std_cls_loop(ctx, model, opt, 400,
                        clip=lambda m: torch.nn.utils.clip_grad_value_(m.parameters(), 0.05))


@case
def clip_norm(ctx):
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    return std_cls_loop(ctx, model, opt, 400,
                        clip=lambda m: torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5))


@case
def grad_accumulation(ctx):
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    x, y = cls_data()
    it = batches(x, y, bs=16)
    k = 4
    losses = []
    with ctx.dbg(model, optimizer=opt):
        for step in range(300):
            opt.zero_grad()
            tot = 0.0
            for micro in range(k):
                xb, yb = next(it)
                l = F.cross_entropy(model(xb), yb) / k
                l.backward()
                tot += l.item()
            opt.step()
            losses.append(tot)
    return {"losses": losses, "modules": [model]}


# ---------------------------------------------------------------- precision / memory
@case
def bf16_autocast(ctx):
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    x, y = cls_data()
    it = batches(x, y)
    losses = []
    with ctx.dbg(model, optimizer=opt):
        for step in range(400):
            xb, yb = next(it)
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = model(xb)
                l = F.cross_entropy(out, yb)
            l.backward()
            opt.step()
            losses.append(l.item())
    return {"losses": losses, "modules": [model]}


class CkptNet(nn.Module):
    def __init__(self, reentrant):
        super().__init__()
        self.inp = nn.Linear(16, 64)
        self.blocks = nn.ModuleList([nn.Sequential(nn.LayerNorm(64), nn.Linear(64, 64), nn.GELU())
                                     for _ in range(3)])
        self.out = nn.Linear(64, 4)
        self.reentrant = reentrant

    def forward(self, x):
        h = self.inp(x)
        for b in self.blocks:
            h = h + torch.utils.checkpoint.checkpoint(b, h, use_reentrant=self.reentrant)
        return self.out(h)


@case
def checkpoint_nonreentrant(ctx):
    model = CkptNet(False)
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    return std_cls_loop(ctx, model, opt, 400)


@case
def checkpoint_reentrant(ctx):
    model = CkptNet(True)
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    return std_cls_loop(ctx, model, opt, 400)



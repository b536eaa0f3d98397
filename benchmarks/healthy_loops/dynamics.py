"""Healthy loops: training dynamics that look alarming and are not (a curriculum, a delayed drop, tiny
batches, memorisation, an optimizer switch) and loop shapes (a loss returned by the model, SAM, a cell loop,
two backward calls, a target network, freezing by learning rate 0, weight clipping)."""
import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.healthy_loops.common import batches, case, cls_data, mlp, std_cls_loop
from benchmarks.healthy_loops.losses import TwoHead


# ---------------------------------------------------------------- training dynamics
@case
def curriculum_easy_then_hard(ctx):
    g = torch.Generator().manual_seed(33)
    n = 4096
    x = torch.randn(n, 16, generator=g)
    w = torch.randn(16, generator=g)
    margin = (x @ w) / w.norm()
    y = (margin > 0).long()
    easy = margin.abs() > 0.8
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    it_easy = batches(x[easy], y[easy], seed=34)
    it_all = batches(x, y, seed=35)
    losses = []
    with ctx.dbg(model, optimizer=opt):
        for step in range(500):
            xb, yb = next(it_easy) if step < 200 else next(it_all)
            opt.zero_grad()
            l = F.cross_entropy(model(xb), yb)
            l.backward()
            opt.step()
            losses.append(l.item())
    return {"losses": losses, "modules": [model]}


@case
def delayed_learning_plateau(ctx):
    # deep linear network from small init: long plateau at a saddle, then a sharp drop
    g = torch.Generator().manual_seed(36)
    x = torch.randn(1024, 8, generator=g)
    W = torch.randn(8, 8, generator=g) / math.sqrt(8)
    y = x @ W
    model = nn.Sequential(nn.Linear(8, 16, bias=False), nn.Linear(16, 16, bias=False), nn.Linear(16, 8, bias=False))
    with torch.no_grad():
        for m in model:
            m.weight.mul_(0.05)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    it = batches(x, y)
    losses = []
    with ctx.dbg(model, optimizer=opt):
        for step in range(500):
            xb, yb = next(it)
            opt.zero_grad()
            l = F.mse_loss(model(xb), yb)
            l.backward()
            opt.step()
            losses.append(l.item())
    return {"losses": losses, "modules": [model]}


@case
def tiny_batches_noisy(ctx):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    return std_cls_loop(ctx, model, opt, 600, bs=2)


@case
def perfect_fit_memorize(ctx):
    g = torch.Generator().manual_seed(37)
    x = torch.randn(32, 16, generator=g)
    y = torch.randint(0, 4, (32,), generator=g)
    model = mlp(h=128)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    with ctx.dbg(model, optimizer=opt):
        for step in range(500):
            opt.zero_grad()
            l = F.cross_entropy(model(x), y)
            l.backward()
            opt.step()
            losses.append(l.item())
    return {"losses": losses, "modules": [model]}


@case
def dataloader_epochs_eval_acc(ctx):
    # the canonical "epoch loop": DataLoader, train then evaluate each epoch, no optimizer= passed
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, 4))
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    crit = nn.CrossEntropyLoss()
    x, y = cls_data(1536)
    tr = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[:1024], y[:1024]), batch_size=32,
                                     shuffle=True, generator=torch.Generator().manual_seed(38))
    va = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[1024:], y[1024:]), batch_size=128)
    losses, accs = [], []
    with ctx.dbg(model):
        for epoch in range(12):
            model.train()
            for xb, yb in tr:
                opt.zero_grad()
                l = crit(model(xb), yb)
                l.backward()
                opt.step()
                losses.append(l.item())
            model.eval()
            correct = 0
            with torch.no_grad():
                for xb, yb in va:
                    correct += (model(xb).argmax(1) == yb).sum().item()
            accs.append(correct / 512)
    return {"losses": losses, "modules": [model], "metric": accs}


@case
def optimizer_switch_adam_to_sgd(ctx):
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    x, y = cls_data()
    it = batches(x, y)
    losses = []
    with ctx.dbg(model):
        for step in range(400):
            if step == 250:
                opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
            xb, yb = next(it)
            opt.zero_grad()
            l = F.cross_entropy(model(xb), yb)
            l.backward()
            opt.step()
            losses.append(l.item())
    return {"losses": losses, "modules": [model]}


@case
def residual_mlp_sigmoid_gates(ctx):
    # GLU-style gated MLP with sigmoid gates (many gates legitimately near 0/1)
    class Gated(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = nn.Linear(16, 64)
            self.val = nn.Linear(64, 64)
            self.gate = nn.Linear(64, 64)
            self.sig = nn.Sigmoid()
            self.out = nn.Linear(64, 4)

        def forward(self, x):
            h = self.inp(x)
            h = h + self.val(h) * self.sig(self.gate(h))
            return self.out(h)

    model = Gated()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    return std_cls_loop(ctx, model, opt, 400)


# ---------------------------------------------------------------- extra loop shapes
@case
def val_no_grad_without_eval(ctx):
    # plain MLP (no dropout / BN): validation under no_grad in train() mode is harmless
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    x, y = cls_data()
    xv, yv = cls_data(512, seed=11)
    it = batches(x, y)
    losses, vls = [], []
    with ctx.dbg(model, optimizer=opt):
        for step in range(400):
            xb, yb = next(it)
            opt.zero_grad()
            l = F.cross_entropy(model(xb), yb)
            l.backward()
            opt.step()
            losses.append(l.item())
            if step % 20 == 19:
                with torch.no_grad():
                    vls.append(F.cross_entropy(model(xv), yv).item())
    return {"losses": losses, "modules": [model], "metric": vls[::4]}


class HFStyle(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU())
        self.cls = nn.Linear(64, 4)

    def forward(self, x, labels=None):
        logits = self.cls(self.body(x))
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = F.cross_entropy(logits, labels)
        return out


@case
def model_returns_loss_dict(ctx):
    model = HFStyle()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    x, y = cls_data()
    it = batches(x, y)
    losses = []
    with ctx.dbg(model, optimizer=opt):
        for step in range(400):
            xb, yb = next(it)
            out = model(xb, labels=yb)
            out["loss"].backward()
            opt.step()
            opt.zero_grad()
            losses.append(out["loss"].item())
    return {"losses": losses, "modules": [model]}


@case
def sam_optimizer(ctx):
    model = mlp()
    base = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    rho = 0.05
    x, y = cls_data()
    it = batches(x, y)
    losses = []
    with ctx.dbg(model, optimizer=base):
        for step in range(400):
            xb, yb = next(it)
            l = F.cross_entropy(model(xb), yb)
            l.backward()
            with torch.no_grad():
                gn = torch.norm(torch.stack([p.grad.norm() for p in model.parameters()]))
                eps = []
                for p in model.parameters():
                    e = p.grad * (rho / (gn + 1e-12))
                    p.add_(e)
                    eps.append(e)
            base.zero_grad()
            F.cross_entropy(model(xb), yb).backward()
            with torch.no_grad():
                for p, e in zip(model.parameters(), eps):
                    p.sub_(e)
            base.step()
            base.zero_grad()
            losses.append(l.item())
    return {"losses": losses, "modules": [model]}


class CellRNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = nn.GRUCell(2, 32)
        self.out = nn.Linear(32, 1)

    def forward(self, x):
        h = torch.zeros(x.shape[0], 32)
        for t in range(x.shape[1]):
            h = self.cell(x[:, t], h)
        return self.out(h)


@case
def grucell_loop(ctx):
    g = torch.Generator().manual_seed(40)
    N, T = 2048, 10
    x = torch.randn(N, T, 2, generator=g)
    y = (x[:, :, 0] * torch.linspace(0.2, 1, T)).sum(1, keepdim=True) * 0.3
    model = CellRNN()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    it = batches(x, y)
    losses = []
    with ctx.dbg(model, optimizer=opt):
        for step in range(400):
            xb, yb = next(it)
            opt.zero_grad()
            l = F.mse_loss(model(xb), yb)
            l.backward()
            opt.step()
            losses.append(l.item())
    return {"losses": losses, "modules": [model]}


@case
def zero_init_last_layer(ctx):
    model = mlp()
    nn.init.zeros_(model[4].weight)
    nn.init.zeros_(model[4].bias)
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    return std_cls_loop(ctx, model, opt, 400)


@case
def gaussian_nll_negative_loss(ctx):
    # heteroscedastic regression: loss goes from positive to negative, healthy
    class MV(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh())
            self.mu = nn.Linear(64, 1)
            self.logvar = nn.Linear(64, 1)

        def forward(self, x):
            h = self.body(x)
            return self.mu(h), self.logvar(h)

    g = torch.Generator().manual_seed(41)
    x = torch.randn(4096, 4, generator=g)
    y = torch.sin(2 * x[:, :1]) + (0.02 + 0.1 * x[:, 1:2].abs()) * torch.randn(4096, 1, generator=g)
    model = MV()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    it = batches(x, y, bs=128)
    losses = []
    with ctx.dbg(model, optimizer=opt):
        for step in range(500):
            xb, yb = next(it)
            mu, lv = model(xb)
            l = F.gaussian_nll_loss(mu, yb, lv.exp())
            opt.zero_grad()
            l.backward()
            opt.step()
            losses.append(l.item())
    return {"losses": losses, "modules": [model]}


class StochDepth(nn.Module):
    def __init__(self, p=0.3):
        super().__init__()
        self.inp = nn.Linear(16, 64)
        self.blocks = nn.ModuleList([nn.Sequential(nn.LayerNorm(64), nn.Linear(64, 64), nn.ReLU()) for _ in range(4)])
        self.out = nn.Linear(64, 4)
        self.p = p

    def forward(self, x):
        h = self.inp(x)
        for i, b in enumerate(self.blocks):
            if self.training and torch.rand(()) < self.p * (i + 1) / len(self.blocks):
                continue  # layer dropped this step
            h = h + b(h)
        return self.out(h)


@case
def stochastic_depth(ctx):
    model = StochDepth()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    return std_cls_loop(ctx, model, opt, 400)


@case
def two_backward_calls(ctx):
    # main loss and an auxiliary regulariser back-propagated separately (retain_graph)
    model = TwoHead()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    x, y = cls_data()
    it = batches(x, y)
    losses = []
    with ctx.dbg(model, optimizer=opt):
        for step in range(400):
            xb, yb = next(it)
            opt.zero_grad()
            lc, r = model(xb)
            main = F.cross_entropy(lc, yb)
            main.backward(retain_graph=True)
            aux = 0.1 * r.pow(2).mean()
            aux.backward()
            opt.step()
            losses.append(main.item())
    return {"losses": losses, "modules": [model]}


@case
def dqn_target_network(ctx):
    # fitted Q-iteration on a random 12-state / 3-action MDP with a periodically synced target net
    S, A, gamma = 12, 3, 0.8
    g = torch.Generator().manual_seed(42)
    P = torch.randint(0, S, (S, A), generator=g)
    R = torch.randn(S, A, generator=g)
    q = nn.Sequential(nn.Linear(S, 64), nn.ReLU(), nn.Linear(64, A))
    target = copy.deepcopy(q).requires_grad_(False)
    opt = torch.optim.Adam(q.parameters(), lr=3e-3)
    eye = torch.eye(S)
    losses = []
    with ctx.dbg(q, optimizer=opt):
        for step in range(500):
            s = torch.randint(0, S, (64,), generator=g)
            a = torch.randint(0, A, (64,), generator=g)
            s2 = P[s, a]
            with torch.no_grad():
                tgt = R[s, a] + gamma * target(eye[s2]).max(1).values
            pred = q(eye[s]).gather(1, a[:, None]).squeeze(1)
            l = F.smooth_l1_loss(pred, tgt)
            opt.zero_grad()
            l.backward()
            opt.step()
            if step % 100 == 99:
                target.load_state_dict(q.state_dict())
            losses.append(l.item())
    return {"losses": losses, "modules": [q]}


@case
def freeze_via_lr_zero_group(ctx):
    x, y = cls_data()
    model = mlp()
    opt = torch.optim.SGD([{"params": model[0].parameters(), "lr": 0.0},
                           {"params": list(model[2].parameters()) + list(model[4].parameters())}],
                          lr=0.05, momentum=0.9)
    return std_cls_loop(ctx, model, opt, 400)


@case
def zero_grad_at_end_model_zero_grad(ctx):
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    x, y = cls_data()
    it = batches(x, y)
    losses = []
    with ctx.dbg(model):
        for step in range(400):
            xb, yb = next(it)
            l = F.cross_entropy(model(xb), yb)
            l.backward()
            opt.step()
            model.zero_grad()
            losses.append(l.item())
    return {"losses": losses, "modules": [model]}


@case
def cyclic_lr_triangular(ctx):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    sched = torch.optim.lr_scheduler.CyclicLR(opt, base_lr=0.005, max_lr=0.2, step_size_up=50)
    return std_cls_loop(ctx, model, opt, 400, sched)


@case
def wgan_weight_clipping(ctx):
    # original WGAN: critic trained 5x per generator step, critic weights clamped after each step, RMSprop
    g = torch.Generator().manual_seed(43)
    G = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 2))
    D = nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Linear(32, 1))
    opt_g = torch.optim.RMSprop(G.parameters(), lr=5e-4)
    opt_d = torch.optim.RMSprop(D.parameters(), lr=5e-4)
    center = torch.tensor([2.0, 1.0])
    losses, dist = [], []
    with ctx.dbg(G, optimizer=opt_g, trial="t"), ctx.dbg(D, optimizer=opt_d, trial="t_d"):
        for step in range(300):
            for _ in range(5):
                real = center + 0.5 * torch.randn(64, 2, generator=g)
                fake = G(torch.randn(64, 4, generator=g)).detach()
                opt_d.zero_grad()
                ld = D(fake).mean() - D(real).mean()
                ld.backward()
                opt_d.step()
                for p in D.parameters():
                    p.data.clamp_(-0.05, 0.05)
            opt_g.zero_grad()
            fake = G(torch.randn(64, 4, generator=g))
            lg = -D(fake).mean()
            lg.backward()
            opt_g.step()
            d = (fake.detach().mean(0) - center).norm().item()
            losses.append(d)  # reported "loss": distance of the generated mean to the real mean
            dist.append(lg.item())
    return {"losses": losses, "modules": [G, D], "metric": {"g_loss_first_last": [dist[0], dist[-1]]}}

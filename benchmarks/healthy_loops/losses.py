"""Healthy loops: losses (label smoothing, focal, weighted, multi-task, triplet, InfoNCE, mixup, Huber) and
generative models (autoencoder, VAE with KL annealing, a GAN)."""
import math

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.healthy_loops.common import batches, case, cls_data, mlp, reg_data


# ---------------------------------------------------------------- losses
@case
def label_smoothing_criterion(ctx):
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    crit = nn.CrossEntropyLoss(label_smoothing=0.1)
    x, y = cls_data()
    it = batches(x, y)
    losses = []
    with ctx.dbg(model, optimizer=opt, loss=crit):
        for step in range(400):
            xb, yb = next(it)
            opt.zero_grad()
            l = crit(model(xb), yb)
            l.backward()
            opt.step()
            losses.append(l.item())
    return {"losses": losses, "modules": [model]}


@case
def focal_loss_imbalanced(ctx):
    g = torch.Generator().manual_seed(21)
    n = 4096
    y = (torch.rand(n, generator=g) < 0.08).float()
    x = torch.randn(n, 12, generator=g) + y[:, None] * torch.linspace(-1, 1, 12)
    model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 1))
    with torch.no_grad():
        model[2].bias.fill_(-math.log((1 - 0.08) / 0.08))  # prior-init as in RetinaNet
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)

    def focal(logits, t, gamma=2.0, a=0.75):
        p = torch.sigmoid(logits)
        ce = F.binary_cross_entropy_with_logits(logits, t, reduction="none")
        pt = p * t + (1 - p) * (1 - t)
        at = a * t + (1 - a) * (1 - t)
        return (at * (1 - pt) ** gamma * ce).mean()

    it = batches(x, y, bs=128)
    losses = []
    with ctx.dbg(model, optimizer=opt):
        for step in range(400):
            xb, yb = next(it)
            opt.zero_grad()
            l = focal(model(xb).squeeze(1), yb)
            l.backward()
            opt.step()
            losses.append(l.item())
    return {"losses": losses, "modules": [model]}


@case
def weighted_ce_imbalanced(ctx):
    g = torch.Generator().manual_seed(22)
    n = 4096
    y = (torch.rand(n, generator=g) < 0.05).long()
    x = torch.randn(n, 10, generator=g) + y[:, None].float() * 1.2
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 2))
    w = torch.tensor([1.0, 19.0])
    crit = nn.CrossEntropyLoss(weight=w)
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    it = batches(x, y, bs=128)
    losses = []
    with ctx.dbg(model, optimizer=opt, loss=crit):
        for step in range(400):
            xb, yb = next(it)
            opt.zero_grad()
            l = crit(model(xb), yb)
            l.backward()
            opt.step()
            losses.append(l.item())
    return {"losses": losses, "modules": [model]}


class TwoHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.cls = nn.Linear(64, 4)
        self.reg = nn.Linear(64, 1)

    def forward(self, x):
        h = self.trunk(x)
        return self.cls(h), self.reg(h)


@case
def multitask_two_heads(ctx):
    x, y = cls_data()
    r = (x[:, :3].sum(1, keepdim=True)).sin()
    model = TwoHead()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    it = batches(x, y, r)
    losses = []
    with ctx.dbg(model, optimizer=opt):
        for step in range(400):
            xb, yb, rb = next(it)
            opt.zero_grad()
            lc, lr_ = model(xb)
            l = F.cross_entropy(lc, yb) + 0.5 * F.mse_loss(lr_, rb)
            l.backward()
            opt.step()
            losses.append(l.item())
    return {"losses": losses, "modules": [model]}


def cluster_data(n=2048, k=8, d=16, seed=23):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(k, d, generator=g) * 1.0
    y = torch.randint(0, k, (n,), generator=g)
    x = centers[y] + 0.8 * torch.randn(n, d, generator=g)
    return x, y


@case
def triplet_loss(ctx):
    x, y = cluster_data()
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 8))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    crit = nn.TripletMarginLoss(margin=1.0)
    g = torch.Generator().manual_seed(24)
    bycls = [torch.nonzero(y == c).squeeze(1) for c in range(8)]
    losses = []
    with ctx.dbg(model, optimizer=opt):
        for step in range(400):
            c = torch.randint(0, 8, (64,), generator=g)
            cn = (c + torch.randint(1, 8, (64,), generator=g)) % 8
            pick = lambda cc: torch.stack([bycls[i][torch.randint(0, len(bycls[i]), (1,), generator=g)][0]
                                           for i in cc.tolist()])
            a, p, ng = x[pick(c)], x[pick(c)], x[pick(cn)]
            opt.zero_grad()
            ea, ep, en = model(a), model(p), model(ng)
            l = crit(ea, ep, en)
            l.backward()
            opt.step()
            losses.append(l.item())
    return {"losses": losses, "modules": [model]}


@case
def infonce_contrastive(ctx):
    x, _ = cluster_data(4096)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 32))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(25)
    losses = []
    with ctx.dbg(model, optimizer=opt):
        for step in range(400):
            idx = torch.randint(0, x.shape[0], (64,), generator=g)
            xb = x[idx]
            v1 = xb + 0.3 * torch.randn(xb.shape, generator=g)
            v2 = xb * (1 + 0.1 * torch.randn(xb.shape, generator=g))
            z = F.normalize(model(torch.cat([v1, v2])), dim=1)
            sim = z @ z.t() / 0.2
            sim.fill_diagonal_(-1e9)
            tgt = torch.cat([torch.arange(64, 128), torch.arange(0, 64)])
            l = F.cross_entropy(sim, tgt)
            opt.zero_grad()
            l.backward()
            opt.step()
            losses.append(l.item())
    return {"losses": losses, "modules": [model]}


@case
def mixup(ctx):
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    x, y = cls_data()
    it = batches(x, y)
    beta = torch.distributions.Beta(0.4, 0.4)
    losses = []
    with ctx.dbg(model, optimizer=opt):
        for step in range(400):
            xb, yb = next(it)
            lam = beta.sample().item()
            perm = torch.randperm(xb.shape[0])
            xm = lam * xb + (1 - lam) * xb[perm]
            out = model(xm)
            l = lam * F.cross_entropy(out, yb) + (1 - lam) * F.cross_entropy(out, yb[perm])
            opt.zero_grad()
            l.backward()
            opt.step()
            losses.append(l.item())
    return {"losses": losses, "modules": [model]}


@case
def huber_criterion_regression(ctx):
    model = nn.Sequential(nn.Linear(8, 64), nn.SiLU(), nn.Linear(64, 64), nn.SiLU(), nn.Linear(64, 2))
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    crit = nn.SmoothL1Loss(beta=0.5)
    x, y = reg_data()
    it = batches(x, y)
    losses = []
    with ctx.dbg(model, optimizer=opt, loss=crit):
        for step in range(400):
            xb, yb = next(it)
            opt.zero_grad()
            l = crit(model(xb), yb)
            l.backward()
            opt.step()
            losses.append(l.item())
    return {"losses": losses, "modules": [model]}


# ---------------------------------------------------------------- generative
def manifold_data(n=2048, seed=26):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, 3, generator=g)
    W = torch.randn(3, 24, generator=g)
    return torch.tanh(z @ W) + 0.05 * torch.randn(n, 24, generator=g)


@case
def autoencoder(ctx):
    x = manifold_data()
    model = nn.Sequential(nn.Linear(24, 32), nn.ReLU(), nn.Linear(32, 4), nn.Linear(4, 32), nn.ReLU(),
                          nn.Linear(32, 24))
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    it = batches(x)
    losses = []
    with ctx.dbg(model, optimizer=opt):
        for step in range(400):
            (xb,) = next(it)
            opt.zero_grad()
            l = F.mse_loss(model(xb), xb)
            l.backward()
            opt.step()
            losses.append(l.item())
    return {"losses": losses, "modules": [model]}


class VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(24, 64), nn.ReLU())
        self.mu = nn.Linear(64, 4)
        self.logvar = nn.Linear(64, 4)
        self.dec = nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 24))

    def forward(self, x):
        h = self.enc(x)
        mu, lv = self.mu(h), self.logvar(h)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * lv)
        return self.dec(z), mu, lv


@case
def vae_kl_annealing(ctx):
    x = manifold_data()
    model = VAE()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    it = batches(x)
    losses = []
    with ctx.dbg(model, optimizer=opt):
        for step in range(500):
            (xb,) = next(it)
            beta = min(1.0, step / 250)
            opt.zero_grad()
            rec, mu, lv = model(xb)
            recon = F.mse_loss(rec, xb, reduction="sum") / xb.shape[0]
            kl = -0.5 * torch.sum(1 + lv - mu.pow(2) - lv.exp()) / xb.shape[0]
            l = recon + beta * kl
            l.backward()
            opt.step()
            losses.append(l.item())
    return {"losses": losses, "modules": [model]}


@case
def gan_two_optimizers(ctx):
    g = torch.Generator().manual_seed(27)
    G = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 2))
    D = nn.Sequential(nn.Linear(2, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
    opt_g = torch.optim.Adam(G.parameters(), lr=1e-3, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(D.parameters(), lr=1e-3, betas=(0.5, 0.999))
    bs = 64
    ones, zeros = torch.ones(bs, 1), torch.zeros(bs, 1)
    center = torch.tensor([3.0, -2.0])
    losses, dl, dist = [], [], []
    with ctx.dbg(G, optimizer=opt_g, trial="t"), ctx.dbg(D, optimizer=opt_d, trial="t_d"):
        for step in range(500):
            real = center + 0.5 * torch.randn(bs, 2, generator=g)
            noise = torch.randn(bs, 4, generator=g)
            opt_d.zero_grad()
            fake = G(noise)
            ld = F.binary_cross_entropy_with_logits(D(real), ones) + \
                F.binary_cross_entropy_with_logits(D(fake.detach()), zeros)
            ld.backward()
            opt_d.step()
            opt_g.zero_grad()
            lg = F.binary_cross_entropy_with_logits(D(fake), ones)
            lg.backward()
            opt_g.step()
            # "loss" reported: distance of generated mean to the real mean (G's loss oscillates by design)
            losses.append(lg.item())
            dl.append(ld.item())
            dist.append((fake.detach().mean(0) - center).norm().item())
    fake_std = G(torch.randn(2048, 4, generator=g)).std(0).tolist()
    return {"losses": losses, "modules": [G, D], "metric": {"d_loss_first_last": [dl[0], dl[-1]],
                                                              "dist_first_last": [dist[0], sum(dist[-20:]) / 20],
                                                              "fake_std_last": fake_std}}



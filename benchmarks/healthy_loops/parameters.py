"""Healthy loops: model copies (EMA, a frozen teacher), freezing and unfreezing, per-group learning rates,
adapters, pruning masks, parametrisations, normalisation layers with evaluation passes."""
import copy

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.healthy_loops.common import batches, case, cls_data, mlp, reg_data, std_cls_loop


# ---------------------------------------------------------------- model copies
@case
def ema_teacher(ctx):
    model = mlp()
    ema = copy.deepcopy(model).requires_grad_(False)
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    x, y = cls_data()
    xv, yv = cls_data(512, seed=11)
    it = batches(x, y)
    losses, evl = [], []
    with ctx.dbg(model, optimizer=opt):
        for step in range(400):
            xb, yb = next(it)
            opt.zero_grad()
            l = F.cross_entropy(model(xb), yb)
            l.backward()
            opt.step()
            with torch.no_grad():
                for pe, pm in zip(ema.parameters(), model.parameters()):
                    pe.lerp_(pm, 0.01)
            losses.append(l.item())
            if step % 50 == 49:
                ema.eval()
                with torch.no_grad():
                    evl.append(F.cross_entropy(ema(xv), yv).item())
    return {"losses": losses, "modules": [model, ema], "metric": evl}


@case
def distillation(ctx):
    x, y = cls_data()
    teacher = mlp(h=128)
    topt = torch.optim.Adam(teacher.parameters(), lr=3e-3)
    it = batches(x, y, seed=9)
    for _ in range(300):
        xb, yb = next(it)
        topt.zero_grad(); F.cross_entropy(teacher(xb), yb).backward(); topt.step()
    teacher.eval().requires_grad_(False)
    student = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.Adam(student.parameters(), lr=3e-3)
    T, alpha = 2.0, 0.7
    it = batches(x, y)
    losses = []
    with ctx.dbg(student, optimizer=opt):
        for step in range(400):
            xb, yb = next(it)
            with torch.no_grad():
                tl = teacher(xb)
            sl = student(xb)
            kd = F.kl_div(F.log_softmax(sl / T, 1), F.softmax(tl / T, 1), reduction="batchmean") * T * T
            l = alpha * kd + (1 - alpha) * F.cross_entropy(sl, yb)
            opt.zero_grad()
            l.backward()
            opt.step()
            losses.append(l.item())
    return {"losses": losses, "modules": [student]}


# ---------------------------------------------------------------- freezing
@case
def frozen_backbone(ctx):
    x, y = cls_data()
    backbone = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
    pre_head = nn.Linear(64, 4)
    popt = torch.optim.Adam(list(backbone.parameters()) + list(pre_head.parameters()), lr=3e-3)
    it = batches(x, y, seed=9)
    for _ in range(200):
        xb, yb = next(it)
        popt.zero_grad(); F.cross_entropy(pre_head(backbone(xb)), yb).backward(); popt.step()
    backbone.requires_grad_(False)
    model = nn.Sequential(backbone, nn.Linear(64, 4))
    opt = torch.optim.Adam(model[1].parameters(), lr=3e-3)
    return std_cls_loop(ctx, model, opt, 400)


@case
def gradual_unfreeze(ctx):
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    model[0].requires_grad_(False)
    model[2].requires_grad_(False)
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    x, y = cls_data()
    it = batches(x, y)
    losses = []
    with ctx.dbg(model, optimizer=opt):
        for step in range(450):
            if step == 150:
                model[2].requires_grad_(True)
            if step == 300:
                model[0].requires_grad_(True)
            xb, yb = next(it)
            opt.zero_grad()
            l = F.cross_entropy(model(xb), yb)
            l.backward()
            opt.step()
            losses.append(l.item())
    return {"losses": losses, "modules": [model]}


@case
def unfreeze_add_param_group(ctx):
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    model[0].requires_grad_(False)
    opt = torch.optim.Adam(model[2].parameters(), lr=3e-3)
    x, y = cls_data()
    it = batches(x, y)
    losses = []
    with ctx.dbg(model, optimizer=opt):
        for step in range(400):
            if step == 150:
                model[0].requires_grad_(True)
                opt.add_param_group({"params": model[0].parameters(), "lr": 5e-4})
            xb, yb = next(it)
            opt.zero_grad()
            l = F.cross_entropy(model(xb), yb)
            l.backward()
            opt.step()
            losses.append(l.item())
    return {"losses": losses, "modules": [model]}


@case
def layerwise_lr(ctx):
    model = mlp()
    opt = torch.optim.AdamW([
        {"params": model[0].parameters(), "lr": 2e-4, "name": "low"},
        {"params": model[2].parameters(), "lr": 6e-4, "name": "mid"},
        {"params": model[4].parameters(), "lr": 3e-3, "name": "head"},
    ], weight_decay=0.01)
    return std_cls_loop(ctx, model, opt, 400)


class LoRALinear(nn.Module):
    def __init__(self, base, r=4, alpha=8):
        super().__init__()
        self.base = base
        self.A = nn.Parameter(torch.randn(r, base.in_features) * 0.01)
        self.B = nn.Parameter(torch.zeros(base.out_features, r))
        self.scale = alpha / r

    def forward(self, x):
        return self.base(x) + (x @ self.A.t() @ self.B.t()) * self.scale


@case
def lora_adapters(ctx):
    x, y = cls_data()
    base = mlp()
    bopt = torch.optim.Adam(base.parameters(), lr=3e-3)
    # pretrain on a related (label-permuted) task
    it = batches(x, (y + 1) % 4, seed=9)
    for _ in range(200):
        xb, yb = next(it)
        bopt.zero_grad(); F.cross_entropy(base(xb), yb).backward(); bopt.step()
    base.requires_grad_(False)
    model = nn.Sequential(LoRALinear(base[0]), nn.ReLU(), LoRALinear(base[2]), nn.ReLU(), LoRALinear(base[4]))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    return std_cls_loop(ctx, model, opt, 400)


# ---------------------------------------------------------------- parametrisations
@case
def pruning_masks(ctx):
    import torch.nn.utils.prune as prune
    model = mlp(h=128)
    for i in (0, 2, 4):
        prune.l1_unstructured(model[i], "weight", amount=0.6)
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    return std_cls_loop(ctx, model, opt, 400)


@case
def spectral_norm(ctx):
    from torch.nn.utils.parametrizations import spectral_norm as sn
    model = nn.Sequential(sn(nn.Linear(16, 64)), nn.ReLU(), sn(nn.Linear(64, 64)), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    return std_cls_loop(ctx, model, opt, 400)


@case
def weight_norm(ctx):
    from torch.nn.utils.parametrizations import weight_norm as wn
    model = nn.Sequential(wn(nn.Linear(8, 64)), nn.Tanh(), wn(nn.Linear(64, 64)), nn.Tanh(), wn(nn.Linear(64, 2)))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    x, y = reg_data()
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


# ---------------------------------------------------------------- normalisation / eval passes
def img_data(n=2048, seed=4):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    x = 0.5 * torch.randn(n, 1, 8, 8, generator=g)
    for q in range(4):
        r, c = (q // 2) * 4, (q % 2) * 4
        x[y == q, :, r:r + 4, c:c + 4] += 1.0
    return x, y


def img_loop(ctx, model, opt, steps=400, eval_every=50):
    x, y = img_data()
    xv, yv = img_data(256, seed=14)
    it = batches(x, y, bs=32)
    losses, accs = [], []
    with ctx.dbg(model, optimizer=opt):
        for step in range(steps):
            model.train()
            xb, yb = next(it)
            opt.zero_grad()
            l = F.cross_entropy(model(xb), yb)
            l.backward()
            opt.step()
            losses.append(l.item())
            if step % eval_every == eval_every - 1:
                model.eval()
                with torch.no_grad():
                    accs.append((model(xv).argmax(1) == yv).float().mean().item())
    return {"losses": losses, "modules": [model], "metric": accs}


@case
def batchnorm_cnn_eval(ctx):
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.Conv2d(8, 16, 3, padding=1, stride=2), nn.BatchNorm2d(16), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return img_loop(ctx, model, opt)


@case
def groupnorm_cnn(ctx):
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.GroupNorm(2, 8), nn.SiLU(),
                          nn.Conv2d(8, 16, 3, padding=1, stride=2), nn.GroupNorm(4, 16), nn.SiLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 4))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    return img_loop(ctx, model, opt)


class ResBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.b1 = nn.BatchNorm2d(c)
        self.c2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.b2 = nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        out = self.relu(self.b1(self.c1(x)))
        out = self.b2(self.c2(out))
        out += x
        return self.relu(out)


@case
def resnet_inplace(ctx):
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(inplace=True), ResBlock(8), ResBlock(8),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    return img_loop(ctx, model, opt)


@case
def layernorm_dropout_heavy(ctx):
    model = nn.Sequential(nn.Linear(16, 128), nn.LayerNorm(128), nn.GELU(), nn.Dropout(0.5),
                          nn.Linear(128, 128), nn.LayerNorm(128), nn.GELU(), nn.Dropout(0.5),
                          nn.Linear(128, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    x, y = cls_data()
    xv, yv = cls_data(512, seed=11)
    it = batches(x, y)
    losses, vls = [], []
    with ctx.dbg(model, optimizer=opt):
        for step in range(400):
            model.train()
            xb, yb = next(it)
            opt.zero_grad()
            l = F.cross_entropy(model(xb), yb)
            l.backward()
            opt.step()
            losses.append(l.item())
            if step % 40 == 39:
                model.eval()
                with torch.no_grad():
                    vls.append(F.cross_entropy(model(xv), yv).item())
    return {"losses": losses, "modules": [model], "metric": vls}



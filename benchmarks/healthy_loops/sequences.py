"""Healthy loops: sequence models (truncated BPTT, packed sequences, a transformer with a padding mask, an
embedding bag, a tied language model)."""
import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.healthy_loops.common import batches, case


# ---------------------------------------------------------------- sequence models
class CharLSTM(nn.Module):
    def __init__(self, V=12, H=48):
        super().__init__()
        self.emb = nn.Embedding(V, 16)
        self.lstm = nn.LSTM(16, H, batch_first=True)
        self.out = nn.Linear(H, V)

    def forward(self, x, h=None):
        o, h = self.lstm(self.emb(x), h)
        return self.out(o), h


@case
def lstm_tbptt(ctx):
    V = 12
    g = torch.Generator().manual_seed(28)
    # 16 streams, a noisy cyclic pattern with period 7 (needs memory across chunks partially)
    T = 400 * 20 // 16 * 16
    base = torch.tensor([0, 3, 5, 1, 7, 2, 9])
    streams = []
    for s in range(16):
        off = torch.randint(0, 7, (1,), generator=g).item()
        seq = base[(torch.arange(T // 16 * 16 + 1) + off) % 7].clone()
        noise = torch.rand(seq.shape, generator=g) < 0.1
        seq[noise] = torch.randint(0, V, (int(noise.sum()),), generator=g)
        streams.append(seq)
    data = torch.stack(streams)
    model = CharLSTM(V)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    chunk = 20
    h = None
    losses = []
    with ctx.dbg(model, optimizer=opt):
        for step in range(400):
            i = (step * chunk) % (data.shape[1] - chunk - 1)
            if i == 0:
                h = None
            xb, yb = data[:, i:i + chunk], data[:, i + 1:i + chunk + 1]
            if h is not None:
                h = tuple(t.detach() for t in h)
            opt.zero_grad()
            out, h = model(xb, h)
            l = F.cross_entropy(out.reshape(-1, V), yb.reshape(-1))
            l.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(l.item())
    return {"losses": losses, "modules": [model]}


class PackedGRU(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(3, 32, batch_first=True)
        self.head = nn.Linear(32, 2)

    def forward(self, x, lengths):
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        _, h = self.gru(packed)
        return self.head(h[-1])


@case
def gru_packed_variable_length(ctx):
    g = torch.Generator().manual_seed(29)
    N, Tm = 2048, 15
    lengths = torch.randint(3, Tm + 1, (N,), generator=g)
    x = torch.randn(N, Tm, 3, generator=g)
    mask = torch.arange(Tm)[None] < lengths[:, None]
    x = x * mask[..., None]
    y = ((x[..., 0] * mask).sum(1) > 0).long()
    model = PackedGRU()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    it = batches(x, y, lengths)
    losses = []
    with ctx.dbg(model, optimizer=opt):
        for step in range(400):
            xb, yb, lb = next(it)
            opt.zero_grad()
            l = F.cross_entropy(model(xb, lb), yb)
            l.backward()
            opt.step()
            losses.append(l.item())
    return {"losses": losses, "modules": [model]}


class TinyTransformer(nn.Module):
    def __init__(self, V=10, d=32):
        super().__init__()
        self.emb = nn.Embedding(V, d, padding_idx=0)
        self.pos = nn.Parameter(torch.randn(1, 16, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, 4, 64, dropout=0.1, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(d, 2)

    def forward(self, tok, pad):
        h = self.enc(self.emb(tok) + self.pos[:, :tok.shape[1]], src_key_padding_mask=pad)
        keep = (~pad).unsqueeze(-1).float()
        return self.head((h * keep).sum(1) / keep.sum(1))


@case
def transformer_padding_mask(ctx):
    g = torch.Generator().manual_seed(30)
    N, T = 2048, 16
    lengths = torch.randint(4, T + 1, (N,), generator=g)
    tok = torch.randint(1, 10, (N, T), generator=g)
    pad = torch.arange(T)[None] >= lengths[:, None]
    tok[pad] = 0
    y = (((tok == 1) & ~pad).sum(1) > ((tok == 2) & ~pad).sum(1)).long()
    model = TinyTransformer()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    it = batches(tok, pad, y, bs=64)
    tv, pv, yv = tok[:256], pad[:256], y[:256]
    losses, accs = [], []
    with ctx.dbg(model, optimizer=opt):
        for step in range(400):
            model.train()
            tb, pb, yb = next(it)
            opt.zero_grad()
            l = F.cross_entropy(model(tb, pb), yb)
            l.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(l.item())
            if step % 100 == 99:
                model.eval()
                with torch.no_grad():
                    accs.append((model(tv, pv).argmax(1) == yv).float().mean().item())
    return {"losses": losses, "modules": [model], "metric": accs}


class BagModel(nn.Module):
    def __init__(self, V=300, D=24):
        super().__init__()
        self.bag = nn.EmbeddingBag(V, D, mode="mean")
        self.fc = nn.Linear(D, 3)

    def forward(self, text, offsets):
        return self.fc(self.bag(text, offsets))


@case
def embedding_bag(ctx):
    V = 300
    g = torch.Generator().manual_seed(31)
    topic = torch.randint(0, V, (V,), generator=g) % 3
    losses = []
    model = BagModel(V)
    opt = torch.optim.SGD(model.parameters(), lr=2.0)
    with ctx.dbg(model, optimizer=opt):
        for step in range(400):
            lens = torch.randint(3, 12, (32,), generator=g)
            ys = torch.randint(0, 3, (32,), generator=g)
            toks = []
            for L, yy in zip(lens.tolist(), ys.tolist()):
                cand = torch.nonzero(topic == yy).squeeze(1)
                on = cand[torch.randint(0, len(cand), (L // 2 + 1,), generator=g)]
                off = torch.randint(0, V, (L - L // 2 - 1,), generator=g)
                toks.append(torch.cat([on, off]))
            text = torch.cat(toks)
            offsets = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)[:-1]])
            opt.zero_grad()
            l = F.cross_entropy(model(text, offsets), ys)
            l.backward()
            opt.step()
            losses.append(l.item())
    return {"losses": losses, "modules": [model]}


class TiedLM(nn.Module):
    def __init__(self, V=24, d=32, ctxlen=3):
        super().__init__()
        self.emb = nn.Embedding(V, d)
        self.mix = nn.Linear(ctxlen * d, d)
        self.act = nn.Tanh()
        self.out = nn.Linear(d, V, bias=False)
        self.out.weight = self.emb.weight  # weight tying

    def forward(self, ctx):
        return self.out(self.act(self.mix(self.emb(ctx).flatten(1))))


@case
def weight_tying_lm(ctx):
    V = 24
    g = torch.Generator().manual_seed(32)
    trans = torch.softmax(torch.randn(V, V, generator=g) * 3, 1)
    seq = [0]
    for _ in range(20000):
        seq.append(torch.multinomial(trans[seq[-1]], 1, generator=g).item())
    seq = torch.tensor(seq)
    X = torch.stack([seq[i:i + 3] for i in range(len(seq) - 3)])
    Y = seq[3:]
    model = TiedLM(V)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    it = batches(X, Y, bs=64)
    losses = []
    with ctx.dbg(model, optimizer=opt):
        for step in range(400):
            xb, yb = next(it)
            opt.zero_grad()
            l = F.cross_entropy(model(xb), yb)
            l.backward()
            opt.step()
            losses.append(l.item())
    return {"losses": losses, "modules": [model]}



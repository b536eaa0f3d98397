"""The model zoo: each model and loop people train, recorded by NeuralDbg unchanged, and checked for
(a) training bit-identical to the bare loop (losses, parameters, buffers, gradients, optimizer state, RNG),
(b) exactly the expected graph (``expected/<name>.txt``, reviewed by hand), acyclic, no orphan node,
(c) one recorded step per optimizer step, and (d) no failure found by ``analyze()`` on the healthy run."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from comgra_ndbg import NeuralDbg, analyze
from zoo.checks import Run, assert_graph, assert_steps, record_and_compare, snapshot_state
from zoo.models import (VAE, CheckpointedMLP, Discriminator, FineTune, Generator, GRUCellLoop, LSTMClassifier, ResNet,
                        TinyTransformerLM, UNet, vae_loss)


def generator(seed: int = 1) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def simple_loop(make: Callable[[], tuple[nn.Module, torch.optim.Optimizer]], batches: list[tuple],
                loss_of: Callable[[nn.Module, tuple], torch.Tensor]) -> Callable[[bool, Path], Run]:
    """The plain loop (zero_grad, forward, loss, backward, step) over ``batches``; with ``recorded`` inside
    ``NeuralDbg(model)``."""
    def train(recorded: bool, folder: Path) -> Run:
        torch.manual_seed(0)
        model, optimizer = make()
        run = Run()
        dbg = NeuralDbg(model, folder, trial="t") if recorded else None
        for batch in batches:
            optimizer.zero_grad()
            loss = loss_of(model, batch)
            loss.backward()
            optimizer.step()
            run.losses.append(loss.item())
            run.optimizer_steps += 1
        if dbg is not None:
            dbg.close()
        run.state = snapshot_state({"model": model}, {"optimizer": optimizer})
        return run

    return train


def check(train: Callable[[bool, Path], Run], folder: Path, fixture: str, *, trial: str = "t") -> Run:
    run = record_and_compare(train, folder)
    assert run.warnings == []
    assert_steps(folder, trial, run.optimizer_steps)
    assert_graph(folder, trial, fixture)
    return run


def assert_healthy(folder: Path, trial: str = "t") -> None:
    diagnosis = analyze(folder, trial=trial, store=False)
    assert [h.sentence for h in diagnosis.hypotheses] == []


# ---- convolutional ----------------------------------------------------------------------------------------------
def test_resnet_with_batch_norm_and_in_place_residual_adds(tmp_path: Path) -> None:
    g = generator()
    batches = [(torch.randn(4, 3, 16, 16, generator=g), torch.randint(0, 4, (4,), generator=g)) for _ in range(4)]

    def make() -> tuple[nn.Module, torch.optim.Optimizer]:
        model = ResNet()
        return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    check(simple_loop(make, batches, lambda m, b: F.cross_entropy(m(b[0]), b[1])), tmp_path, "resnet")
    assert_healthy(tmp_path)


def test_unet_with_skip_concatenations(tmp_path: Path) -> None:
    g = generator()
    batches = [(torch.randn(2, 1, 8, 8, generator=g), torch.randn(2, 1, 8, 8, generator=g)) for _ in range(4)]

    def make() -> tuple[nn.Module, torch.optim.Optimizer]:
        model = UNet()
        return model, torch.optim.Adam(model.parameters(), lr=1e-3)

    check(simple_loop(make, batches, lambda m, b: F.mse_loss(m(b[0]), b[1])), tmp_path, "unet")
    assert_healthy(tmp_path)


def test_frozen_backbone_fine_tune(tmp_path: Path) -> None:
    g = generator()
    batches = [(torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 3, (4,), generator=g)) for _ in range(4)]

    def make() -> tuple[nn.Module, torch.optim.Optimizer]:
        model = FineTune()
        model.backbone.requires_grad_(False)
        return model, torch.optim.Adam(model.head.parameters(), lr=1e-3)

    check(simple_loop(make, batches, lambda m, b: F.cross_entropy(m(b[0]), b[1])), tmp_path, "frozen_backbone")
    assert_healthy(tmp_path)


# ---- sequence models ---------------------------------------------------------------------------------------------
def test_transformer_encoder_with_padding_mask_and_tied_embeddings(tmp_path: Path) -> None:
    g = generator()
    batches = []
    for _ in range(4):
        tokens = torch.randint(1, 20, (4, 8), generator=g)
        padding = torch.zeros(4, 8, dtype=torch.bool)
        padding[1, 6:] = padding[3, 5:] = True
        batches.append((tokens.masked_fill(padding, 0), padding))

    def make() -> tuple[nn.Module, torch.optim.Optimizer]:
        model = TinyTransformerLM()
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3)

    def loss_of(model: nn.Module, batch: tuple) -> torch.Tensor:
        tokens, padding = batch
        logits = model(tokens, padding)
        targets = tokens[:, 1:].masked_fill(padding[:, 1:], -100)
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)

    check(simple_loop(make, batches, loss_of), tmp_path, "transformer")
    assert_healthy(tmp_path)


def test_gpt2_from_transformers_with_a_tiny_config(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=1, n_head=2,
                                     bos_token_id=0, eos_token_id=0)
    g = generator()
    batches = [(torch.randint(0, 32, (2, 8), generator=g),) for _ in range(4)]

    def make() -> tuple[nn.Module, torch.optim.Optimizer]:
        model = transformers.GPT2LMHeadModel(config)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3)

    check(simple_loop(make, batches, lambda m, b: m(input_ids=b[0], labels=b[0]).loss), tmp_path, "gpt2")
    assert_healthy(tmp_path)


def test_lstm_classifier(tmp_path: Path) -> None:
    g = generator()
    batches = [(torch.randint(0, 12, (4, 5), generator=g), torch.randint(0, 3, (4,), generator=g)) for _ in range(4)]

    def make() -> tuple[nn.Module, torch.optim.Optimizer]:
        model = LSTMClassifier()
        return model, torch.optim.Adam(model.parameters(), lr=1e-3)

    check(simple_loop(make, batches, lambda m, b: F.cross_entropy(m(b[0]), b[1])), tmp_path, "lstm")
    assert_healthy(tmp_path)


def test_gru_cell_stepped_over_a_sequence(tmp_path: Path) -> None:
    g = generator()
    batches = [(torch.randn(4, 3, 4, generator=g), torch.randn(4, 1, generator=g)) for _ in range(4)]

    def make() -> tuple[nn.Module, torch.optim.Optimizer]:
        model = GRUCellLoop()
        return model, torch.optim.Adam(model.parameters(), lr=1e-3)

    check(simple_loop(make, batches, lambda m, b: F.mse_loss(m(b[0]), b[1])), tmp_path, "grucell")
    assert_healthy(tmp_path)


# ---- generative ---------------------------------------------------------------------------------------------------
def test_vae_with_reparameterisation_and_a_two_term_loss(tmp_path: Path) -> None:
    g = generator()
    batches = [(torch.randn(8, 8, generator=g),) for _ in range(4)]

    def make() -> tuple[nn.Module, torch.optim.Optimizer]:
        model = VAE()
        return model, torch.optim.Adam(model.parameters(), lr=1e-3)

    def loss_of(model: nn.Module, batch: tuple) -> torch.Tensor:
        recon, mu, logvar = model(batch[0])
        return vae_loss(recon, batch[0], mu, logvar)

    check(simple_loop(make, batches, loss_of), tmp_path, "vae")
    assert_healthy(tmp_path)


def train_gan(recorded: bool, folder: Path) -> Run:
    """The DCGAN tutorial's loop, each model in its own NeuralDbg and with its own optimizer."""
    torch.manual_seed(0)
    G, D = Generator(), Discriminator()
    optG, optD = torch.optim.Adam(G.parameters(), lr=1e-3), torch.optim.Adam(D.parameters(), lr=1e-3)
    dbgs = [NeuralDbg(G, folder, trial="G"), NeuralDbg(D, folder, trial="D")] if recorded else []
    run = Run()
    g = generator()
    for _ in range(4):
        real = torch.randn(8, 2, generator=g) + 2
        optD.zero_grad()
        err_real = F.binary_cross_entropy_with_logits(D(real), torch.ones(8, 1))
        err_real.backward()
        fake = G(torch.randn(8, 4, generator=g))
        err_fake = F.binary_cross_entropy_with_logits(D(fake.detach()), torch.zeros(8, 1))
        err_fake.backward()
        optD.step()
        optG.zero_grad()
        err_g = F.binary_cross_entropy_with_logits(D(fake), torch.ones(8, 1))
        err_g.backward()
        optG.step()
        run.losses += [err_real.item(), err_fake.item(), err_g.item()]
        run.optimizer_steps += 1
    for dbg in dbgs:
        dbg.close()
    run.state = snapshot_state({"G": G, "D": D}, {"G": optG, "D": optD})
    return run


def test_gan_with_two_models_and_two_optimizers(tmp_path: Path) -> None:
    run = record_and_compare(train_gan, tmp_path)
    assert run.warnings == []
    for trial, fixture in (("G", "gan_generator"), ("D", "gan_discriminator")):
        assert_steps(tmp_path, trial, run.optimizer_steps)
        assert_graph(tmp_path, trial, fixture)
        assert_healthy(tmp_path, trial)


# ---- training techniques -----------------------------------------------------------------------------------------
def train_amp(recorded: bool, folder: Path) -> Run:
    """bfloat16 autocast, a GradScaler, two micro-batches per step and gradient clipping."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)
    dbg = NeuralDbg(model, folder, trial="t") if recorded else None
    run = Run()
    g = generator()
    for _ in range(4):
        optimizer.zero_grad()
        for _ in range(2):
            x, y = torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y) / 2
            scaler.scale(loss).backward()
            run.losses.append(loss.item())
        scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        scaler.step(optimizer)
        scaler.update()
        run.optimizer_steps += 1
    if dbg is not None:
        dbg.close()
    run.state = snapshot_state({"model": model}, {"optimizer": optimizer})
    return run


def test_autocast_with_gradient_accumulation_and_clipping(tmp_path: Path) -> None:
    check(train_amp, tmp_path, "amp")
    assert_healthy(tmp_path)


@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non-reentrant"])
def test_activation_checkpointing(tmp_path: Path, reentrant: bool) -> None:
    g = generator()
    batches = [(torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(4)]

    def make() -> tuple[nn.Module, torch.optim.Optimizer]:
        model = CheckpointedMLP(reentrant)
        return model, torch.optim.SGD(model.parameters(), lr=0.05)

    check(simple_loop(make, batches, lambda m, b: F.cross_entropy(m(b[0]), b[1])), tmp_path, "residual_mlp")
    assert_healthy(tmp_path)


COMPILE_ORDERS = ["compile inside", "compile outside", "module.compile", "compiled and called before",
                  "another instance compiled before"]


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("order", COMPILE_ORDERS)
def test_torch_compile_in_the_orders_users_use(tmp_path: Path, order: str, fresh_dynamo) -> None:
    g = generator()
    batches = [(torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(4)]

    def train(recorded: bool, folder: Path) -> Run:
        torch._dynamo.reset()
        if order == "another instance compiled before":
            torch.compile(CheckpointedMLP(None), backend="aot_eager")(batches[0][0])
        torch.manual_seed(0)
        model = CheckpointedMLP(None)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        net: nn.Module = model
        if order in ("compile outside", "compiled and called before"):
            net = torch.compile(model, backend="aot_eager")
            if order == "compiled and called before":
                net(batches[0][0])  # a first call, e.g. to check the output's shape
        dbg = NeuralDbg(net, folder, trial="t") if recorded else None
        if order in ("compile inside", "another instance compiled before"):
            net = torch.compile(model, backend="aot_eager")
        elif order == "module.compile":
            model.compile(backend="aot_eager")
        run = Run()
        for inputs, targets in batches:
            optimizer.zero_grad()
            loss = F.cross_entropy(net(inputs), targets)
            loss.backward()
            optimizer.step()
            run.losses.append(loss.item())
            run.optimizer_steps += 1
        if dbg is not None:
            dbg.close()
        run.state = snapshot_state({"model": model}, {"optimizer": optimizer})
        return run

    check(train, tmp_path, "residual_mlp")
    assert_healthy(tmp_path)

"""The vector families: ``mlp`` (explicit ``Recorder`` registration), ``resmlp``, ``autoencoder``,
``twobranch`` (recorded by ``NeuralDbg`` at its defaults). Each builds its ``Setup`` and lists its sites."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.diagbench import data
from benchmarks.diagbench.families import NEURALDBG, RECORDER, Family, Site
from benchmarks.diagbench.models_dense import MLP as MLPModel
from benchmarks.diagbench.models_dense import Autoencoder, ResidualMLP, TwoBranch
from benchmarks.diagbench.pipeline import Pipeline
from benchmarks.diagbench.setup import Config, Setup, make_optimizer, make_scheduler

CLASSES = 10
OGM_ALPHA = 4.0  # strength of the gradient modulation of the twobranch "ogm" configuration


def custom_cross_entropy(logits: torch.Tensor, target: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Cross-entropy written by hand, as in many code bases: ``log`` of a softmax (with a temperature) —
    exact zeros of the softmax make it ``-inf × 0 = NaN``."""
    p = torch.softmax(logits / temperature, dim=1)
    return -(torch.log(p) * F.one_hot(target, logits.shape[1])).sum(dim=1).mean()


def classification_loss(setup: Setup, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The config's way of writing the cross-entropy: criterion module, functional call or custom function."""
    if setup.config.loss in ("hooked", "module"):
        return setup.criterion(logits, target)
    if setup.config.loss == "custom":
        return custom_cross_entropy(logits, target, setup.knobs.get("temperature", 1.0))
    return F.cross_entropy(logits, target)


def _criterion(config: Config, module: type[nn.Module]) -> nn.Module | None:
    return module() if config.loss in ("hooked", "module") else None


def _feature_pipeline(config: Config, seed: int, x: torch.Tensor, y: torch.Tensor) -> Pipeline:
    return Pipeline([data.sensor_units(x, seed)], y, kind="features", batch_size=config.batch_size, seed=seed,
                    classes=CLASSES)


def _clusters(config: Config, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    if config.task == "easy":
        return data.clusters(seed, separation=6.0, label_noise=0.0)
    if config.task == "noisy":
        return data.clusters(seed, label_noise=0.3)
    return data.clusters(seed)


# ---- mlp: explicit Recorder registration -------------------------------------------------------------------
def _mlp_loss(setup: Setup, inputs: list[torch.Tensor], target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = setup.register("input", inputs[0], role="input")
    logits = setup.model(x, setup.register)
    if setup.config.task == "softmax_output":  # probabilities passed on to F.cross_entropy as if logits
        logits = torch.softmax(logits, dim=1)
    logits = setup.register("logits", logits, role="output")
    return setup.register("loss", classification_loss(setup, logits, target), role="loss"), logits


def build_mlp(config: Config, seed: int) -> Setup:
    torch.manual_seed(seed)
    deep = config.task == "deep_sigmoid"
    model = MLPModel(32, CLASSES, depth=config.depth, width=64, activation=config.activation, xavier=deep)
    x, y = _clusters(config, seed)
    optimizer = make_optimizer(config, model)
    return Setup(config, model, optimizer, _feature_pipeline(config, seed, x, y), _mlp_loss,
                 scheduler=make_scheduler(config, optimizer), knobs={"temperature": 1.0}, watch=("",))


def _mlp_sites(depth: int) -> dict[str, tuple[Site, ...]]:
    blocks = range(depth)
    return {
        "range": (Site(("logits",), "", ""),),
        "scale": tuple(Site((f"blocks.{k}",), f"blocks.{k}.linear", f"blocks.{k}.linear") for k in blocks),
        "dead": tuple(Site((f"blocks.{k}",), f"blocks.{k}.linear", f"blocks.{k}.act") for k in blocks),
        "saturate": tuple(Site((f"blocks.{k}",), f"blocks.{k}.linear", f"blocks.{k}.act") for k in blocks),
        "freeze": tuple(Site((f"blocks.{k}",), f"blocks.{k}", f"blocks.{k}.linear") for k in blocks),
        "grad": tuple(Site((f"blocks.{k}",), f"blocks.{k}.multiplier", f"blocks.{k - 1}.act")
                      for k in range(1, depth)),
    }


MLP = Family(
    "mlp", "plain MLP (Linear → activation blocks), tensors registered explicitly with a Recorder",
    RECORDER, Config("defaults", "mlp", activation="relu", optimizer="adam", lr=1e-3, batch_size=64, depth=5),
    build_mlp, _mlp_sites(5),
    names={**{f"blocks.{k}.linear": f"blocks.{k}.pre" for k in range(12)},
           **{f"blocks.{k}.act": f"blocks.{k}.out" for k in range(12)}, "": "logits"})


# ---- resmlp ------------------------------------------------------------------------------------------------
def _plain_classifier_loss(setup: Setup, inputs: list[torch.Tensor],
                           target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logits = setup.model(*inputs)
    return classification_loss(setup, logits, target), logits


def build_resmlp(config: Config, seed: int) -> Setup:
    torch.manual_seed(seed)
    model = ResidualMLP(32, CLASSES, depth=config.depth, width=48, activation=config.activation,
                        probabilities=config.task == "softmax_output")
    x, y = _clusters(config, seed)
    optimizer = make_optimizer(config, model)
    return Setup(config, model, optimizer, _feature_pipeline(config, seed, x, y), _plain_classifier_loss,
                 scheduler=make_scheduler(config, optimizer), criterion=_criterion(config, nn.CrossEntropyLoss),
                 watch=("",))


RESMLP = Family(
    "resmlp", "residual MLP with pre-LayerNorm blocks x + fc2(act(fc1(LN(x))))", NEURALDBG,
    Config("defaults", "resmlp", activation="gelu", optimizer="adamw", lr=2e-3, batch_size=64, depth=3,
           loss="hooked"),
    build_resmlp,
    {"scale": tuple(Site((f"blocks.{k}",), f"blocks.{k}.fc2", f"blocks.{k}.fc2") for k in range(3)),
     "dead": tuple(Site((f"blocks.{k}",), f"blocks.{k}.fc1", f"blocks.{k}.act") for k in range(3)),
     "freeze": tuple(Site((f"blocks.{k}",), f"blocks.{k}", f"blocks.{k}.fc1") for k in range(3)),
     "grad": tuple(Site((f"blocks.{k}",), f"blocks.{k}.fc1", f"blocks.{k}.norm") for k in range(3)),
     "range": (Site(("out",), "out", "out"),)})


# ---- autoencoder -------------------------------------------------------------------------------------------
def _autoencoder_loss(setup: Setup, inputs: list[torch.Tensor],
                      target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = inputs[0]
    if setup.config.loss == "custom":
        # denoising with a masked loss, as masked autoencoders do: reconstruct the hidden positions only
        mask = (torch.rand(x.shape, generator=setup.knobs["generator"]) < setup.knobs["mask_ratio"]).float()
        recon = setup.model(x * (1 - mask))
        return ((recon - x) ** 2 * mask).sum() / mask.sum(), recon
    recon = setup.model(x)
    if setup.config.loss in ("hooked", "module"):
        return setup.criterion(recon, x), recon
    return F.mse_loss(recon, x), recon


def build_autoencoder(config: Config, seed: int) -> Setup:
    torch.manual_seed(seed)
    deep = config.task == "deep_sigmoid"
    hidden = (48,) * 6 if deep else (64, 16)
    code_activation = "sigmoid" if config.task == "sigmoid_code" else None
    standardised = config.task.startswith("standardised_")  # targets: standardised features, half negative
    output = {"standardised_relu": "relu", "standardised_linear": None}.get(config.task, "sigmoid")
    model = Autoencoder(32, hidden=hidden, code=6, activation=config.activation, code_activation=code_activation,
                        output_activation=output)
    if deep:
        for module in model.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_normal_(module.weight)
                nn.init.zeros_(module.bias)
    x = data.reconstruction(seed)
    if standardised:
        pipeline = Pipeline([data.sensor_units(torch.logit(x, eps=1e-4), seed)], torch.zeros(len(x)),
                            kind="features", batch_size=config.batch_size, seed=seed)
    else:
        pipeline = Pipeline([(x * 255).round()], torch.zeros(len(x)), kind="unit_features",
                            batch_size=config.batch_size, seed=seed)
    optimizer = make_optimizer(config, model)
    knobs = {"mask_ratio": 0.25, "generator": torch.Generator().manual_seed(30_000 + seed)}
    return Setup(config, model, optimizer, pipeline, _autoencoder_loss, scheduler=make_scheduler(config, optimizer),
                 criterion=_criterion(config, nn.MSELoss), knobs=knobs, watch=("decoder.0", ""))


def _linear_pairs(prefixes: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    return tuple((f"{p}.{i}", f"{p}.{i + 1}") for p in prefixes for i in (0, 2))


AUTOENCODER = Family(
    "autoencoder", "MLP autoencoder (encoder → code with functional dropout → decoder → sigmoid), MSE loss",
    NEURALDBG,
    Config("defaults", "autoencoder", activation="silu", optimizer="adam", lr=2e-3, batch_size=64),
    build_autoencoder,
    {"scale": tuple(Site((a, b), a, a) for a, b in _linear_pairs(("encoder", "decoder"))),
     "dead": tuple(Site((a, b), a, b) for a, b in _linear_pairs(("encoder", "decoder"))),
     "saturate": tuple(Site((a, b), a, b) for a, b in _linear_pairs(("encoder", "decoder"))),
     "freeze": tuple(Site((a,), a, a) for a, _ in _linear_pairs(("encoder", "decoder"))),
     "grad": tuple(Site((a, b), b, a) for a, b in _linear_pairs(("encoder", "decoder"))[1:]),
     "collapse": (Site(("decoder.0", "decoder.1"), "", "decoder.0"),),
     "range": (Site(("decoder.5",), "decoder.5", "decoder.5"),)})


# ---- twobranch ---------------------------------------------------------------------------------------------
def _twobranch_loss(setup: Setup, inputs: list[torch.Tensor],
                    target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    out, out_a, out_b = setup.model(*inputs)
    loss = (F.cross_entropy(out, target) + setup.knobs["weight_a"] * F.cross_entropy(out_a, target)
            + setup.knobs["weight_b"] * F.cross_entropy(out_b, target))
    if setup.config.task == "ogm":
        with torch.no_grad():  # OGM-GE style: slow down the branch that is ahead, for the next step
            score_a = torch.softmax(out_a, 1).gather(1, target[:, None]).sum()
            score_b = torch.softmax(out_b, 1).gather(1, target[:, None]).sum()
            ratio = float(score_a / score_b)
            setup.model.coefficients = [1 - float(torch.tanh(torch.tensor(OGM_ALPHA * max(0.0, ratio - 1)))),
                                        1 - float(torch.tanh(torch.tensor(OGM_ALPHA * max(0.0, 1 / ratio - 1))))]
    return loss, out


def build_twobranch(config: Config, seed: int) -> Setup:
    torch.manual_seed(seed)
    model = TwoBranch((16, 24), 6)
    xa, xb, y = data.two_views(seed)
    pipeline = Pipeline([data.sensor_units(xa, seed), data.sensor_units(xb, seed + 1)], y, kind="features",
                        batch_size=config.batch_size, seed=seed, classes=6)
    if config.task == "unequal":  # view a (into the ReLU branch) kept in 10× larger units, from the start
        mean, std = pipeline.stats[0]
        pipeline.stats[0] = (mean, std / 10)
    optimizer = make_optimizer(config, model)
    if config.task == "slow_branch":
        for group in optimizer.param_groups:
            if group["name"].startswith("branch_a"):
                group["lr"] *= 0.1
    weights = {"weight_a": 2.0, "weight_b": 0.1} if config.task == "unequal" else {"weight_a": 0.5, "weight_b": 0.5}
    return Setup(config, model, optimizer, pipeline, _twobranch_loss, scheduler=make_scheduler(config, optimizer),
                 knobs=weights, watch=("",))


TWOBRANCH = Family(
    "twobranch", "two input views, a ReLU branch and a tanh branch fused by concatenation, auxiliary heads",
    NEURALDBG,
    Config("defaults", "twobranch", optimizer="adamw", lr=2e-3, batch_size=64),
    build_twobranch,
    {"scale": tuple(Site((p,), p, p) for p in ("branch_a.0", "branch_a.2", "branch_b.0", "branch_b.2")),
     "explode": tuple(Site((p,), p, p) for p in ("branch_a.0", "branch_a.2")),
     "dead": tuple(Site((a, b), a, b) for a, b in (("branch_a.0", "branch_a.1"), ("branch_a.2", "branch_a.3"))),
     "saturate": tuple(Site((a, b), a, b) for a, b in (("branch_b.0", "branch_b.1"),
                                                       ("branch_b.2", "branch_b.3"))),
     "freeze": tuple(Site((p,), p, p) for p in ("branch_a.0", "branch_a.2", "branch_b.0", "branch_b.2")),
     "grad": (Site(("branch_a",), "branch_a", "branch_a.3"), Site(("branch_b",), "branch_b", "branch_b.3")),
     "branch": (Site(("branch_a", "head_a"), "a", "branch_a.0"), Site(("branch_b", "head_b"), "b", "branch_b.0"))})

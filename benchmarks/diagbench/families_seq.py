"""The image, sequence and token families: ``cnn``, ``rnn``, ``transformer`` (all recorded by ``NeuralDbg``
at its defaults). Each builds its ``Setup`` and lists its sites."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.diagbench import data
from benchmarks.diagbench.families import NEURALDBG, Family, Site
from benchmarks.diagbench.families_dense import classification_loss
from benchmarks.diagbench.models_seq import SequenceClassifier, SmallResNet, TokenTagger
from benchmarks.diagbench.pipeline import Pipeline
from benchmarks.diagbench.setup import Config, Setup, make_optimizer, make_scheduler

IMAGE_CLASSES, SEQUENCE_CLASSES, TAGS = 6, 4, 2


def _loss(setup: Setup, inputs: list[torch.Tensor], target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logits = setup.model(*inputs)
    return classification_loss(setup, logits, target), logits


def _criterion(config: Config) -> nn.Module | None:
    return nn.CrossEntropyLoss() if config.loss in ("hooked", "module") else None


# ---- cnn ---------------------------------------------------------------------------------------------------
def build_cnn(config: Config, seed: int) -> Setup:
    torch.manual_seed(seed)
    model = SmallResNet(IMAGE_CLASSES, probabilities=config.task == "softmax_output")
    images, y = data.prototype_images(seed)
    pipeline = Pipeline([images], y, kind="images", batch_size=config.batch_size, seed=seed, classes=IMAGE_CLASSES)
    optimizer = make_optimizer(config, model)
    return Setup(config, model, optimizer, pipeline, _loss, scheduler=make_scheduler(config, optimizer),
                 criterion=_criterion(config), watch=("",))


CNN = Family(
    "cnn", "2-D ResNet-style CNN: conv-BatchNorm-ReLU stem, two basic blocks with shortcuts, max-pool, "
           "global average pool", NEURALDBG,
    Config("defaults", "cnn", optimizer="sgd", lr=0.05, batch_size=32, loss="module"),
    build_cnn,
    {"scale": tuple(Site((b,), f"{b}.{bn}", f"{b}.{bn}") for b, bn in (("stem", "bn"), ("block1", "bn2"),
                                                                         ("block2", "bn2"))),
     "dead": tuple(Site((b,), f"{b}.{bn}", f"{b}.{relu}") for b, bn, relu in (("stem", "bn", "relu"),
                                                                               ("block1", "bn1", "relu1"),
                                                                               ("block2", "bn1", "relu1"))),
     "freeze": tuple(Site((b,), b, f"{b}.{conv}") for b, conv in (("stem", "conv"), ("block1", "conv1"),
                                                                   ("block2", "conv1"))),
     "grad": (Site(("block1",), "block1.bn1", "block1.conv1"), Site(("block2",), "block2.bn1", "block2.conv1")),
     "range": (Site(("out",), "out", "out"),)})


# ---- rnn ---------------------------------------------------------------------------------------------------
def build_rnn(config: Config, seed: int) -> Setup:
    torch.manual_seed(seed)
    model = SequenceClassifier(4, SEQUENCE_CLASSES, cell=config.cell)
    x, y = data.sequences(seed)
    if config.task == "noisy":  # 40 % random labels: the loss plateaus early
        g = torch.Generator().manual_seed(seed)
        noise = torch.randint(0, SEQUENCE_CLASSES, y.shape, generator=g)
        y = torch.where(torch.rand(len(y), generator=g) < 0.4, noise, y)
    pipeline = Pipeline([x * 20 + 5], y, kind="sequences", batch_size=config.batch_size, seed=seed,
                        classes=SEQUENCE_CLASSES)
    optimizer = make_optimizer(config, model)
    return Setup(config, model, optimizer, pipeline, _loss, scheduler=make_scheduler(config, optimizer),
                 criterion=_criterion(config), watch=("",))


RNN = Family(
    "rnn", "GRU/LSTM sequence classifier (tanh input projection, recurrent layer, head on the last step)",
    NEURALDBG,
    Config("defaults", "rnn", optimizer="adam", lr=3e-3, batch_size=32),
    build_rnn,
    {"scale": (Site(("inp", "act"), "inp", "act"),),
     "saturate": (Site(("inp", "act"), "inp", "act"),),
     "freeze": tuple(Site((p,), p, p) for p in ("inp", "rnn", "head")),
     "grad": (Site(("inp", "act"), "act", "inp"),)})


# ---- transformer -------------------------------------------------------------------------------------------
def _tagging_loss(setup: Setup, inputs: list[torch.Tensor], target: torch.Tensor) -> tuple[torch.Tensor,
                                                                                          torch.Tensor]:
    logits = setup.model(*inputs)
    flat, labels = logits.flatten(0, 1), target.flatten()
    if setup.config.loss in ("hooked", "module"):
        return setup.criterion(flat, labels), logits
    return F.cross_entropy(flat, labels), logits


def build_transformer(config: Config, seed: int) -> Setup:
    torch.manual_seed(seed)
    model = TokenTagger(24, 16, TAGS, depth=config.depth, activation=config.activation)
    tokens, labels = data.token_sequences(seed)
    pipeline = Pipeline([tokens], labels, kind="tokens", batch_size=config.batch_size, seed=seed)
    optimizer = make_optimizer(config, model)
    return Setup(config, model, optimizer, pipeline, _tagging_loss, scheduler=make_scheduler(config, optimizer),
                 criterion=_criterion(config), watch=("tok", ""))


TRANSFORMER = Family(
    "transformer", "pre-LN Transformer encoder tagging tokens (embeddings, masked self-attention, GELU MLP)",
    NEURALDBG,
    Config("defaults", "transformer", activation="gelu", optimizer="adamw", lr=2e-3, batch_size=32, depth=2),
    build_transformer,
    {"scale": tuple(Site((f"blocks.{k}",), f"blocks.{k}.mlp.fc2", f"blocks.{k}.mlp.fc2") for k in range(2)),
     "dead": tuple(Site((f"blocks.{k}",), f"blocks.{k}.mlp.fc1", f"blocks.{k}.mlp.act") for k in range(2)),
     "freeze": tuple(Site((f"blocks.{k}",), f"blocks.{k}", f"blocks.{k}.mlp.fc1") for k in range(2)),
     "grad": tuple(Site((f"blocks.{k}",), f"blocks.{k}.mlp.fc1", f"blocks.{k}.ln2") for k in range(2)),
     "collapse": (Site(("tok",), "tok", "tok"),)})

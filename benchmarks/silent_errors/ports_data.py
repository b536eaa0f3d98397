"""Port of pytorch-84803 (with baichuan2-86 and pytorch-96600, the same fault): data lost in transfers.

The original fine-tunes m2m100 for translation with the Hugging Face Trainer and mimics a faulty GPU
peer-to-peer link by monkey-patching ``torch.Tensor.to`` and the collectives so that 1 % of the tensors they
move are zeroed in place. Here the corrupting function is the original's, applied where the Trainer moves
each batch tensor (``input_ids``, ``attention_mask``, ``labels``) with ``Tensor.to``; it is not patched into
every ``Tensor.to`` of the process, so the recorder's own conversions stay intact. The model is a small
encoder–decoder Transformer of m2m100's kind; the data a synthetic translation (reverse and shift).
"""
from __future__ import annotations

import math
import random
from pathlib import Path

import torch
from torch import nn

from benchmarks.silent_errors.cases import Outcome
from benchmarks.silent_errors.data import token_pairs
from comgra_ndbg import NeuralDbg

__all__ = ["TinyTranslator", "pretrained", "randomly_corrupt_data", "transfer_data_loss", "STEPS", "LOSS_RATE"]

STEPS = 80
LOSS_RATE = 0.01
"""The original's failure rate of a transfer."""
VOCABULARY, LENGTH, BATCH = 16, 8, 16
PRETRAIN_STEPS = 150


def randomly_corrupt_data(data: torch.Tensor) -> bool:
    """The original's fault: with probability :data:`LOSS_RATE` zero the tensor in place (returns whether)."""
    if random.random() < LOSS_RATE:
        data.zero_()
        return True
    return False


class TinyTranslator(nn.Module):
    """m2m100 in small: a shared token embedding (scaled by √d as m2m100 does), learned positions, a one-layer
    encoder–decoder Transformer, an output head; ``attention_mask`` masks keys additively, as Hugging Face
    models do (a mask of zeros leaves attention uniform rather than undefined)."""

    def __init__(self, vocabulary: int = VOCABULARY, d_model: int = 32, max_length: int = 16) -> None:
        super().__init__()
        self.scale = math.sqrt(d_model)
        self.shared = nn.Embedding(vocabulary, d_model, padding_idx=0)
        self.positions = nn.Embedding(max_length, d_model)
        self.transformer = nn.Transformer(d_model, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                                          dim_feedforward=64, dropout=0.0, batch_first=True,
                                          norm_first=True)
        self.lm_head = nn.Linear(d_model, vocabulary)

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.shared(ids) * self.scale + self.positions(torch.arange(ids.shape[1]))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                decoder_input_ids: torch.Tensor) -> torch.Tensor:
        length = decoder_input_ids.shape[1]
        causal = torch.triu(torch.full((length, length), -1e9), diagonal=1)
        padding = (1.0 - attention_mask.float()) * -1e9
        hidden = self.transformer(self._embed(input_ids), self._embed(decoder_input_ids), tgt_mask=causal,
                                  src_key_padding_mask=padding, memory_key_padding_mask=padding)
        return self.lm_head(hidden)


def _loss(model: TinyTranslator, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    labels = batch["labels"]
    decoder_input_ids = torch.cat([torch.zeros_like(labels[:, :1]), labels[:, :-1]], 1)
    logits = model(batch["input_ids"], batch["attention_mask"], decoder_input_ids)
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


def pretrained(seed: int = 0) -> TinyTranslator:
    """The stand-in for ``from_pretrained``: the translator trained on clean batches (AdamW, lr 1e-2) until
    it translates, before the fine-tuning run that the fault hits."""
    torch.manual_seed(seed)
    model = TinyTranslator()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for source, target in token_pairs(VOCABULARY, LENGTH, BATCH, PRETRAIN_STEPS, seed=seed + 1000):
        loss = _loss(model, {"input_ids": source, "attention_mask": torch.ones_like(source), "labels": target})
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model


def transfer_data_loss(variant: str, folder: Path, *, steps: int = STEPS, seed: int = 0) -> Outcome:
    """Fine-tune the :func:`pretrained` translator (AdamW, lr 1e-3, batch 16) moving each batch tensor
    through the corrupting transfer (``buggy``) or a healthy one (``fixed``).

    Symptoms: ``corrupted_steps``, how many steps had a batch tensor zeroed; ``zeroed_<name>``, how often
    each batch tensor was; ``loss_corrupted_max`` against ``loss_clean_median``, what a zeroed batch does to
    the loss. ``first_effect`` is the first step whose ``input_ids`` or ``labels`` were zeroed: a zeroed
    ``attention_mask`` alone adds the same -1e9 to every key, which leaves the softmax, and so training,
    exactly as it was."""
    model = pretrained(seed)
    random.seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    corrupted: list[int] = []
    hits: list[list[str]] = []
    zeroed = dict.fromkeys(("input_ids", "attention_mask", "labels"), 0)
    with NeuralDbg(model, folder, trial=variant, optimizer=optimizer) as dbg:
        model.train()
        for step, (source, target) in enumerate(token_pairs(VOCABULARY, LENGTH, BATCH, steps, seed=seed + 1)):
            batch = {"input_ids": source, "attention_mask": torch.ones_like(source), "labels": target}
            if variant == "buggy":
                hit = [name for name, tensor in batch.items() if randomly_corrupt_data(tensor.data)]
                corrupted += [step] if hit else []
                hits += [hit] if hit else []
                zeroed.update({name: zeroed[name] + 1 for name in hit})
            loss = _loss(model, {k: v.to("cpu") for k, v in batch.items()})
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    clean = [x for step, x in enumerate(losses) if step not in corrupted]
    effective = [step for step, names in zip(corrupted, hits) if set(names) & {"input_ids", "labels"}]
    symptom = {"corrupted_steps": float(len(corrupted)), **{f"zeroed_{k}": float(v) for k, v in zeroed.items()},
               "loss_corrupted_max": max((losses[s] for s in corrupted), default=0.0),
               "loss_clean_median": sorted(clean)[len(clean) // 2]}
    return Outcome((dbg.path,), effective[0] if effective else None, symptom)

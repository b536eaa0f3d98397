"""Port of x-jxmnop-ddp-out-of-sync: a model wrapped in ``DistributedDataParallel`` on some steps only.

The original (a Hugging Face ``Trainer`` subclass fine-tuning BERT with a contrastive loss) picks the model
for each step with ``get_model_ddp_or_not(step)``: the plain module on even steps, a fresh ``DDP(model)`` on
odd ones, so on even steps the gradients are never averaged and the replicas drift apart (each new DDP
wrapper then broadcasts rank 0's weights again). The fixed script wraps once. Here two CPU processes train
a small Transformer encoder of BERT's kind over gloo, on different synthetic token batches per rank, with
the original's loss, AdamW at the Trainer's default learning rate, and 8 samples per device. Both ranks
record into one trial per variant (``<variant>/rank<r>/``) by ``NeuralDbg`` at its defaults, so the analysis
compares them.
"""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn, optim
from torch.nn.parallel import DistributedDataParallel as DDP

from benchmarks.silent_errors.cases import Outcome
from comgra_ndbg import NeuralDbg

__all__ = ["TinyBert", "ddp_wrapped_sometimes", "STEPS", "WORLD_SIZE"]

STEPS = 60
WORLD_SIZE = 2
VOCABULARY, LENGTH, BATCH = 64, 12, 8


class TinyBert(nn.Module):
    """BERT in small: token and position embeddings, LayerNorm, one encoder layer; returns the last hidden
    state as ``AutoModel`` does."""

    def __init__(self, vocabulary: int = VOCABULARY, d_model: int = 32, max_length: int = 32) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocabulary, d_model, padding_idx=0)
        self.position_embeddings = nn.Embedding(max_length, d_model)
        self.embeddings_norm = nn.LayerNorm(d_model)
        self.encoder = nn.TransformerEncoderLayer(d_model, nhead=2, dim_feedforward=64, dropout=0.0,
                                                  batch_first=True)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1])
        hidden = self.embeddings_norm(self.word_embeddings(input_ids) + self.position_embeddings(positions))
        return self.encoder(hidden, src_key_padding_mask=(1.0 - attention_mask.float()) * -1e9)


def _compute_contrastive_loss(model: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The original's loss: mean-pooled embeddings, their similarity matrix, the two halves of the batch as
    positive pairs."""
    outputs = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
    embeddings = outputs.mean(dim=1)
    batch_size = embeddings.size(0)
    labels = torch.cat([torch.arange(batch_size // 2), torch.arange(batch_size // 2)])
    contrastive_loss_fn = nn.CrossEntropyLoss()
    similarities = torch.matmul(embeddings, embeddings.T)
    return contrastive_loss_fn(similarities, labels)


def _replica_gap(model: nn.Module) -> float:
    """The largest difference between this rank's parameters and any other rank's."""
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flat)
    return max(float((g - flat).abs().max()) for g in gathered)


def _worker(rank: int, variant: str, folder: str, steps: int, port: int) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    try:
        torch.manual_seed(0)  # the same initial weights on every rank, as from_pretrained gives
        model = TinyBert()
        wrapped = DDP(model) if variant == "fixed" else None

        def get_model_ddp_or_not(step: int) -> nn.Module:
            if step % 2 == 0:  # sometimes nn.Module, sometimes DDP
                return model
            return DDP(model)

        optimizer = optim.AdamW(model.parameters(), lr=5e-5)
        generator = torch.Generator().manual_seed(100 + rank)  # each rank its own shard of the data
        gaps = []
        with NeuralDbg(model, folder, trial=variant, optimizer=optimizer):
            model.train()
            for step in range(steps):
                ids = torch.randint(1, VOCABULARY, (BATCH, LENGTH), generator=generator)
                inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
                buggy_model = get_model_ddp_or_not(step) if wrapped is None else wrapped
                loss = _compute_contrastive_loss(buggy_model, inputs)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                gaps.append(_replica_gap(model))
        if rank == 0:
            Path(folder, f"{variant}-symptom.json").write_text(json.dumps(gaps))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ddp_wrapped_sometimes(variant: str, folder: Path, *, steps: int = STEPS) -> Outcome:
    """Train on :data:`WORLD_SIZE` gloo processes. Symptom ``replica_gap``: the largest difference between
    the ranks' parameters after any step (0 while the replicas stay in sync); ``first_effect`` is the first
    step after which they differ."""
    folder.mkdir(parents=True, exist_ok=True)
    mp.start_processes(_worker, args=(variant, str(folder), steps, _free_port()), nprocs=WORLD_SIZE,
                       join=True, start_method="spawn")
    gaps = json.loads((folder / f"{variant}-symptom.json").read_text())
    first = next((step for step, gap in enumerate(gaps) if gap > 0), None)
    return Outcome((folder / variant,),
                   first if variant == "buggy" else None,
                   {"replica_gap": max(gaps), "replica_gap_last": gaps[-1]})

"""Two gloo ranks on the CPU, each recording the same DDP training loop with NeuralDbg: ``healthy`` keeps
the ranks in sync, ``desync`` edits one weight on rank 1 after step 1; ``stall`` trains without DDP (and
without collectives, with a learning rate of 0 so the parameters stay equal) and rank 1 leaves its loop
after 2 steps (``tests/test_distributed.py``).

Run as ``python tests/ddp_run.py <folder> <port>``; it exits non-zero when a rank fails.
"""
from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

WORLD_SIZE = 2
STEPS = 4
DESYNC_STEP = 1  # rank 1's weight is edited after this step's update


def train(folder: str, trial: str, rank: int, *, desync: bool) -> None:
    from comgra_ndbg import NeuralDbg

    torch.manual_seed(0)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    ddp = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    criterion = nn.CrossEntropyLoss()
    data = torch.Generator().manual_seed(100 + rank)  # each rank its own shard
    with NeuralDbg(ddp, folder, trial=trial, optimizer=optimizer):
        for step in range(STEPS):
            optimizer.zero_grad()
            loss = criterion(ddp(torch.randn(16, 4, generator=data)), torch.randint(0, 2, (16,), generator=data))
            loss.backward()
            optimizer.step()
            if desync and rank == 1 and step == DESYNC_STEP:
                with torch.no_grad():
                    model[0].weight[0, 0] += 0.01


def stall(folder: str, rank: int) -> None:
    from comgra_ndbg import NeuralDbg

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    data = torch.Generator().manual_seed(100 + rank)
    with NeuralDbg(model, folder, trial="stall", optimizer=optimizer):
        for _ in range(STEPS if rank == 0 else 2):
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(torch.randn(16, 4, generator=data)),
                                               torch.randint(0, 2, (16,), generator=data))
            loss.backward()
            optimizer.step()


def worker(rank: int, folder: str, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    try:
        train(folder, "healthy", rank, desync=False)
        train(folder, "desync", rank, desync=True)
        stall(folder, rank)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(sys.argv[1], int(sys.argv[2])), nprocs=WORLD_SIZE)

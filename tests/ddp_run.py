"""Two gloo ranks on the CPU, each recording the same DDP training loop with NeuralDbg: ``healthy`` keeps
the ranks in sync, ``desync`` edits one weight on rank 1 after step 1; ``stall`` trains without DDP (and
without collectives, with a learning rate of 0 so the parameters stay equal) and rank 1 leaves its loop
after 2 steps; ``partial`` wraps the model in DDP on rank 0 only (over a process group of rank 0 alone, so
nothing waits for rank 1). The healthy loop also runs bare first, and every Python-level collective call of
``torch.distributed`` is counted in both runs; each rank writes the counts to ``collectives<rank>.json``
(``tests/test_distributed.py``).

Run as ``python tests/ddp_run.py <folder> <port>``; it exits non-zero when a rank fails.
"""
from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

WORLD_SIZE = 2
STEPS = 4
DESYNC_STEP = 1  # rank 1's weight is edited after this step's update


COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "all_to_all",
               "all_to_all_single", "barrier", "monitored_barrier", "broadcast", "broadcast_object_list", "gather",
               "gather_object", "reduce", "reduce_scatter", "reduce_scatter_tensor", "scatter", "scatter_object_list",
               "send", "recv", "isend", "irecv", "batch_isend_irecv")


@contextmanager
def counting_collectives() -> Iterator[list[str]]:
    """Every call of a ``torch.distributed`` collective or point-to-point function made inside the block, by
    name (patched in ``torch.distributed`` and ``distributed_c10d``, where each is defined)."""
    calls: list[str] = []
    c10d = dist.distributed_c10d
    patched = []
    for name in COLLECTIVES:
        original = getattr(c10d, name, None)
        if original is None:
            continue

        @functools.wraps(original)
        def counted(*args, _name=name, _original=original, **kwargs):
            calls.append(_name)
            return _original(*args, **kwargs)

        for module in (dist, c10d):
            if getattr(module, name, None) is original:
                patched.append((module, name, original))
                setattr(module, name, counted)
    try:
        yield calls
    finally:
        for module, name, original in patched:
            setattr(module, name, original)


def train(folder: str, trial: str, rank: int, *, desync: bool = False, record: bool = True,
          process_group: object = None, wrap: bool = True) -> None:
    from comgra_ndbg import NeuralDbg

    torch.manual_seed(0)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    ddp = nn.parallel.DistributedDataParallel(model, process_group=process_group) if wrap else model
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    criterion = nn.CrossEntropyLoss()
    data = torch.Generator().manual_seed(100 + rank)  # each rank its own shard
    with NeuralDbg(ddp, folder, trial=trial, optimizer=optimizer, enabled=record):
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
        with counting_collectives() as bare:
            train(folder, "bare", rank, record=False)
        with counting_collectives() as recorded:
            train(folder, "healthy", rank)
        with counting_collectives() as probe:  # the counting itself sees a collective
            dist.barrier()
        with open(os.path.join(folder, f"collectives{rank}.json"), "w") as out:
            json.dump({"bare": bare, "recorded": recorded, "probe": probe}, out)
        train(folder, "desync", rank, desync=True)
        stall(folder, rank)
        alone = dist.new_group([0])  # every rank takes part in making a group, members or not
        train(folder, "partial", rank, process_group=alone, wrap=rank == 0)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(sys.argv[1], int(sys.argv[2])), nprocs=WORLD_SIZE)

"""Which rank of a distributed run this process is, found without any collective call.

Under ``torch.distributed`` every rank records its own trial folder ``<trial>/rank<r>/`` (see
``store/ranks.py``). The rank and world size come from ``torch.distributed`` when its process group is
initialised, else from the variables every launcher sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``; torchrun
also ``TORCHELASTIC_RUN_ID``), so a recorder created before ``init_process_group`` finds them too. Nothing
here talks to the other ranks: a rank that records while another does not can never hang the job.

>>> info = detect_rank({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"})
>>> info.rank, info.world_size, info.source
(1, 2, 'env')
>>> detect_rank({}) is None
True
"""
from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

__all__ = ["RankInfo", "detect_rank", "shared_trial_name", "is_ddp_wrapped", "unwrap_ddp"]


@dataclass(frozen=True)
class RankInfo:
    """This process' place in a distributed run: ``rank`` of ``world_size``, ``local_rank`` on its machine,
    where the numbers came from (``torch.distributed`` or ``env``) and the launcher's run id (or None)."""

    rank: int
    world_size: int
    local_rank: int
    source: str
    run_id: str | None = None

    def as_config(self) -> dict[str, int | str | None]:
        """The fields written into the recording's ``config`` attribute."""
        return {"rank": self.rank, "world_size": self.world_size, "local_rank": self.local_rank,
                "rank_source": self.source, "run_id": self.run_id}


def detect_rank(environ: Mapping[str, str] | None = None) -> RankInfo | None:
    """The rank of this process in a run of more than one process, or None for a single-process run.

    ``torch.distributed`` is asked first (when available and initialised); else ``environ`` (default
    ``os.environ``). Values that are not integers, or a rank outside ``[0, world_size)``, count as no
    distributed run: recording then goes on as a single process rather than failing the training job.
    """
    env = os.environ if environ is None else environ
    run_id = env.get("TORCHELASTIC_RUN_ID") or None
    if run_id == "none":
        run_id = None
    local = _int(env.get("LOCAL_RANK"))
    if environ is None and torch.distributed.is_available() and torch.distributed.is_initialized():
        rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
        source = "torch.distributed"
    else:
        rank, world = _int(env.get("RANK")), _int(env.get("WORLD_SIZE"))
        source = "env"
    if rank is None or world is None or world <= 1 or not 0 <= rank < world:
        return None
    return RankInfo(rank, world, rank if local is None else local, source, run_id)


def shared_trial_name(info: RankInfo, environ: Mapping[str, str] | None = None, *, prefix: str = "trial") -> str:
    """A trial name every rank of one launch derives alike without talking to the others: from the
    launcher's run id when it has one, else from the start time and pid of the parent process (the
    launcher that spawned the local ranks). Ranks on several machines without a run id should pass
    ``trial=`` themselves."""
    env = os.environ if environ is None else environ
    if info.run_id:
        return f"{prefix}-{_safe(info.run_id)}"
    parent = os.getppid()
    started = _process_start(parent)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(started)) if started is not None else "launch"
    port = _safe(env.get("MASTER_PORT", ""))
    return f"{prefix}-{stamp}-p{parent}" + (f"-{port}" if port else "")


def is_ddp_wrapped(model: nn.Module) -> bool:
    """Whether ``model`` (or the module ``torch.compile`` wraps) is a ``DistributedDataParallel``."""
    module = model
    while isinstance(getattr(module, "_orig_mod", None), nn.Module):
        module = module._orig_mod
    return isinstance(module, nn.parallel.DistributedDataParallel)


def unwrap_ddp(model: nn.Module) -> nn.Module:
    """The module a ``DistributedDataParallel`` wraps (``model`` itself otherwise), so parameter and node
    names are the same on ranks with and without the wrapper."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text)[:60]


def _process_start(pid: int) -> float | None:
    """Unix time process ``pid`` started (Linux ``/proc``), or None where that cannot be read."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        ticks = int(fields[19])  # field 22 of stat: start time in clock ticks after boot
        boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))  # an integer every process reads alike
        return boot + ticks // os.sysconf("SC_CLK_TCK")
    except StopIteration:
        return None
    except (OSError, ValueError, IndexError):
        return None

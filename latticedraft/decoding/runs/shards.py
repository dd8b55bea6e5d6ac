"""Sharding a prompt set over the processes of ``torchrun`` (or ``accelerate launch``).

The launcher sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and the rendezvous variables; without
them the run is one process (rank 0 of 1) and ``torch.distributed`` is never touched. The one
collective is the barrier before rank 0 merges the part files: gloo on CPU, nccl on CUDA.
A prompt belongs to rank ``crc32(json(id)) % world_size``: deterministic in the id alone, so a
resumed run (same world size) gives every rank the same prompts again.
"""

from __future__ import annotations

import json
import os
import zlib
from dataclasses import dataclass
from datetime import timedelta

from latticedraft.errors import InputError

# a rank that finishes its shard early waits at the barrier for the slowest one; the launcher
# ends every rank when one fails, so the wait needs no short limit of its own
BARRIER_TIMEOUT = timedelta(days=7)


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


def world_from_env(env=None) -> World:
    """This process's place in the launcher's world (rank 0 of 1 when not launched by one)."""
    env = os.environ if env is None else env
    try:
        size = int(env.get("WORLD_SIZE", "1"))
        rank = int(env.get("RANK", "0"))
        local = int(env.get("LOCAL_RANK", str(rank)))
    except ValueError:
        raise InputError(f"WORLD_SIZE={env.get('WORLD_SIZE')!r} RANK={env.get('RANK')!r}: not integers; "
                         "start the run with torchrun or without these variables") from None
    if size < 1 or not 0 <= rank < size:
        raise InputError(f"RANK={rank} is outside WORLD_SIZE={size}; start the run with torchrun")
    return World(rank, size, local)


def shard_of(prompt_id, world_size: int) -> int:
    """The rank that decodes ``prompt_id``: ``crc32`` of its JSON text, modulo the world size."""
    return zlib.crc32(json.dumps(prompt_id).encode()) % world_size


def device_for(world: World, device: str | None) -> str | None:
    """``--device cuda`` under a launcher means this rank's GPU, ``cuda:LOCAL_RANK``."""
    if world.distributed and device == "cuda":
        return f"cuda:{world.local_rank}"
    return device


def init(world: World, device: str | None) -> None:
    """Join the launcher's process group (env:// rendezvous) when there is more than one process."""
    if not world.distributed:
        return
    import torch.distributed as dist

    if not dist.is_initialized():
        backend = "nccl" if device is not None and str(device).startswith("cuda") else "gloo"
        dist.init_process_group(backend=backend, timeout=BARRIER_TIMEOUT)


def barrier(world: World, device: str | None) -> None:
    """Wait until every rank got here (no-op for one process)."""
    if not world.distributed:
        return
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        dist.barrier(device_ids=[world.local_rank])
    else:
        dist.barrier()


def finish(world: World) -> None:
    if world.distributed:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()

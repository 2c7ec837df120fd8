"""Several processes, one run: torch.distributed's own launcher (torchrun) and DDP.

The supervisor launches an attempt through `python -m torch.distributed.run` when the device
preset asks for more than one process (engine.run.launchers.torchrun); every worker runs
engine.train.trainer, which finds its rank here. Rank 0 writes the run's checkpoints and evals;
each machine's local rank 0 speaks for its machine (its steps, in its node's run directory:
engine.run.launchers.node), the other ranks write heartbeats.
A step's global group of samples is split across ranks so that the averaged gradient is the
one a single process would compute over the same samples: a resume, or a fallback to one
process, continues at the same sample with the same effective batch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any


@dataclass
class World:
    rank: int = 0
    local_rank: int = 0
    size: int = 1
    control: Any = None   # a gloo group for host-side agreement (stop flags), no device sync
    node_rank: int = 0    # this machine's place in the rendezvous (torchrun's GROUP_RANK)
    local_size: int = 1   # processes on this machine

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def speaks(self) -> bool:
        """Speaks for its machine: its steps reach the supervisor on this machine."""
        return self.local_rank == 0

    @property
    def nodes(self) -> int:
        return max(1, self.size // max(1, self.local_size))

    @classmethod
    def from_env(cls, device_type: str) -> "World":
        """The world torchrun set up (RANK, WORLD_SIZE, LOCAL_RANK), or a world of one."""
        size = int(os.environ.get("WORLD_SIZE", "1"))
        if size == 1:
            return cls()
        import torch.distributed as dist

        backend = "nccl" if device_type == "cuda" else "gloo"
        dist.init_process_group(backend=backend)
        control = dist.new_group(backend="gloo") if backend != "gloo" else None
        return cls(rank=dist.get_rank(), local_rank=int(os.environ.get("LOCAL_RANK", "0")),
                   size=size, control=control, node_rank=int(os.environ.get("GROUP_RANK", "0")),
                   local_size=int(os.environ.get("LOCAL_WORLD_SIZE", str(size))))

    def any(self, flag: bool) -> bool:
        """True on every rank if it is true on any (a stop request reaches one process first)."""
        if self.size == 1:
            return flag
        import torch
        import torch.distributed as dist

        t = torch.tensor([int(flag)])
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.control)
        return bool(t.item())

    def share(self, start: int, count: int) -> tuple[int, int]:
        """This rank's contiguous part of positions [start, start+count): (first, length)."""
        base, extra = divmod(count, self.size)
        first = start + self.rank * base + min(self.rank, extra)
        return first, base + (1 if self.rank < extra else 0)

    def micro_batches(self, count: int, batch_size: int) -> int:
        """Micro-batches per rank for a group of `count`: the same on every rank, so each
        rank's gradient all-reduce happens at the same micro-batch."""
        largest = -(-count // self.size)
        return max(1, -(-largest // batch_size))

    def close(self) -> None:
        if self.size > 1:
            import torch.distributed as dist

            if dist.is_initialized():
                try:
                    dist.destroy_process_group()
                except Exception:   # a peer that ended first: at the end, no failure of ours
                    pass

"""Where this process stands in a ``torchrun`` job, and what every rank must agree on.

Without torchrun the world is one process and every helper here is a no-op. Under torchrun training
uses gloo on the CPU and nccl on CUDA GPUs; rank 0 alone writes files.
"""

from __future__ import annotations

import dataclasses
import os

import torch
import torch.distributed as dist

from ..inference.device import pick_device

__all__ = ["Dist", "init_distributed", "close_distributed", "set_threads", "agree", "broadcast_path", "all_sum",
           "broadcast_module"]


@dataclasses.dataclass
class Dist:
    """This process's place in the job (world 1 without torchrun)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0


def init_distributed(device_name: str) -> tuple[Dist, torch.device]:
    """(this process's place, its device); joins the process group when started by torchrun."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist(), pick_device(device_name)
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    device = pick_device(device_name)
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return Dist(rank, world, local_rank), device


def close_distributed(ctx: Dist) -> None:
    if ctx.world > 1 and dist.is_initialized():
        dist.destroy_process_group()


def set_threads(threads: int, ctx: Dist) -> None:
    """``threads`` intra-op threads, or (0) all cores, shared between the local processes of a job."""
    if threads:
        torch.set_num_threads(threads)
    elif ctx.world > 1:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", ctx.world))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local))


def agree(value: int, ctx: Dist) -> int:
    """Rank 0's ``value`` on every rank (each rank times its own epochs; they must stop together)."""
    if ctx.world == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64)
    dist.broadcast(t, src=0)
    return int(t.item())


def broadcast_path(path: str, ctx: Dist) -> str:
    """Rank 0's ``path`` on every rank (the run folder's name is made on rank 0)."""
    if ctx.world == 1:
        return path
    names = [path]
    dist.broadcast_object_list(names, src=0)
    return names[0]


def all_sum(totals: torch.Tensor, ctx: Dist) -> torch.Tensor:
    """``totals`` summed over the ranks, in place."""
    if ctx.world > 1:
        dist.all_reduce(totals)
    return totals


def broadcast_module(module: torch.nn.Module, ctx: Dist) -> None:
    """Every process takes rank 0's parameters and buffers of ``module`` (after work that each did alone, e.g. the
    head start, so that the replicas start end to end from the same weights)."""
    if ctx.world > 1:
        for tensor in module.state_dict().values():
            dist.broadcast(tensor, src=0)

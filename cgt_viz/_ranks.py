"""The processes of a run: under torchrun, one process group per run (nccl on CUDA, gloo on CPU) and the
device of each rank; a single process otherwise. `train` and the head trainer (cgt_viz.hf.distill) both run in it.
"""
from __future__ import annotations

import contextlib
import datetime
import os

import torch
import torch.distributed as dist

from ._checks import check_device


@contextlib.contextmanager
def process_group(device: str | torch.device, timeout_minutes: float | None = None):
    """(dev, distributed, rank, world) of this process. Under torchrun (WORLD_SIZE > 1) a process group is
    started (nccl on CUDA, one GPU per rank; gloo on CPU) and destroyed on leaving; a group the caller set up is
    used as it is. Also the head trainer's (cgt_viz.hf.distill), whose rank 0 may build a feature cache for
    longer than torch's default collective timeout while the others wait: hence timeout_minutes."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    dev = check_device("device", device, allow_auto=True)
    own_group = world > 1 and not dist.is_initialized()
    if own_group:
        if dev.type == "cuda":
            dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(dev)
        extra = {} if timeout_minutes is None else {"timeout": datetime.timedelta(minutes=timeout_minutes)}
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", **extra)
    distributed = dist.is_initialized() and dist.get_world_size() > 1
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    if distributed and dev.type == "cuda" and dev.index is None:  # a group the caller set up: one GPU per rank
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(dev)
    try:
        yield dev, distributed, rank, world
    finally:
        if own_group and dist.is_initialized():
            dist.destroy_process_group()

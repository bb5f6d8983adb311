"""The same MLP trained data-parallel with torch.distributed over several ranks: NCCL on the leased
GPUs where CUDA sees them, gloo on the CPU otherwise (``--device cpu`` forces the CPU).

Submitted with ``--distributed``, a worker agent starts one process per granted GPU (fake or real)
with ``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE`` set, on one node
(rendezvous on 127.0.0.1 and a free port) or several. Without it the job is one process, a world of
one, seeing all its GPUs. On a revoke every rank stops after the same iteration (two-phase
preemption) and rank 0 writes the one checkpoint that every rank restores from.

    roundhouse submit --name ddp --gpus 2 --distributed -- python examples/train_ddp.py --iterations 2000

Standalone, two ranks on this machine:

    MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 WORLD_SIZE=2 RANK=0 python examples/train_ddp.py &
    MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 WORLD_SIZE=2 RANK=1 python examples/train_ddp.py
"""

from __future__ import annotations

import argparse
import datetime
import gc

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from train_mlp import fit, make_data, make_loader, make_model, parse_args, pick_device

from roundhouse import train


def train_ranks(args: argparse.Namespace, job: train.Job, device: torch.device) -> float | None:
    """This rank's share of the training; the DDP model (which holds the process group) lives only here."""
    device_ids = [device] if device.type == "cuda" else None
    model = DistributedDataParallel(make_model(args).to(device), device_ids=device_ids)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    restored = job.restore(model, optimizer)  # every rank loads rank 0's checkpoint
    if restored is not None and job.rank == 0:
        print(f"resumed from {restored.path} at iteration {restored.iteration}", flush=True)
    return fit(args, job, model, make_loader(args, make_data(args), job), optimizer, device=device)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    job = train.attach()
    device = pick_device(args.device)  # each rank sees its own leased GPU as cuda:0
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, rank=job.rank, world_size=job.world_size, timeout=datetime.timedelta(seconds=60))
    try:
        loss = train_ranks(args, job, device)
        # Every rank leaves the training loop after the same iteration; meet once more before tearing the
        # group down, so no rank's gloo/NCCL threads lose their peer mid-exit (an abort at shutdown).
        dist.barrier()
        state = "stopped for the lease" if job.stopping else "finished"
        print(f"rank {job.rank}: {state} at iteration {job.iteration}, last loss {loss}", flush=True)
    finally:
        # DDP's reference cycles keep the model, and through it the process group, alive past
        # train_ranks: collect them while the interpreter is whole, so the group's threads are
        # joined by destroy_process_group and not during interpreter shutdown, where gloo's
        # teardown can abort the process ("terminate called without an active exception").
        gc.collect()
        dist.destroy_process_group()
        job.close()


if __name__ == "__main__":
    main()

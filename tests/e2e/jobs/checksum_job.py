"""A tiny real PyTorch job for end-to-end tests: trains an MLP under roundhouse.train and, when it
finishes, writes its final iteration and a checksum of its parameters to ``--out``.

``--reference SEED[,SEED...]`` runs the same training uninterrupted for each seed in this process
(no lease, no checkpoint) and prints ``{seed: {"iteration": N, "checksum": HEX}}`` as JSON, so a test
can compare preempted-and-resumed runs with uninterrupted ones.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from roundhouse import train


def build(seed: int) -> tuple[nn.Module, torch.optim.Optimizer, DataLoader[tuple[torch.Tensor, ...]]]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(512, 8, generator=gen)
    y = (x @ torch.randn(8, 1, generator=gen)).tanh()
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = TensorDataset(x, y)
    # Shuffled by (seed, epoch) through set_epoch, so a resumed run sees the same batches as an
    # uninterrupted one (a DataLoader's own generator would restart its sequence on resume).
    sampler: DistributedSampler[tuple[torch.Tensor, ...]] = DistributedSampler(
        data, num_replicas=1, rank=0, shuffle=True, seed=seed
    )
    return model, optimizer, DataLoader(data, batch_size=32, sampler=sampler)


def checksum(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().numpy().tobytes())
    return digest.hexdigest()


def run(job: train.Job, seed: int, iterations: int, sleep_s: float, *, checkpoints: bool = True) -> nn.Module:
    model, optimizer, loader = build(seed)
    if checkpoints:
        job.restore(model, optimizer)
    loss_fn = nn.MSELoss()
    saved = (model, optimizer) if checkpoints else (None, None)
    for x, y in job.iterate(loader, model=saved[0], optimizer=saved[1], max_iterations=iterations):
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        job.report(loss=loss.item(), batch_size=len(x))
        if sleep_s:
            time.sleep(sleep_s)
    return model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--reference", help="comma-separated seeds: run each uninterrupted here")
    args = parser.parse_args()
    if args.reference:
        results = {}
        for seed in (int(s) for s in args.reference.split(",")):
            job = train.Job(train.JobEnv())
            model = run(job, seed, args.iterations, 0.0, checkpoints=False)
            results[seed] = {"iteration": job.iteration, "checksum": checksum(model)}
        print(json.dumps(results))
        return
    job = train.attach()
    model = run(job, args.seed, args.iterations, args.sleep)
    if not job.stopping and args.out is not None:
        args.out.write_text(json.dumps({"iteration": job.iteration, "checksum": checksum(model)}))
    job.close()


if __name__ == "__main__":
    main()

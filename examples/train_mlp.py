"""A small, real PyTorch training job under a Roundhouse lease (CPU is enough; nothing is downloaded).

It fits an MLP to a synthetic regression problem it generates from a fixed seed, so every run sees
the same data in the same order: interrupt it (a lease revoke, Ctrl-C between runs) and the resumed
run continues exactly where the checkpoint left off.

    python examples/train_mlp.py --iterations 500            # standalone: ./checkpoints
    roundhouse submit --name mlp -- python examples/train_mlp.py --iterations 5000

Under a worker the lease is checked before every batch; on a revoke the job stops at the iteration
the agent fixed, writes one checkpoint and exits 0, and the next lease resumes from it.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from roundhouse import train


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=500, help="total optimizer steps")
    parser.add_argument("--samples", type=int, default=4096, help="size of the synthetic data set")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--sleep", type=float, default=0.0, help="extra seconds per iteration (demos, tests)")
    parser.add_argument("--checkpoint-every", type=int, default=0, help="also checkpoint every N iterations")
    parser.add_argument("--log-every", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto",
                        help="torch device: auto (the lease's GPU when CUDA sees one, else the CPU), cpu, cuda, ...")
    return parser.parse_args(argv)


def pick_device(name: str) -> torch.device:
    # Under a worker, CUDA_VISIBLE_DEVICES holds only the leased GPUs, so "cuda" is the lease's GPU.
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def make_data(args: argparse.Namespace) -> TensorDataset:
    """y = sin(x·w) + noise, from a fixed seed: the same data on every rank and every run."""
    gen = torch.Generator().manual_seed(args.seed)
    x = torch.randn(args.samples, 16, generator=gen)
    w = torch.randn(16, 1, generator=gen)
    y = torch.sin(x @ w) + 0.05 * torch.randn(args.samples, 1, generator=gen)
    return TensorDataset(x, y)


def make_model(args: argparse.Namespace) -> nn.Module:
    torch.manual_seed(args.seed)
    return nn.Sequential(nn.Linear(16, args.hidden), nn.Tanh(), nn.Linear(args.hidden, 1))


def make_loader(args: argparse.Namespace, data: TensorDataset, job: train.Job) -> DataLoader[tuple[torch.Tensor, ...]]:
    # DistributedSampler shuffles by (seed, epoch): Job.iterate calls set_epoch, so a resumed run
    # sees the same batches as an uninterrupted one. With world_size 1 it is a seeded shuffle.
    sampler: DistributedSampler[tuple[torch.Tensor, ...]] = DistributedSampler(
        data, num_replicas=job.world_size, rank=job.rank, shuffle=True, seed=args.seed
    )
    return DataLoader(data, batch_size=args.batch_size, sampler=sampler, drop_last=True)


def fit(args: argparse.Namespace, job: train.Job, model: nn.Module, loader: DataLoader[tuple[torch.Tensor, ...]],
        optimizer: torch.optim.Optimizer, *, device: torch.device) -> float | None:
    loss_fn = nn.MSELoss()
    last: float | None = None
    for inputs, targets in job.iterate(loader, model=model, optimizer=optimizer, max_iterations=args.iterations,
                                       checkpoint_every=args.checkpoint_every or None):
        x, y = inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        last = loss.item()
        job.report(loss=last, batch_size=len(x))
        if args.sleep:
            time.sleep(args.sleep)
        if job.rank == 0 and args.log_every and (job.iteration + 1) % args.log_every == 0:
            print(f"iteration {job.iteration + 1}: loss {last:.4f}", flush=True)
    return last


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    job = train.attach()
    device = pick_device(args.device)
    print(f"training on {device}", flush=True)
    # On the device before the optimizer exists (its state follows the parameters); a checkpoint is
    # loaded onto the CPU and copied into them by load_state_dict.
    model = make_model(args).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    restored = job.restore(model, optimizer)
    if restored is not None:
        print(f"resumed from {restored.path} at iteration {restored.iteration}", flush=True)
    loss = fit(args, job, model, make_loader(args, make_data(args), job), optimizer, device=device)
    state = "stopped for the lease" if job.stopping else "finished"
    print(f"{state} at iteration {job.iteration}, last loss {loss}", flush=True)
    job.close()


if __name__ == "__main__":
    main()

"""A job that prints what ``roundhouse logs`` tests look for: one line per iteration, under ``roundhouse.train``.

Each run prints ``run from <iteration>`` when it starts (0, or the checkpoint a resumed run restored)
and a line with non-ASCII text (the output must travel as UTF-8, byte offsets intact), then
``step <i>`` for every iteration, and ``stopped at <i>`` or ``finished`` at its end. With ``--gate
FILE`` a run that finished its iterations prints ``waiting for the gate``, waits until ``FILE``
exists, then prints ``gate open`` (a line a follower sees only later); stderr gets one line too.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from roundhouse import train


class Steps:
    """The "model" a checkpoint holds: only the iteration, kept by ``roundhouse.train``."""

    def __init__(self, job: train.Job) -> None:
        self.job = job

    def state_dict(self) -> dict[str, Any]:
        return {"iteration": self.job.iteration}

    def load_state_dict(self, state: dict[str, Any], /) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, required=True)
    parser.add_argument("--sleep", type=float, default=0.05, help="seconds per iteration")
    parser.add_argument("--gate", type=Path, help="after the iterations, wait for this file to exist")
    args = parser.parse_args()

    job = train.attach()
    model = Steps(job)
    job.restore(model)
    print(f"run from {job.iteration}", flush=True)
    print("héllo wörld ✓", flush=True)
    print("a line on stderr", file=sys.stderr, flush=True)
    for _ in job.iterate(range(args.iterations), model=model, max_iterations=args.iterations):
        print(f"step {job.iteration}", flush=True)
        time.sleep(args.sleep)
    if job.stopping:
        print(f"stopped at {job.iteration}", flush=True)
    else:
        if args.gate is not None:
            print("waiting for the gate", flush=True)
            while not args.gate.exists():
                time.sleep(0.05)
            print("gate open", flush=True)
        print("finished", flush=True)
    job.close()


if __name__ == "__main__":
    main()

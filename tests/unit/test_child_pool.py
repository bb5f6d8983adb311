"""services.runtime.child_pool: a pool's worker exits when the process that started it is killed.

A plain ProcessPoolExecutor's worker outlives a SIGKILLed parent (the positive control below): the
scheduler's ETA pool left such orphans behind killed schedulers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PARENT = """
import os, signal, sys
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from services.runtime.child_pool import process_pool

def pid() -> int:
    return os.getpid()

if __name__ == "__main__":
    if sys.argv[1] == "child_pool":
        pool = process_pool(max_workers=1)
    elif sys.argv[1] == "child_pool_fork":  # what sweeps and reproductions use
        pool = process_pool(max_workers=1, start_method="fork")
    else:
        pool = ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn"))
    print(pool.submit(pid).result(), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # no shutdown, no atexit: as a killed service dies
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by init) counts as gone.
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(") ", 1)[1].startswith("Z"))


def _worker_of_killed_parent(kind: str, tmp_path: Path) -> int:
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    out = tmp_path / "out.txt"
    with out.open("w") as sink:  # a file, not a pipe: a surviving worker would hold a pipe open
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        argv = [sys.executable, str(script), kind]
        done = subprocess.run(argv, check=False, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, env=env, timeout=60)
    code = done.returncode
    assert code == -signal.SIGKILL, out.read_text()
    return int(out.read_text().split()[0])


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc to tell a zombie from a live process")
def test_a_worker_exits_when_its_parent_is_killed(tmp_path: Path) -> None:
    worker = _worker_of_killed_parent("child_pool", tmp_path)
    assert _gone_within(worker, 15.0), f"worker {worker} outlived its killed parent"


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc to tell a zombie from a live process")
def test_a_forked_worker_exits_when_its_parent_is_killed(tmp_path: Path) -> None:
    # The platform default on Linux, which `roundhouse simulate` sweeps and `reproduce` keep.
    worker = _worker_of_killed_parent("child_pool_fork", tmp_path)
    assert _gone_within(worker, 15.0), f"worker {worker} outlived its killed parent"


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc to tell a zombie from a live process")
def test_a_plain_pools_worker_outlives_its_killed_parent(tmp_path: Path) -> None:
    # The positive control: what the watch fixes (and that the check above can fail).
    worker = _worker_of_killed_parent("plain", tmp_path)
    try:
        assert not _gone_within(worker, 3.0)
    finally:
        os.kill(worker, signal.SIGKILL)

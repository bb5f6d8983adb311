"""On a host with an NVIDIA GPU: a real training job on the real GPU, preempted by LAS and resumed.

The cluster ``roundhouse up`` runs, with its one worker on the GPUs NVML finds (``real_gpus``):
the worker's inventory comes from NVML, the job gets the leased GPU through
``CUDA_VISIBLE_DEVICES`` and trains ``examples/train_mlp.py`` on it (``--device cuda``); a second
job makes LAS take the GPU back (two-phase stop, checkpoint), and the first resumes on the GPU from
its checkpoint. Skipped where CUDA or NVML is missing (CI has neither), run on a lent GPU machine.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from roundhouse.local import LocalClusterConfig
from schemas.job import JobSpec
from services.metrics.nvml import unavailable_reason
from tests.e2e.live_cluster import live_cluster

torch = pytest.importorskip("torch", reason="the train extra (torch) is not installed")

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or unavailable_reason() is not None,
    reason="needs an NVIDIA GPU visible to both CUDA and NVML",
)


def train_spec(name: str, log: Path, iterations: int) -> JobSpec:
    script = REPO / "examples" / "train_mlp.py"
    # One log for every run of the job (each run appends), so the test sees the resume.
    command = ["sh", "-c", f'exec "{sys.executable}" "{script}" --device cuda --iterations {iterations} '
               f'--sleep 0.005 --log-every 0 >> "{log}" 2>&1']  # fmt: skip
    return JobSpec(name=name, command=command, gpus=1, grace_period_s=30, env={"PYTHONPATH": str(REPO)})


@pytest.mark.timeout(240)
async def test_a_job_trains_on_the_leased_gpu_is_preempted_and_resumes_there(tmp_path: Path) -> None:
    config = LocalClusterConfig(
        state_dir=tmp_path / "state", workers=1, real_gpus=True, scheduler="las", round_s=2.0,
        extra_args={"metrics": ["--flush-interval-s", "0.1"], "worker": ["--heartbeat-s", "0.5", "--metrics-s", "0.2"]},
    )  # fmt: skip
    logs = {name: tmp_path / f"{name}.log" for name in ("long", "short")}
    async with live_cluster(tmp_path, config) as live:
        long_id = await live.submit(train_spec("long", logs["long"], iterations=3000))
        await live.wait_jobs([long_id], lambda v: v[0].status == "running" and v[0].iterations_done >= 200, 120,
                             "the first job training on the GPU")  # fmt: skip
        short_id = await live.submit(train_spec("short", logs["short"], iterations=300))
        views = await live.wait_finished([long_id, short_id], timeout_s=180)
    assert [views[j].status for j in (long_id, short_id)] == ["completed", "completed"], views

    long_log = logs["long"].read_text()
    # Every run trained on the GPU CUDA_VISIBLE_DEVICES gave it.
    assert long_log.count("training on cuda") >= 2, long_log
    resumed = [int(m) for m in re.findall(r"resumed from \S+ at iteration (\d+)", long_log)]
    assert resumed, long_log
    assert all(0 < it < 3000 for it in resumed), long_log
    assert "finished at iteration 3000" in long_log, long_log
    assert views[long_id].preemptions >= 1
    assert "training on cuda" in logs["short"].read_text()

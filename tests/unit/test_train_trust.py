"""The training client loads only its own checkpoints and runs no code from them (issue 13, attack 2).

A forged ``job.suspended`` once named the attacker's pickle as the victim's checkpoint; the victim's
next run loaded it. Here the attacker's file is a pickle whose ``__reduce__`` creates a marker file:
every way of getting it loaded must end in :class:`CheckpointError` with the marker absent.
"""

from __future__ import annotations

import io
import pickle
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from roundhouse.train import CheckpointError, Job, JobEnv, load_checkpoint, save_checkpoint


class Payload:
    """Pickled, it runs ``open(marker, "w")`` (creating the marker) when loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return open, (str(self.marker), "w")


def state(extra: object) -> dict[str, object]:
    return {"format": "roundhouse-checkpoint", "version": 1, "iteration": 7, "epoch": 0, "batch_index": 7,
            "model": None, "optimizer": None, "extra": extra}  # fmt: skip


def armed(path: Path, marker: Path, unsafe_load: Callable[[Path], object]) -> Path:
    """``path``, once shown to run its payload when loaded the unsafe way (the positive control that
    makes "the marker never appears" mean something); the marker is removed again."""
    unsafe_load(path)
    assert marker.exists(), "the planted checkpoint does not run its payload: the test would prove nothing"
    marker.unlink()
    return path


def plant_pickle(path: Path, marker: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(state(Payload(marker))))
    return armed(path, marker, lambda p: pickle.loads(p.read_bytes()))


def plant_torch(path: Path, marker: Path) -> Path:
    torch = pytest.importorskip("torch")
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    torch.save(state(Payload(marker)), buffer)
    path.write_bytes(buffer.getvalue())
    assert zipfile.is_zipfile(path)
    armed(path, marker, lambda p: torch.load(p, weights_only=False))
    return path


@pytest.mark.parametrize("plant", [plant_pickle, plant_torch], ids=["pickle", "torch-zip"])
def test_a_malicious_checkpoint_in_the_job_directory_is_refused_without_running_it(
    tmp_path: Path, plant: object
) -> None:
    marker = tmp_path / "pwned"
    ckpt_dir = tmp_path / "ck"
    path = plant(ckpt_dir / "checkpoint.pt", marker)  # type: ignore[operator]
    with pytest.raises(CheckpointError, match="cannot be read"):
        load_checkpoint(path)
    job = Job(JobEnv(checkpoint_dir=ckpt_dir, resume_from=path))
    with pytest.raises(CheckpointError):
        job.restore()
    assert not marker.exists()
    assert job.iteration == 0


@pytest.mark.parametrize("where", ["elsewhere", "dot-dot", "symlink", "sibling-job", "the-directory"])
def test_a_resume_path_outside_the_checkpoint_directory_is_not_loaded(tmp_path: Path, where: str) -> None:
    ckpt_dir = tmp_path / "checkpoints" / "job-1"
    ckpt_dir.mkdir(parents=True)
    # A checkpoint that would load fine: only its place is wrong.
    evil = save_checkpoint(tmp_path / "attacker" / "checkpoint.pt", state({"by": "attacker"}))
    paths = {
        "elsewhere": evil,
        "dot-dot": ckpt_dir / ".." / ".." / "attacker" / "checkpoint.pt",
        "sibling-job": save_checkpoint(tmp_path / "checkpoints" / "job-10" / "checkpoint.pt", state(None)),
        "the-directory": ckpt_dir,
    }
    if where == "symlink":
        (ckpt_dir / "checkpoint.pt").symlink_to(evil)
        paths["symlink"] = ckpt_dir / "checkpoint.pt"
    job = Job(JobEnv(checkpoint_dir=ckpt_dir, resume_from=paths[where]))
    with pytest.raises(CheckpointError, match="not a file inside this job's checkpoint directory"):
        job.restore()
    assert job.iteration == 0


def test_a_resume_path_inside_the_checkpoint_directory_still_resumes(tmp_path: Path) -> None:
    ckpt_dir = tmp_path / "ck"
    saved = save_checkpoint(ckpt_dir / "checkpoint.pt", state({"sum": 3, "seen": {1, 2}, "pair": (1, 2.5)}))
    (ckpt_dir / "sub").mkdir()
    restored = Job(JobEnv(checkpoint_dir=ckpt_dir, resume_from=ckpt_dir / "sub" / ".." / "checkpoint.pt")).restore()
    assert restored is not None
    assert restored.path == saved.resolve()
    assert restored.iteration == 7
    assert restored.extra == {"sum": 3, "seen": {1, 2}, "pair": (1, 2.5)}


class Opaque:
    pass


@pytest.mark.parametrize(
    "extra",
    [Opaque(), {"nested": [1, Opaque()]}, {Opaque(): 1}, pickle.PickleBuffer(b"x")],
    ids=["object", "nested-object", "object-key", "buffer"],
)
def test_saving_anything_but_plain_data_fails_before_the_previous_checkpoint_is_touched(
    tmp_path: Path, extra: object
) -> None:
    path = save_checkpoint(tmp_path / "c.pt", state("old"))
    with pytest.raises(TypeError, match="plain data only"):
        save_checkpoint(path, state(extra))
    assert load_checkpoint(path)["extra"] == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt"]


def test_model_and_optimizer_state_load_with_weights_only(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    extra = {"rng": torch.get_rng_state(), "shape": torch.Size([2]), "dtype": torch.float16, "steps": [1, 2]}
    path = save_checkpoint(tmp_path / "c.pt", {**state(extra), "model": model.state_dict(),
                                                "optimizer": optimizer.state_dict()})  # fmt: skip
    assert zipfile.is_zipfile(path)
    data = load_checkpoint(path)
    assert torch.equal(data["extra"]["rng"], extra["rng"])
    assert data["extra"]["dtype"] is torch.float16
    fresh = torch.nn.Linear(3, 2)
    fresh.load_state_dict(data["model"])
    torch.optim.Adam(fresh.parameters(), lr=0.01).load_state_dict(data["optimizer"])
    for a, b in zip(model.parameters(), fresh.parameters(), strict=True):
        assert torch.equal(a, b)

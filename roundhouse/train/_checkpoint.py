"""Atomic checkpoints: write a temp file, fsync it, rename it over the old one, fsync the directory.

A reader (a resumed job, the worker reporting the last good checkpoint) therefore sees either the
previous complete checkpoint or the new complete one, never a torn file, even if the process is
killed mid-write (the SIGKILL past the grace period).

torch is imported only when the state holds torch objects or torch is already loaded, so a plain
Python job can checkpoint (with pickle) without paying for torch's import.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.runtime.checkpoint import CHECKPOINT_NAME

__all__ = ["CHECKPOINT_NAME", "CheckpointError", "Position", "load_checkpoint", "save_checkpoint"]

FORMAT = "roundhouse-checkpoint"
FORMAT_VERSION = 1


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be read back (missing, truncated, or not written by roundhouse.train)."""


@dataclass(frozen=True, slots=True)
class Position:
    """Where training stands: ``iteration`` finished steps, the next batch is ``batch_index`` of ``epoch``."""

    iteration: int = 0
    epoch: int = 0
    batch_index: int = 0


def _uses_torch(state: dict[str, Any]) -> bool:
    return "torch" in sys.modules or any(
        type(v).__module__.startswith("torch") for v in state.values() if v is not None
    )


def save_checkpoint(path: Path, state: dict[str, Any]) -> Path:
    """Write ``state`` (plus format markers) to ``path`` atomically and return ``path``."""
    payload = {"format": FORMAT, "version": FORMAT_VERSION, **state}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with tmp.open("wb") as f:
            if _uses_torch(state):
                import torch

                torch.save(payload, f)
            else:
                pickle.dump(payload, f, protocol=pickle.HIGHEST_PROTOCOL)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return path


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` (torch or pickle format)."""
    try:
        if zipfile.is_zipfile(path):
            import torch

            # Our own file in the job's checkpoint directory: it may hold arbitrary ``extra`` objects.
            data = torch.load(path, map_location="cpu", weights_only=False)
        else:
            with path.open("rb") as f:
                data = pickle.load(f)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} does not exist") from None
    except (OSError, EOFError, pickle.UnpicklingError, RuntimeError) as exc:
        raise CheckpointError(f"checkpoint {path} cannot be read: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a roundhouse.train checkpoint")
    if data.get("version") != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {path} has format version {data.get('version')}; expected {FORMAT_VERSION}")
    return data

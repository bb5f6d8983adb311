"""Atomic checkpoints: write a temp file, fsync it, rename it over the old one, fsync the directory.

A reader (a resumed job, the worker reporting the last good checkpoint) therefore sees either the
previous complete checkpoint or the new complete one, never a torn file, even if the process is
killed mid-write (the SIGKILL past the grace period).

torch is imported only when the state holds torch objects or torch is already loaded, so a plain
Python job can checkpoint (with pickle) without paying for torch's import.

Loading runs no code from the file (issue 13, attack 2: a forged checkpoint path once had a job
unpickle the attacker's file). A checkpoint holds plain data only: ``None``, booleans, numbers,
strings, bytes, lists, tuples, sets, dicts, and with torch its tensors, sizes, dtypes and devices
(everything a module's or an optimizer's ``state_dict`` holds). torch files are read with
``torch.load(weights_only=True)``, the others with an unpickler that builds no object of any other
class. :func:`save_checkpoint` refuses anything else up front, so a job learns at its first
checkpoint, not at its next resume, that ``extra`` must be converted (a numpy array to a list or a
tensor, an object to a dict). :func:`confine` keeps a path given to the job inside its own
checkpoint directory.
"""

from __future__ import annotations

import collections
import contextlib
import os
import pickle
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from services.runtime.checkpoint import CHECKPOINT_NAME

__all__ = ["CHECKPOINT_NAME", "CheckpointError", "Position", "confine", "load_checkpoint", "save_checkpoint"]

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


_PLAIN_SCALARS: frozenset[type] = frozenset({type(None), bool, int, float, complex, str, bytes, bytearray})
_PLAIN_SEQUENCES: frozenset[type] = frozenset({list, tuple, set})
_PLAIN_MAPPINGS: frozenset[type] = frozenset({dict, collections.OrderedDict})
_SAFE_GLOBALS: frozenset[tuple[str, str]] = frozenset({("builtins", "complex"), ("collections", "OrderedDict")})
"""The only classes the pickle reader builds: harmless constructors of plain values."""


def _torch_value(value: object) -> bool:
    """A torch object ``torch.load(weights_only=True)`` reads back (only when torch is loaded)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    return isinstance(value, torch.Tensor | torch.Size | torch.dtype | torch.device)


def _check_plain(value: object, where: str) -> None:
    """Raise TypeError, naming ``where``, unless ``value`` is plain data (see the module doc).

    Exact types, not isinstance: a subclass of dict or tuple (a namedtuple) pickles as its own
    class, which a safe load refuses."""
    kind = type(value)
    if kind in _PLAIN_SCALARS or _torch_value(value):
        return
    if kind in _PLAIN_SEQUENCES and isinstance(value, list | tuple | set):
        for i, item in enumerate(value):
            _check_plain(item, f"{where}[{i}]")
        return
    if kind in _PLAIN_MAPPINGS and isinstance(value, dict):
        for key, item in value.items():
            _check_plain(key, f"{where} key {key!r}")
            _check_plain(item, f"{where}[{key!r}]")
        return
    raise TypeError(
        f"{where} is a {kind.__module__}.{kind.__qualname__}: a checkpoint holds plain data only (None, bool, "
        "numbers, str, bytes, list, tuple, set, dict, torch tensors), so that resuming runs no code from the "
        "file; convert it (an array to a list or a tensor, an object to a dict)"
    )


class _PlainUnpickler(pickle.Unpickler):
    """Reads what :func:`save_checkpoint` writes without torch, and builds nothing but plain values:
    any other class or function a file names (the way a pickle runs code) is refused."""

    def find_class(self, module: str, name: str, /) -> Any:
        if (module, name) in _SAFE_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not plain data: not loaded")


def _load_plain(f: IO[bytes]) -> Any:
    return _PlainUnpickler(f).load()


def confine(path: Path, directory: Path) -> Path:
    """``path`` resolved, if it is a file strictly inside ``directory`` (resolved too: neither ``..``
    nor a symbolic link leads out); else :class:`CheckpointError`."""
    try:
        root = directory.resolve()
        resolved = path.resolve(strict=True)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} does not exist") from None
    except (OSError, RuntimeError) as exc:
        raise CheckpointError(f"checkpoint {path} cannot be resolved: {exc}") from exc
    if resolved == root or not resolved.is_relative_to(root) or not resolved.is_file():
        raise CheckpointError(
            f"checkpoint {path} is not a file inside this job's checkpoint directory {directory}: not loaded"
        )
    return resolved


def _uses_torch(state: dict[str, Any]) -> bool:
    return "torch" in sys.modules or any(
        type(v).__module__.startswith("torch") for v in state.values() if v is not None
    )


def save_checkpoint(path: Path, state: dict[str, Any]) -> Path:
    """Write ``state`` (plus format markers) to ``path`` atomically and return ``path``.

    ``state`` must be plain data (see the module doc): anything else raises TypeError before the
    previous checkpoint is touched."""
    payload = {"format": FORMAT, "version": FORMAT_VERSION, **state}
    _check_plain(payload, "the checkpoint")
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
    """Read a checkpoint written by :func:`save_checkpoint` (torch or pickle format), running no code
    from it: a file that would need any (a pickled object, a function) raises :class:`CheckpointError`."""
    try:
        if zipfile.is_zipfile(path):
            import torch

            data = torch.load(path, map_location="cpu", weights_only=True)
        else:
            with path.open("rb") as f:
                data = _load_plain(f)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} does not exist") from None
    except (OSError, EOFError, pickle.UnpicklingError, RuntimeError) as exc:
        raise CheckpointError(f"checkpoint {path} cannot be read: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a roundhouse.train checkpoint")
    if data.get("version") != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {path} has format version {data.get('version')}; expected {FORMAT_VERSION}")
    return data

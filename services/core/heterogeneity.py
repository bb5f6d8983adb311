"""GPU types and how fast a job runs on each (the heterogeneity model; Gavel, OSDI '20, §2-3).

Three jobs, one module, all pure:

* :func:`normalize_gpu_type` turns the name a driver reports ("NVIDIA A100-SXM4-80GB", "Tesla
  V100-SXM2-16GB") into the short type a cluster spec and a throughput table use ("a100", "v100"),
  so the node inventory, the simulator's cluster specs and the policies agree on one vocabulary.
* :func:`relative_throughput` says how fast a job runs on one GPU type, relative to the reference
  type (V100) on which trace durations are taken, as Gavel's trace generator does
  (``scheduler/utils.py``: a job's steps are its duration times its V100 throughput). Lookup order:
  the job's own ``gpu_throughputs`` (a trace column or the submitted spec), else the table of its
  ``model`` below, else the type's default speed (:data:`DEFAULT_TYPE_SPEED`), else 1.0 (a type this
  module does not know is as fast as the reference: a homogeneous cluster of ``generic`` GPUs is
  unaffected).
* :class:`HeterogeneityModel` is the simulator's factor: a job's progress rate is multiplied by its
  throughput on the slowest type among the GPUs it holds (a synchronous data-parallel job waits for
  its slowest worker each iteration). The simulator applies it only when switched on
  (``SimConfig.heterogeneity``), so existing results do not change.

Source of the numbers: Gavel's simulation throughput table, ``scheduler/simulation_throughputs.json``
of stanford-futuredata/gavel (commit c4fa400), single-job ("null" colocation), scale factor 1,
normalised per model to its V100 throughput. Keys are Roundhouse's model names (Blox Table 2 models:
``resnet18``, ``resnet50``, ``transformer``, ``lstm`` for Gavel's LM, ``recoder`` for its
Recommendation, ``a3c``, ``cyclegan``), with ``-bsN`` for one batch size; a bare model name is the
geometric mean over Gavel's batch sizes. Note Gavel's Recommendation model is faster on K80 and P100
than on V100 in that table; it is kept as measured there.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Final

from schemas.job import JobSpec

REFERENCE_TYPE: Final = "v100"
"""The type trace durations are measured on (throughput 1.0 for every model)."""


def _table(rows: Mapping[str, tuple[float, float]]) -> Mapping[str, Mapping[str, float]]:
    return MappingProxyType(
        {model: MappingProxyType({"k80": k80, "p100": p100, "v100": 1.0}) for model, (k80, p100) in rows.items()}
    )


GAVEL_THROUGHPUTS: Final[Mapping[str, Mapping[str, float]]] = _table(
    {
        # model: (K80, P100) throughput relative to the same model on a V100
        "resnet18": (0.155, 0.902),
        "resnet18-bs16": (0.148, 1.109),
        "resnet18-bs32": (0.240, 1.196),
        "resnet18-bs64": (0.293, 0.926),
        "resnet18-bs128": (0.100, 0.649),
        "resnet18-bs256": (0.086, 0.750),
        "resnet50": (0.158, 0.659),
        "resnet50-bs16": (0.202, 0.794),
        "resnet50-bs32": (0.159, 0.628),
        "resnet50-bs64": (0.141, 0.596),
        "resnet50-bs128": (0.139, 0.635),
        "transformer": (0.280, 0.741),
        "transformer-bs16": (0.494, 0.862),
        "transformer-bs32": (0.330, 0.741),
        "transformer-bs64": (0.203, 0.591),
        "transformer-bs128": (0.180, 0.564),
        "transformer-bs256": (0.287, 1.052),
        "lstm": (0.250, 0.840),
        "lstm-bs5": (0.233, 0.832),
        "lstm-bs10": (0.291, 0.944),
        "lstm-bs20": (0.265, 0.899),
        "lstm-bs40": (0.254, 0.791),
        "lstm-bs80": (0.214, 0.749),
        "recoder": (1.308, 2.168),
        "recoder-bs512": (1.409, 2.096),
        "recoder-bs1024": (1.509, 2.315),
        "recoder-bs2048": (1.398, 2.222),
        "recoder-bs4096": (1.357, 2.278),
        "recoder-bs8192": (0.950, 1.953),
        "a3c": (0.479, 0.792),
        "cyclegan": (0.114, 0.543),
    }
)
"""Per-model throughput by GPU type, relative to V100 (see the module docstring for the source)."""

DEFAULT_TYPE_SPEED: Final[Mapping[str, float]] = MappingProxyType({"k80": 0.276, "p100": 0.859, "v100": 1.0})
"""A job whose model the table does not know runs at this fraction of its V100 speed: the geometric
mean, over Gavel's seven model families, of each family's (geometric-mean) ratio. Types not listed
run at 1.0."""

GENERIC_TYPE: Final = "generic"
"""The type of a GPU nobody named (``ClusterState.uniform``, a bare ``NODESxGPUS`` spec)."""

# Families matched in a driver's product name, most specific first ("a100" before "a10").
_FAMILIES: Final[tuple[str, ...]] = (
    "gh200", "h200", "h100", "h800", "h20", "b200", "b100", "gb200",
    "a100", "a800", "a6000", "a5000", "a4000", "a40", "a30", "a16", "a10g", "a10", "a2",
    "l40s", "l40", "l4",
    "v100s", "v100", "p100", "p40", "p4", "t4", "k80", "k40", "m60", "m40",
    "rtx6000", "rtx8000",
)  # fmt: skip
_FAMILY_RE: Final = re.compile(r"(?<![a-z0-9])(" + "|".join(_FAMILIES) + r")(?![0-9])")
_SLUG_RE: Final = re.compile(r"[^a-z0-9]+")
_VENDOR_WORDS: Final = ("nvidia", "tesla", "geforce", "quadro")


def normalize_gpu_type(name: str | None) -> str:
    """A short, lower-case GPU type for a driver's product name.

    ``"NVIDIA A100-SXM4-80GB"`` -> ``"a100"``, ``"Tesla V100-SXM2-16GB"`` -> ``"v100"``,
    ``"NVIDIA H100 80GB HBM3"`` -> ``"h100"``, ``"k80"`` -> ``"k80"``. A name of no known family
    becomes a slug of its words without the vendor's ("Roundhouse Fake GPU" ->
    ``"roundhouse-fake-gpu"``); an empty name is ``"generic"``.
    """
    text = (name or "").strip().lower()
    if not text:
        return GENERIC_TYPE
    match = _FAMILY_RE.search(text.replace(" ", "-"))
    if match is not None:
        return match.group(1)
    words = [w for w in _SLUG_RE.split(text) if w and w not in _VENDOR_WORDS]
    return "-".join(words) or GENERIC_TYPE


def relative_throughput(
    gpu_type: str, *, model: str | None = None, throughputs: Mapping[str, float] | None = None
) -> float:
    """How fast a job runs on ``gpu_type`` relative to the reference type (module docstring)."""
    if throughputs:
        given = throughputs.get(gpu_type)
        if given is not None:
            return given
    if model is not None:
        table = GAVEL_THROUGHPUTS.get(model.lower())
        if table is not None and gpu_type in table:
            return table[gpu_type]
    return DEFAULT_TYPE_SPEED.get(gpu_type, 1.0)


def throughput_row(
    gpu_types: Iterable[str], *, model: str | None = None, throughputs: Mapping[str, float] | None = None
) -> tuple[float, ...]:
    """``relative_throughput`` of one job on each of ``gpu_types``, in that order."""
    return tuple(relative_throughput(t, model=model, throughputs=throughputs) for t in gpu_types)


def parse_throughputs(text: str) -> dict[str, float]:
    """``"k80=0.2;p100=0.7;v100=1"`` (``;`` or ``,`` between pairs) -> ``{"k80": 0.2, ...}``.

    Types are normalised; every value must be a positive number. Raises ``ValueError`` saying why.
    """
    result: dict[str, float] = {}
    for part in re.split(r"[;,]", text):
        if not part.strip():
            continue
        name, sep, value = part.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"throughputs must look like TYPE=NUMBER;TYPE=NUMBER, got {text!r}")
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"throughput of {name.strip()!r} is not a number: {value!r}") from None
        if not number > 0 or number == float("inf"):
            raise ValueError(f"throughput of {name.strip()!r} must be a positive number, got {value!r}")
        result[normalize_gpu_type(name)] = number
    if not result:
        raise ValueError(f"no TYPE=NUMBER pair in throughputs {text!r}")
    return result


class HeterogeneityModel:
    """The simulator's rate factor for GPU types: throughput on the slowest type a job holds.

    Built once per simulation from the GPU types (indexed by global GPU id); ``factor`` costs one
    lookup per distinct type of the job's GPUs, cached per (model, throughputs, types).
    """

    __slots__ = ("_cache", "_types")

    def __init__(self, gpu_types: Sequence[str]) -> None:
        self._types: tuple[str, ...] = tuple(gpu_types)
        self._cache: dict[tuple[object, ...], float] = {}

    def factor(
        self, gpus: Iterable[int], *, model: str | None = None, throughputs: Mapping[str, float] | None = None
    ) -> float:
        """The rate multiplier of a job on ``gpus`` (global ids): its slowest type's throughput."""
        types = frozenset(self._types[g] for g in gpus)
        if not types:
            return 1.0
        key = (model, tuple(sorted(throughputs.items())) if throughputs else None, types)
        cached = self._cache.get(key)
        if cached is None:
            cached = self._cache[key] = min(relative_throughput(t, model=model, throughputs=throughputs) for t in types)
        return cached

    def job_factor(self, spec: JobSpec, gpus: Iterable[int]) -> float:
        """``factor`` for a job of ``spec`` (its model and its own ``gpu_throughputs``)."""
        return self.factor(gpus, model=spec.model, throughputs=spec.gpu_throughputs)

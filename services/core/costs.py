"""Modelled costs of preemption and placement, per model name.

A contract shared by the simulator and the worker's emulated jobs
(``services.worker.emulator``, which waits a model's checkpoint cost on a revoke), so it lives in
``services.core``: both read the same numbers.

Preemption is never free by default (Blox §7 profiles launch and preemption overheads for the
simulator; its released simulator charges none, which flatters preemptive policies):

* **checkpoint** — a suspended job keeps its GPUs while it writes its checkpoint (Roundhouse's
  two-phase preemption stops at an iteration boundary, so no progress is lost; the GPUs are busy).
  A job with its own grace period (FitGpp §2.1, the workload's ``checkpoint_s``) uses that instead.
* **restore + relaunch** — a resumed job holds its GPUs while its processes start and reload the
  checkpoint before it makes progress again. A job's *first* launch costs nothing extra: the
  durations in traces already include start-up.

All three count as *lost work* (GPU-seconds held without progress).

Placement and scaling:

* **spread penalty** — a job spread over more nodes than it needs (``ceil(gpus / largest node)``)
  runs slower by the model's ``spread_slowdown`` factor. Blox §4.3 (after Tiresias) shows that
  consolidation matters for communication-heavy models and on slow (10 Gbps) links; models with
  large, skewed tensors (the VGG family, AlexNet) suffer most.
* **elastic scaling** — a job run on ``g`` GPUs instead of its requested ``r`` progresses at rate
  ``(g / r) ** scaling_exponent`` (sub-linear, as data-parallel training is).

The numbers below are Roundhouse's assumptions (order of magnitude of a PyTorch job restarting from
a checkpoint on local NVMe: tens of seconds), not measurements from the papers; pass a different
``CostModel`` to study sensitivity, or ``CostModel.free()`` to reproduce a zero-cost simulator.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


@dataclass(frozen=True, slots=True)
class ModelCosts:
    checkpoint_s: float = 10.0
    restore_s: float = 10.0
    relaunch_s: float = 20.0
    spread_slowdown: float = 1.2
    scaling_exponent: float = 0.8

    def __post_init__(self) -> None:
        for name in ("checkpoint_s", "restore_s", "relaunch_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if self.spread_slowdown < 1.0:
            raise ValueError("spread_slowdown must be >= 1 (a spread job is never faster)")
        if not 0.0 < self.scaling_exponent <= 1.0:
            raise ValueError("scaling_exponent must be in (0, 1]")


_SMALL = ModelCosts(checkpoint_s=5.0, restore_s=5.0, relaunch_s=15.0, spread_slowdown=1.1)
_MEDIUM = ModelCosts(checkpoint_s=10.0, restore_s=10.0, relaunch_s=20.0, spread_slowdown=1.2)
_LARGE = ModelCosts(checkpoint_s=20.0, restore_s=20.0, relaunch_s=25.0, spread_slowdown=1.3)
_SKEWED = ModelCosts(checkpoint_s=20.0, restore_s=20.0, relaunch_s=25.0, spread_slowdown=1.5)

DEFAULT_MODEL_COSTS: Mapping[str, ModelCosts] = MappingProxyType(
    {
        # Blox Table 2 (philly-synthetic models)
        "resnet18": _SMALL,
        "cyclegan": _MEDIUM,
        "resnet50": _MEDIUM,
        "lstm": _MEDIUM,
        "recoder": _SMALL,
        "transformer": _LARGE,
        "a3c": _SMALL,
        # Tiresias 60-job trace
        "vgg11": _SKEWED,
        "vgg16": _SKEWED,
        "vgg19": _SKEWED,
        "alexnet": _SKEWED,
        "inception3": _MEDIUM,
        "inception4": _LARGE,
        "googlenet": _MEDIUM,
        "resnet101": _LARGE,
        "resnet152": _LARGE,
        # Pollux workloads
        "cifar10": _SMALL,
        "ncf": _SMALL,
        "yolov3": _MEDIUM,
        "deepspeech2": _LARGE,
        "imagenet": _MEDIUM,
        "bert": _LARGE,
    }
)


@dataclass(frozen=True, slots=True)
class CostModel:
    """Per-model costs with a default for unknown or unnamed models."""

    models: Mapping[str, ModelCosts] = field(default_factory=lambda: DEFAULT_MODEL_COSTS)
    default: ModelCosts = _MEDIUM

    @classmethod
    def free(cls) -> CostModel:
        """Zero-cost preemption and no spread penalty (what Blox's simulator charges)."""
        zero = ModelCosts(checkpoint_s=0.0, restore_s=0.0, relaunch_s=0.0, spread_slowdown=1.0)
        return cls(models={}, default=zero)

    def for_model(self, model: str | None) -> ModelCosts:
        if model is None:
            return self.default
        return self.models.get(model.lower(), self.default)

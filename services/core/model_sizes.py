"""Per-model gradient size and compute time per iteration: what the network model needs to know.

A data-parallel job exchanges its whole gradient every iteration (one all-reduce of ``params``
32-bit floats), so how much a slow link hurts depends on the ratio of that volume to the compute time
of one iteration (:mod:`services.core.network`).

**Parameter counts** are the published ones (cited per entry). **Step times** (forward + backward of
one iteration on one V100, FP32, at the per-GPU batch named) are approximate: derived from public
single-GPU training throughputs (TensorFlow's ``tf_cnn_benchmarks`` results for V100 and NVIDIA's
DeepLearningExamples performance tables), rounded; where none is published for the exact setup (the
recommendation, RL and speech models of Blox Table 2 and of the Pollux workloads) they are Roundhouse's
order-of-magnitude assumption, marked *assumed*. Only the ratio of communication to compute matters
to the model, so a 20 % error in a step time moves a job's slowdown by at most that much.

Names are matched lower-case without ``-``, ``_``, ``.`` or spaces (``VGG-16`` = ``vgg16``,
``GPT-2`` = ``gpt2``); an unknown or missing model gets :data:`DEFAULT_PROFILE` (ResNet-50-like).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

__all__ = ["DEFAULT_PROFILE", "MODEL_PROFILES", "ModelProfile", "model_profile", "normalize_model_name"]

BYTES_PER_PARAM = 4
"""FP32 gradients (the traces' models are trained in FP32 in the papers' setups)."""


@dataclass(frozen=True, slots=True)
class ModelProfile:
    """Size and speed of one model's data-parallel training iteration."""

    params_m: float
    """Trainable parameters, in millions."""
    step_s: float
    """Compute time of one iteration on one V100 (forward + backward), seconds."""

    def __post_init__(self) -> None:
        if not (self.params_m >= 0 and self.step_s > 0):
            raise ValueError(f"params_m must be >= 0 and step_s > 0, got {self.params_m}, {self.step_s}")

    @property
    def gradient_bits(self) -> float:
        """Bits of one full gradient (what one all-reduce moves)."""
        return self.params_m * 1e6 * BYTES_PER_PARAM * 8


_RESNET50 = ModelProfile(params_m=25.6, step_s=0.089)
# He et al. 2016 (CVPR), Table 1 / torchvision: 25.6M; ~360 img/s at batch 32 on a V100 (FP32).

MODEL_PROFILES: Mapping[str, ModelProfile] = MappingProxyType(
    {
        # --- CNNs (Tiresias 60-job trace, Blox Table 2); batch 32 per GPU unless noted
        "resnet18": ModelProfile(11.7, 0.029),  # He et al. 2016; torchvision 11.7M
        "resnet50": _RESNET50,
        "resnet101": ModelProfile(44.5, 0.15),  # He et al. 2016; torchvision 44.5M
        "resnet152": ModelProfile(60.2, 0.22),  # He et al. 2016; torchvision 60.2M
        "vgg11": ModelProfile(132.9, 0.097),  # Simonyan & Zisserman 2015 (ICLR), config A; torchvision
        "vgg16": ModelProfile(138.4, 0.14),  # config D; torchvision 138.4M
        "vgg19": ModelProfile(143.7, 0.16),  # config E; torchvision 143.7M
        "alexnet": ModelProfile(61.1, 0.044),  # Krizhevsky et al. 2012; torchvision 61.1M; batch 128
        "inception3": ModelProfile(27.2, 0.13),  # Szegedy et al. 2016 (CVPR); torchvision 27.2M
        "inception4": ModelProfile(42.7, 0.27),  # Szegedy et al. 2017 (AAAI), Inception-v4
        "googlenet": ModelProfile(6.6, 0.036),  # Szegedy et al. 2015; torchvision 6.6M
        "cyclegan": ModelProfile(28.3, 0.25),  # Zhu et al. 2017: 2 generators (11.4M) + 2 PatchGANs (2.8M)
        # --- language and other models (Blox Table 2, Pollux workloads)
        "transformer": ModelProfile(65.0, 0.2),  # Vaswani et al. 2017, Transformer base (Table 3); ~4k tokens/GPU
        "lstm": ModelProfile(28.0, 0.08),  # 2-layer LSTM LM on WikiText-2 (Gavel's workload); assumed step
        "recoder": ModelProfile(20.0, 0.05),  # Recoder autoencoder on ML-20M (Gavel's workload); assumed
        "a3c": ModelProfile(0.7, 0.05),  # Mnih et al. 2016 Atari network; assumed
        "bert": ModelProfile(110.0, 0.5),  # Devlin et al. 2019, BERT-base (Pollux's SQuAD fine-tuning)
        "bertlarge": ModelProfile(340.0, 1.5),  # Devlin et al. 2019, BERT-large
        "gpt2": ModelProfile(124.0, 0.5),  # Radford et al. 2019, GPT-2 small (124M, HF ``gpt2``)
        "gpt2xl": ModelProfile(1558.0, 6.0),  # Radford et al. 2019, GPT-2 1.5B; assumed step
        "cifar10": ModelProfile(11.2, 0.05),  # Pollux: ResNet-18 on CIFAR-10 (11.2M), batch 128
        "imagenet": _RESNET50,  # Pollux: ResNet-50 on ImageNet
        "ncf": ModelProfile(0.8, 0.02),  # He et al. 2017 NeuMF on MovieLens-1M (Pollux); assumed
        "yolov3": ModelProfile(61.9, 0.4),  # Redmon & Farhadi 2018: 61.9M (Darknet-53 backbone); batch 8
        "deepspeech2": ModelProfile(38.0, 0.4),  # Amodei et al. 2016; deepspeech.pytorch config; assumed
    }
)

DEFAULT_PROFILE = _RESNET50
"""What a job with no model, or a model not listed, is assumed to be."""

_SEPARATORS = re.compile(r"[-_.\s]")


def normalize_model_name(name: str) -> str:
    """``VGG-16`` -> ``vgg16``, ``GPT-2`` -> ``gpt2``."""
    return _SEPARATORS.sub("", name).lower()


def model_profile(model: str | None, profiles: Mapping[str, ModelProfile] = MODEL_PROFILES) -> ModelProfile:
    """The profile of ``model`` (normalized), or :data:`DEFAULT_PROFILE`."""
    if not model:
        return DEFAULT_PROFILE
    return profiles.get(normalize_model_name(model), DEFAULT_PROFILE)

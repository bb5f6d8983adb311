"""The gradient noise scale a job reports for Pollux's statistical efficiency (``services.core.goodput``).

McCandlish et al., *An Empirical Model of Large-Batch Training* (2018), Appendix A.1: with the
squared norms of two gradient estimates of the same step, one over a small batch ``b`` and one over a
big batch ``B`` (data-parallel training has both for free: a replica's local gradient and the
all-reduced one; on one process, one micro-batch and the whole batch), unbiased estimates of the
true gradient's squared norm and of the per-example gradient variance (the trace of its covariance)
are

    |G|^2  ~  (B |G_B|^2 - b |G_b|^2) / (B - b)
    tr(S)  ~  (|G_b|^2 - |G_B|^2) / (1/b - 1/B)

and the noise scale is ``B_simple = tr(S) / |G|^2`` (in examples). Each estimate is noisy, so each is
smoothed by an exponential moving average before the ratio is taken, as McCandlish et al. and
AdaptDL (``adaptdl/torch/gradient_noise_scale.py``) do. Pure arithmetic: the caller computes the
squared norms (``squared_norm`` does it for a list of tensors, with torch imported lazily).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

__all__ = ["GradientNoiseScale", "squared_norm"]


class GradientNoiseScale:
    """Running estimate of the gradient noise scale from pairs of small- and big-batch gradient norms.

    ``smoothing`` is the weight of the old average in each update of the exponential moving averages,
    which are bias-corrected (divided by ``1 - smoothing ** updates``, as Adam's moments and AdaptDL's
    estimator are), so early estimates are plain means of the samples so far rather than pulled
    towards zero. The default, 0.999, is AdaptDL's: the per-step estimates are very noisy."""

    __slots__ = ("_decay", "_sqr", "_var", "smoothing", "updates")

    def __init__(self, *, smoothing: float = 0.999) -> None:
        if not 0.0 <= smoothing < 1.0:
            raise ValueError(f"smoothing must be in [0, 1), got {smoothing}")
        self.smoothing = smoothing
        self.updates = 0
        self._sqr = 0.0
        self._var = 0.0
        self._decay = 1.0
        """``smoothing ** updates``: what is missing from the averages' total weight."""

    def update(self, small_sqr: float, small_batch: int, big_sqr: float, big_batch: int) -> None:
        """Fold in one step's ``|G_b|^2`` (over ``small_batch`` examples) and ``|G_B|^2`` (over
        ``big_batch`` examples, ``big_batch > small_batch``)."""
        if not 0 < small_batch < big_batch:
            raise ValueError(f"need 0 < small_batch < big_batch, got {small_batch} and {big_batch}")
        if not (math.isfinite(small_sqr) and math.isfinite(big_sqr) and small_sqr >= 0 and big_sqr >= 0):
            raise ValueError("squared norms must be finite and >= 0")
        sqr = (big_batch * big_sqr - small_batch * small_sqr) / (big_batch - small_batch)
        var = (small_sqr - big_sqr) / (1.0 / small_batch - 1.0 / big_batch)
        keep = self.smoothing
        self._sqr = keep * self._sqr + (1 - keep) * sqr
        self._var = keep * self._var + (1 - keep) * var
        self._decay *= keep
        self.updates += 1

    @property
    def sqr(self) -> float | None:
        """Smoothed estimate of the true gradient's squared norm ``|G|^2`` (None before any update)."""
        return self._sqr / (1 - self._decay) if self.updates else None

    @property
    def var(self) -> float | None:
        """Smoothed estimate of the per-example gradient variance ``tr(S)`` (None before any update)."""
        return self._var / (1 - self._decay) if self.updates else None

    @property
    def noise_scale(self) -> float | None:
        """``tr(S) / |G|^2`` in examples, or None until both estimates are positive (early, noisy
        samples can make either negative)."""
        sqr, var = self.sqr, self.var
        if sqr is None or var is None or sqr <= 0 or var < 0:
            return None
        return var / sqr


def squared_norm(tensors: Iterable[Any]) -> float:
    """``sum(|t|^2)`` over torch tensors (e.g. ``[p.grad for p in model.parameters()]``; None skipped)."""
    import torch  # the training extra; only when asked

    total = torch.zeros((), dtype=torch.float64)
    for tensor in tensors:
        if tensor is not None:
            total += tensor.detach().double().pow(2).sum()
    return float(total)

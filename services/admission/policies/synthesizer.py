"""``synthesizer``: the admission half of Blox's automatic scheduler synthesizer (§5.2).

Admits with the admission policy of the combination the synthesizer chose (Accept All,
Accept-1.2x or Accept-1.4x) and reports the jobs it held to the shared decision, so the forward
simulation sees them. The decision, its pairing with the ``synthesizer`` scheduling policy and
every choice made where Blox is silent are in :mod:`services.scheduler.policies.synthesis`.
"""

from __future__ import annotations

from typing import Any

from services.core.protocols import AdmissionPolicy
from services.core.registry import ADMISSION
from services.scheduler.policies.synthesis import SynthesizerAdmission, create_admission

__all__ = ["SynthesizerAdmission", "create"]


@ADMISSION.register("synthesizer")
def create(**options: Any) -> AdmissionPolicy:
    """Build the admission half, paired by ``group`` with a ``synthesizer`` scheduling policy."""
    return create_admission(**options)

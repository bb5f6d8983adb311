"""Admission policies; importing this package registers each one in ``services.core.ADMISSION``."""

from services.admission.policies import accept_all as accept_all
from services.admission.policies import load_threshold as load_threshold
from services.admission.policies import synthesizer as synthesizer
from services.admission.policies import user_quota as user_quota

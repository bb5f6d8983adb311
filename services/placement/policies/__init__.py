"""Placement and victim-selection policies; importing this package registers each one in
``services.core.PLACEMENT`` / ``services.core.VICTIM``."""

from services.placement.policies import bandwidth_aware as bandwidth_aware
from services.placement.policies import consolidated as consolidated
from services.placement.policies import first_free as first_free
from services.placement.policies import fitgpp as fitgpp
from services.placement.policies import fulcrum as fulcrum
from services.placement.policies import gandiva as gandiva
from services.placement.policies import hermes as hermes
from services.placement.policies import lrtp as lrtp
from services.placement.policies import preempting as preempting
from services.placement.policies import rand as rand
from services.placement.policies import tiresias_skew as tiresias_skew
from services.placement.policies import yarn as yarn

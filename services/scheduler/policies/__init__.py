"""Scheduling policies; importing this package registers each one in ``services.core.SCHEDULING``."""

from services.scheduler.policies import fifo as fifo
from services.scheduler.policies import fitgpp as fitgpp
from services.scheduler.policies import hermes as hermes
from services.scheduler.policies import las as las
from services.scheduler.policies import loss_termination as loss_termination
from services.scheduler.policies import optimus as optimus
from services.scheduler.policies import rr as rr
from services.scheduler.policies import slaq as slaq
from services.scheduler.policies import srtf as srtf
from services.scheduler.policies import synthesis as synthesis
from services.scheduler.policies import themis_ftf as themis_ftf
from services.scheduler.policies import tiresias as tiresias

from services.scheduler.policies import optimus as optimus
from services.scheduler.policies import srtf as srtf
from services.scheduler.policies import themis_ftf as themis_ftf
from services.scheduler.policies import tiresias as tiresias

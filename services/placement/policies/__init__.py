from services.placement.policies import bandwidth_aware as bandwidth_aware
from services.placement.policies import tiresias_skew as tiresias_skew

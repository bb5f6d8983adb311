from services.admission.policies import load_threshold as load_threshold
from services.admission.policies import user_quota as user_quota

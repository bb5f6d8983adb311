"""`python -m services.admission [flags]`: the same as `roundhouse service admission [flags]`."""

from __future__ import annotations

import sys

from services.admission.service import AdmissionService
from services.runtime.entry import main

if __name__ == "__main__":
    sys.exit(main("admission", AdmissionService, sys.argv[1:]))

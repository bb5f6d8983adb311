"""`python -m services.metrics [flags]`: the same as `roundhouse service metrics [flags]`."""

from __future__ import annotations

import sys

from services.metrics.service import MetricsService
from services.runtime.entry import main

if __name__ == "__main__":
    sys.exit(main("metrics", MetricsService, sys.argv[1:]))

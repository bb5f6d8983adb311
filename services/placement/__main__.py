"""`python -m services.placement [flags]`: the same as `roundhouse service placement [flags]`."""

from __future__ import annotations

import sys

from services.placement.service import PlacementService
from services.runtime.entry import main

if __name__ == "__main__":
    sys.exit(main("placement", PlacementService, sys.argv[1:]))

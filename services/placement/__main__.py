"""`python -m services.placement [flags]`: the same as `roundhouse service placement [flags]`."""

from __future__ import annotations

import argparse
import sys

from roundhouse.commands.service import run

if __name__ == "__main__":
    sys.exit(run(argparse.Namespace(kind="placement", rest=sys.argv[1:])))

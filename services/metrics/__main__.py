"""`python -m services.metrics [flags]`: the same as `roundhouse service metrics [flags]`."""

from __future__ import annotations

import argparse
import sys

from roundhouse.commands.service import run

if __name__ == "__main__":
    sys.exit(run(argparse.Namespace(kind="metrics", rest=sys.argv[1:])))

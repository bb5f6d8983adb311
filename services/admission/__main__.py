"""`python -m services.admission [flags]`: the same as `roundhouse service admission [flags]`."""

from __future__ import annotations

import argparse
import sys

from roundhouse.commands.service import run

if __name__ == "__main__":
    sys.exit(run(argparse.Namespace(kind="admission", rest=sys.argv[1:])))

"""`python -m roundhouse` is the `roundhouse` command."""

import sys

from roundhouse.cli import main

sys.exit(main())

"""Placement and victim-selection policies. Importing this package imports every module in it, and each
module registers its policies in ``services.core.PLACEMENT`` / ``services.core.VICTIM`` with the
decorator: a new policy is one new module here. The registry imports this package on its first lookup
(entry point ``roundhouse.policies``)."""

from services.core.registry import import_submodules

import_submodules(__name__, __path__)

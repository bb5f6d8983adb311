"""The checkpoint file name: a contract between the worker agent and the training client.

The agent gives each lease a checkpoint directory (``ROUNDHOUSE_CHECKPOINT_DIR``); rank 0 of the job
(``roundhouse.train``) writes its checkpoint there under this name, and the agent reports
``<dir>/CHECKPOINT_NAME`` as the ``checkpoint_path`` of ``job.checkpointed`` and ``job.suspended``.
Both sides import the name from here, so neither depends on the other's package. It is not in
``schemas`` because importing ``schemas`` loads pydantic and every model, which the training client,
imported by every training script, does not need.
"""

from __future__ import annotations

from typing import Final

__all__ = ["CHECKPOINT_NAME"]

CHECKPOINT_NAME: Final = "checkpoint.pt"

"""Admission's copy of the operators' node drains, kept current from the scheduler leader.

An operator drains a node through the scheduler (``operator.drain``); the drain is written to the
scheduler's store and no event tells anyone else. Heartbeats carry only the agent's own
``draining`` (it is leaving). So admission asks the leader's ``query.nodes.<admission>`` (each
node's ``drained_by``) once right after its start and then every ``drain_refresh_s``, and applies the
answer to its inventory (``Inventory.set_operator_drains``). A drain or undrain is therefore seen
within one period. No leader, a time-out or an error skips one period (logged once per outage): the
last known drains stand meanwhile, as they do in the scheduler's own store.

What depends on it: the ``ClusterState`` admission hands its policy holds a drained node's GPUs
with the ``UNAVAILABLE`` marker. ``accept-all``, ``load-threshold`` (the cluster's GPU *total*) and
``user-quota`` do not read free GPUs, so their verdicts do not change; the synthesizer's admission
(``synthesis``) simulates forward from that cluster, where withheld GPUs start no job
(``services.core.simulation.forward``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import nats.errors

from schemas.codec import MalformedMessageError
from schemas.operations import NodesQuery, NodesReply
from schemas.subjects import QUERY_NODES
from services.admission.inventory import Inventory
from services.runtime.bus import Bus, BusError

log = logging.getLogger("roundhouse.admission")

REQUESTER = "admission"
"""The requester token of admission's ``query.nodes`` (its identity's name; the role's name is
reserved, so no user can hold it)."""


class DrainRefresher:
    """Asks the scheduler leader for the operators' drains and applies them to ``inventory()``."""

    def __init__(
        self,
        bus: Bus,
        inventory: Callable[[], Inventory],
        *,
        interval_s: float,
        timeout_s: float,
        on_change: Callable[[list[str]], None],
    ) -> None:
        self._bus = bus
        self._inventory = inventory
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._on_change = on_change
        self.refreshes = 0
        """Answers applied (tests wait on it)."""
        self.failures = 0
        self._failing = False

    async def refresh(self) -> list[str] | None:
        """One query; returns the nodes whose draining changed, or None when no answer came."""
        query = NodesQuery(requester=self._bus.identity or REQUESTER)
        try:
            reply = await self._bus.request(QUERY_NODES, query, NodesReply, timeout_s=self.timeout_s)
        except (BusError, MalformedMessageError, nats.errors.Error, TimeoutError) as exc:
            self.failures += 1
            if not self._failing:
                log.warning("admission could not refresh the operators' node drains (will retry every %.0f s): %s",
                            self.interval_s, exc)  # fmt: skip
            self._failing = True
            return None
        if self._failing:
            log.info("admission refreshes the operators' node drains again")
        self._failing = False
        changed = self._inventory().set_operator_drains({v.node_id: v.drained_by is not None for v in reply.nodes})
        self.refreshes += 1
        if changed:
            log.info("operator drains changed for %s", ", ".join(changed))
            self._on_change(changed)
        return changed

    async def run(self) -> None:
        """Refresh now, then every ``interval_s``, until cancelled."""
        while True:
            try:
                await self.refresh()
            except Exception:  # a bug must not end the refreshes for good
                self.failures += 1
                log.exception("refreshing the operators' node drains failed; trying again in %.0f s", self.interval_s)
            await asyncio.sleep(self.interval_s)


__all__ = ["REQUESTER", "DrainRefresher"]

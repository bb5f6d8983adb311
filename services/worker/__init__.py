"""The worker agent (one per node): leases, launch, two-phase preemption, the local channel to jobs.

``services.worker.channel`` is also imported by the training client (``roundhouse.train``), so this
package must not import NATS at import time.
"""

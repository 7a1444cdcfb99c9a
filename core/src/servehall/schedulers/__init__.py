"""Built-in scheduling policies (``[scheduler] policy``): ``fcfs``, ``priority``, ``fair``.

Shared admission rules live in :mod:`servehall.schedulers.queue`; docs/scheduling.md
describes each policy and its settings.
"""

from servehall.schedulers.fair import FairScheduler
from servehall.schedulers.fcfs import FcfsScheduler
from servehall.schedulers.priority import PriorityScheduler
from servehall.schedulers.queue import Grant, QueueScheduler

__all__ = ["FairScheduler", "FcfsScheduler", "Grant", "PriorityScheduler", "QueueScheduler"]

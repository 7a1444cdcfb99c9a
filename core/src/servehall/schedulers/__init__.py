"""Built-in scheduling policies."""

from servehall.schedulers.fcfs import FcfsScheduler

__all__ = ["FcfsScheduler"]

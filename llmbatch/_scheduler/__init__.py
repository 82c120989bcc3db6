"""The DynamicBatcher: pure scheduling with time passed in (see ``core``)."""

from llmbatch._scheduler.core import TIERS, Batch, Poll, Scheduler
from llmbatch._scheduler.seats import Seats

__all__ = ["TIERS", "Batch", "Poll", "Scheduler", "Seats"]

"""Time-triggered work: schedules that enqueue one queue item (or, through the outbox and
its relay, :mod:`~asynctier.schedules.relay`, one Kafka record) per tick.

A schedule (:mod:`~asynctier.schedules.spec`) is stored in PostgreSQL beside the queue
(:mod:`~asynctier.schedules.store`); any number of processes run the loop
(:mod:`~asynctier.schedules.loop`) that fires due ticks (:mod:`~asynctier.schedules.fire`),
each tick exactly once: its item and the schedule's advance commit together.
"""

from asynctier.schedules.spec import Plan, Schedule, plan
from asynctier.schedules.store import ScheduleInfo, ScheduleStore

__all__ = ["Plan", "Schedule", "ScheduleInfo", "ScheduleStore", "plan"]

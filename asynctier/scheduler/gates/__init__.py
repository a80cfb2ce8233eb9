"""Admission as an ordered list of gates, each with one job (after dramatiq's middleware).

- :mod:`.base` the :class:`Gate` and its hooks, and what gates are built from;
- :mod:`.expiry`, :mod:`.deferral`, :mod:`.breaker`, :mod:`.quota`, :mod:`.tokens`,
  :mod:`.cap` one gate each;
- :mod:`.order` :data:`GATES`, the one place their order is written;
- :mod:`.chain` :class:`Gates`, a scheduler's gates asked as one.
"""

from asynctier.scheduler.gates.base import Admitted, Gate, GateContext, GateFactory
from asynctier.scheduler.gates.chain import Capping, Gates
from asynctier.scheduler.gates.order import GATES, build_gates

__all__ = ["GATES", "Admitted", "Capping", "Gate", "GateContext", "GateFactory", "Gates",
           "build_gates"]

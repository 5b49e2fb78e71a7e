"""The VitaBench environment reimplemented over a task's own database (general, delivery, in-store tools).

The reference tools are Python code inside the ``vita`` package (pydantic models, ``thefuzz`` ranking,
the ``holidays`` package); the data they act on is the task's ``environment`` object. ``VitaExecutor``
re-implements their behaviour on a deep copy of that object, written from the reference's semantics:

* reproduced: reads (stores / shops / products / orders / bookings / reservations / weather / user
  history / nearby places / distances / geocoding of known addresses), writes (create, pay, cancel,
  modify delivery orders; create, pay, cancel in-store orders; book / pay / cancel tables; reserve /
  modify / cancel visits) with the reference's checks (user id must be the task's, dispatch time not in
  the past, positive counts, shop must allow booking, status transitions) and its numbers (delivery time
  = 25 + 0.00651 min per metre of haversine distance, rounded; total = Σ price × count; a table booking
  with price 0 is paid at once; a reservation starts ``unconsumed``);
* not reproduced: keyword ranking uses our own containment + ``difflib`` similarity instead of
  ``thefuzz.partial_ratio`` (same candidates, possibly a different order); order ids are ``OD…``/``OI…``
  counters, not the reference's hashes; responses are JSON objects instead of Python ``repr`` strings;
  ``get_holiday_date`` (a hard-coded table in the reference) answers ``NOT_REPRODUCED`` and
  ``get_date_holiday_info`` works only when the optional ``holidays`` package is installed; OTA tools
  (hotels, attractions, flights, trains) answer ``NOT_REPRODUCED``.

Errors come back as ``{"error": message}``. As in the reference, a rejected request (a failed check, which
the reference returns as a plain message) is an ordinary response; a failure (unknown id, bad argument —
an exception in the reference) is also counted in ``failures``.
"""

from __future__ import annotations

from envace.envs.vitabench.executor_core import ExecutorCore
from envace.envs.vitabench.tools_delivery import DeliveryTools
from envace.envs.vitabench.tools_general import GeneralTools
from envace.envs.vitabench.tools_instore import InstoreTools


class VitaExecutor(GeneralTools, DeliveryTools, InstoreTools, ExecutorCore):
    """Real executor of one VitaBench task: ``execute(call)`` → JSON value, ``state()`` → tables snapshot."""

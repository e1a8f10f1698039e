"""What a broker may assume about its own lease, on its own clock (sans-I/O: it is told when renewals
are sent and when they succeed, and reads a monotonic clock it is given).

The lease runs on the database's clock: a renewal sets its end to the database's *now* plus the lease,
and once that end passes, another broker may claim this one's write-ahead log, replay it and take its
partitions. A record this broker acknowledges after that moment might be missing from the replay, so
the broker must stop acknowledging *before* the database can think its lease over. It cannot read the
database's clock, but it knows a lower bound of every renewal's end: the renewal was sent before the
database ran it, so the end is at least ``sent + lease`` in real time. Hence:

- **confirmed** until ``sent + lease - margin`` (of the last renewal that succeeded): acknowledgements
  are safe; the margin covers a difference in rate between the two clocks and the moment between the
  check and the answer leaving the broker;
- **unconfirmed** after that, while renewals fail (the database is out of reach): nothing is
  acknowledged; a renewal that gets through in time confirms the lease again;
- **surely expired** from ``sent + lease + margin``: the database has ended the lease by now, so the
  broker is fenced (it exits, and joins again as a new incarnation).

The rows of this table are tests/test_cluster_lease_clock.py, one test each.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import Enum


class LeaseState(Enum):
    CONFIRMED = "confirmed"            # acknowledge
    UNCONFIRMED = "unconfirmed"        # acknowledge nothing; a renewal may still confirm the lease
    SURELY_EXPIRED = "surely expired"  # the database ended the lease: fenced


class LeaseClock:
    """The lease as this broker may count on it. ``sent()`` before each join or renewal is sent,
    ``renewed(sent_s)`` once it succeeded."""

    def __init__(self, lease_ms: int, margin_ms: int, clock: Callable[[], float] = time.monotonic) -> None:
        if not 0 <= margin_ms < lease_ms:
            raise ValueError(f"the lease margin ({margin_ms} ms) must be at least 0 and below the lease "
                             f"({lease_ms} ms)")
        self._lease_s = lease_ms / 1000
        self._margin_s = margin_ms / 1000
        self._clock = clock
        #: The send time of the latest renewal that succeeded; None before the join.
        self._basis_s: float | None = None

    def sent(self) -> float:
        """The time to pass to :meth:`renewed` if the join or renewal about to be sent succeeds."""
        return self._clock()

    def renewed(self, sent_s: float) -> None:
        """The join or renewal sent at ``sent_s`` succeeded. An older one finishing late moves nothing."""
        if self._basis_s is None or sent_s > self._basis_s:
            self._basis_s = sent_s

    def state(self) -> LeaseState:
        if self._basis_s is None:
            return LeaseState.UNCONFIRMED
        now = self._clock()
        if now < self._basis_s + self._lease_s - self._margin_s:
            return LeaseState.CONFIRMED
        if now < self._basis_s + self._lease_s + self._margin_s:
            return LeaseState.UNCONFIRMED
        return LeaseState.SURELY_EXPIRED

    def confirmed(self) -> bool:
        return self.state() is LeaseState.CONFIRMED

    def since_renewed_s(self) -> float | None:
        """How long ago the latest renewal that succeeded was sent, on this clock (None before the join):
        a fenced broker says it, so a pause of the process or its machine shows as what it was."""
        return None if self._basis_s is None else self._clock() - self._basis_s

    def confirmed_for_s(self) -> float:
        """How much longer the lease is confirmed without another renewal (0 if it is not)."""
        if self._basis_s is None:
            return 0.0
        return max(0.0, self._basis_s + self._lease_s - self._margin_s - self._clock())

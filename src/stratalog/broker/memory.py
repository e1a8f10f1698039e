"""Memory budgets shared by all connections: request bytes read and not yet answered, and response bytes
written and not yet taken by the peer.

Per connection everything is bounded already (one frame of ``request_bytes_max``, ``in_flight_requests_max``
requests, one response past the socket's high-water mark), but a thousand hostile connections times
those bounds is more memory than a machine has. A budget counts what every connection holds for one
purpose, so the broker can act before the sum passes its bound: the server closes the connection that
holds the most request bytes (a slow or stalled sender), and Fetch answers with fewer bytes, or none,
while response bytes pile up unread.
"""

from __future__ import annotations

from collections.abc import Hashable


class MemoryBudget:
    """Bytes held by owners (connections) against ``bytes_max``. Event-loop only: no locks."""

    def __init__(self, bytes_max: int) -> None:
        self.bytes_max = bytes_max
        self.held_bytes = 0
        self._by_owner: dict[Hashable, int] = {}

    def set(self, owner: Hashable, nbytes: int) -> None:
        """What ``owner`` holds now (0 forgets it)."""
        old = self._by_owner.get(owner, 0)
        if nbytes:
            self._by_owner[owner] = nbytes
        elif old:
            del self._by_owner[owner]
        self.held_bytes += nbytes - old

    @property
    def over(self) -> bool:
        return self.held_bytes > self.bytes_max

    def left_bytes(self) -> int:
        return self.bytes_max - self.held_bytes

    def largest(self) -> tuple[Hashable, int] | None:
        """The owner holding the most, and how much (a scan: called only when over budget)."""
        if not self._by_owner:
            return None
        owner = max(self._by_owner, key=self._by_owner.__getitem__)
        return owner, self._by_owner[owner]

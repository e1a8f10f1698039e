"""The groups a coordinator holds, bounded by ``groups_max``: what its membership protocol (group_join.py,
group_rebalance.py, group_sync.py, group_sessions.py) and its listing and expiry (group_admin.py) share, and
the one way a group leaves it (its timers cancelled, whoever waits in it answered). GroupContext is that
table with the rest the membership protocol's parts share: bounds, clock and timers."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from stratalog.broker.group_state import (
    E,
    Group,
    GroupConfig,
    Member,
    S,
    SyncResult,
    TimerHandle,
    answer,
    join_error,
)

logger = logging.getLogger("stratalog.broker.groups")


class GroupTable:
    """Groups by id. Every method is called from the event loop's thread."""

    def __init__(self, config: GroupConfig, clock_ms: Callable[[], int]) -> None:
        self._config = config
        self._clock_ms = clock_ms
        self.groups: dict[str, Group] = {}
        #: The coordinator stopped: it holds no group and answers COORDINATOR_NOT_AVAILABLE.
        self.closed = False

    def create(self, group_id: str) -> Group | None:
        """A new, Empty group; None when ``groups_max`` are held and none is Empty (to make room)."""
        if len(self.groups) >= self._config.groups_max and not self._evict_empty_group():
            logger.warning("group %s not created: %d groups held, none empty", group_id, len(self.groups))
            return None
        group = Group(group_id, self._clock_ms())
        self.groups[group_id] = group
        return group

    def _evict_empty_group(self) -> bool:
        empty = [g for g in self.groups.values() if g.state is S.EMPTY and not g.pending_join]
        if not empty:
            return False
        oldest = min(empty, key=lambda g: g.state_since_ms)
        self.remove(oldest, E.COORDINATOR_NOT_AVAILABLE)
        return True

    def remove(self, group: Group, error: int) -> None:
        """Forget ``group``, answering whoever waits in it with ``error``."""
        self.drop(group, error)
        del self.groups[group.group_id]

    def holds(self, group: Group) -> bool:
        """The group is still this coordinator's (a timer may fire for a group deleted since)."""
        return not self.closed and self.groups.get(group.group_id) is group

    @staticmethod
    def drop(group: Group, error: int) -> None:
        """Cancel the group's timers and answer whoever waits in it with ``error``."""
        cancel_join_timer(group)
        cancel_sync_timer(group)
        for handle in group.pending_join.values():
            handle.cancel()
        group.pending_join.clear()
        for member in group.members.values():
            cancel_session_timer(member)
            join_future, member.join_future = member.join_future, None
            answer(join_future, join_error(member.member_id, error))
            sync_future, member.sync_future = member.sync_future, None
            answer(sync_future, SyncResult(error))


@dataclass(frozen=True, slots=True)
class GroupContext:
    """What the parts of a coordinator's membership protocol share, all of it the coordinator's (groups.py)."""

    table: GroupTable
    config: GroupConfig
    clock_ms: Callable[[], int]
    #: Runs a callback on the loop after so many ms (never before the coordinator started).
    call_later: Callable[[int, Callable[[], None]], TimerHandle]
    #: Refuses a call made before the coordinator started.
    check_started: Callable[[], None]


def cancel_session_timer(member: Member) -> None:
    if member.session_timer is not None:
        member.session_timer.cancel()
        member.session_timer = None


def cancel_join_timer(group: Group) -> None:
    if group.join_timer is not None:
        group.join_timer.cancel()
        group.join_timer = None
    group.join_timer_initial = False


def cancel_sync_timer(group: Group) -> None:
    if group.sync_timer is not None:
        group.sync_timer.cancel()
        group.sync_timer = None

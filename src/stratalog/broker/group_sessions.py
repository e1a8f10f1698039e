"""The sessions of a coordinator's group members: how long a member may stay silent before it is taken for
gone, and how long a pending member (given its id by MEMBER_ID_REQUIRED, KIP-394) is waited for. What
happens to a member that is gone is the rebalance's (group_rebalance.py): these timers only tell it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial

from stratalog.broker.group_state import Group, Member
from stratalog.broker.group_table import GroupContext, cancel_session_timer

logger = logging.getLogger("stratalog.broker.groups")


class MemberSessions:
    """Session timers of members and pending members. ``on_expired``: a member's session ran out (it is to be
    removed); ``on_pending_expired``: a pending member was forgotten (the group's join may complete without
    it)."""

    def __init__(self, context: GroupContext, on_expired: Callable[[Group, Member], None],
                 on_pending_expired: Callable[[Group], None]) -> None:
        self._table = context.table
        self._call_later = context.call_later
        self._on_expired = on_expired
        self._on_pending_expired = on_pending_expired

    def schedule(self, group: Group, member: Member, timeout_ms: int | None = None) -> None:
        """(Re)start the member's session: it expires after its session timeout, or ``timeout_ms``."""
        cancel_session_timer(member)
        member.session_timer = self._call_later(
            member.session_timeout_ms if timeout_ms is None else timeout_ms,
            partial(self._on_session_expired, group, member))

    def _on_session_expired(self, group: Group, member: Member) -> None:
        if not self._table.holds(group) or group.members.get(member.member_id) is not member:
            return
        member.session_timer = None
        # A member waiting in a join or a sync is alive (its next deadline is set when the wait ends),
        # unless it is new: its first join may wait only so long.
        if member.is_new or not (member.awaiting_join or member.awaiting_sync):
            logger.info("group %s: member %s's session expired", group.group_id, member.member_id)
            self._on_expired(group, member)

    def keep_pending(self, group: Group, member_id: str, timeout_ms: int) -> None:
        """Hold ``member_id`` as a pending member of ``group`` for ``timeout_ms``: it joins with that id."""
        group.pending_join[member_id] = self._call_later(
            timeout_ms, partial(self._on_pending_member_expired, group, member_id))

    def _on_pending_member_expired(self, group: Group, member_id: str) -> None:
        if self._table.holds(group) and group.pending_join.pop(member_id, None) is not None:
            self._on_pending_expired(group)

"""The rebalance of a coordinator's group: how a generation is prepared (PreparingRebalance, with the initial
delay of an empty group and the join timeout), formed when every member has joined (CompletingRebalance,
each member's join answered), and how members that sync too late, or whose session ran out, leave it.
JoinGroup (group_join.py), SyncGroup and LeaveGroup (group_sync.py) and the sessions (group_sessions.py)
all come here when the group's membership changes."""

from __future__ import annotations

import logging
from functools import partial

from stratalog.broker.group_sessions import MemberSessions
from stratalog.broker.group_state import UNKNOWN_MEMBER_ID, E, Group, Member, S, SyncResult, answer, join_error
from stratalog.broker.group_table import GroupContext, cancel_join_timer, cancel_session_timer, cancel_sync_timer

logger = logging.getLogger("stratalog.broker.groups")


class Rebalancer:
    """The rebalances of one coordinator's groups, and its members' sessions (:attr:`sessions`): a member
    whose session runs out is removed, as one that leaves."""

    def __init__(self, context: GroupContext) -> None:
        self._table = context.table
        self._config = context.config
        self._clock_ms = context.clock_ms
        self._call_later = context.call_later
        self.sessions = MemberSessions(context, on_expired=self.remove_member,
                                       on_pending_expired=self.maybe_complete_join)

    def prepare_rebalance_or_complete_join(self, group: Group) -> None:
        """The group's membership changed: rebalance, or, if it is rebalancing, complete the join if every
        member is in."""
        if group.state is S.PREPARING_REBALANCE:
            self.maybe_complete_join(group)
        else:
            self.prepare_rebalance(group, "membership changed")

    def prepare_rebalance(self, group: Group, reason: str) -> None:
        if group.state is S.COMPLETING_REBALANCE:
            # Members waiting in SyncGroup must join again.
            for member in group.members.values():
                member.assignment = b""
            self.propagate_assignment(group, E.REBALANCE_IN_PROGRESS)
        cancel_sync_timer(group)
        cancel_join_timer(group)
        delay_ms = self._config.group_initial_rebalance_delay_ms
        if group.state is S.EMPTY and delay_ms > 0:
            remaining_ms = max(group.rebalance_timeout_ms() - delay_ms, 0)
            group.join_timer = self._call_later(
                delay_ms, partial(self._on_initial_delay_expired, group, remaining_ms))
            group.join_timer_initial = True
        else:
            group.join_timer = self._call_later(
                group.rebalance_timeout_ms(), partial(self._on_join_timeout, group))
            group.join_timer_initial = False
        group.transition(S.PREPARING_REBALANCE, self._clock_ms())
        logger.info("group %s: preparing to rebalance generation %d (%s)", group.group_id,
                    group.generation_id, reason)
        self.maybe_complete_join(group)

    def maybe_complete_join(self, group: Group) -> None:
        if group.state is S.PREPARING_REBALANCE and not group.join_timer_initial and group.all_joined():
            self._complete_join(group)

    def _on_initial_delay_expired(self, group: Group, remaining_ms: int) -> None:
        if not self._table.holds(group) or group.state is not S.PREPARING_REBALANCE:
            return
        group.join_timer = None
        if group.new_member_added and remaining_ms > 0:
            group.new_member_added = False
            delay_ms = min(self._config.group_initial_rebalance_delay_ms, remaining_ms)
            remaining_ms = max(remaining_ms - self._config.group_initial_rebalance_delay_ms, 0)
            group.join_timer = self._call_later(
                delay_ms, partial(self._on_initial_delay_expired, group, remaining_ms))
        else:
            self._complete_join(group)

    def _on_join_timeout(self, group: Group) -> None:
        if self._table.holds(group) and group.state is S.PREPARING_REBALANCE:
            group.join_timer = None
            self._complete_join(group)

    def _complete_join(self, group: Group) -> None:
        cancel_join_timer(group)
        for member in [m for m in group.members.values() if not m.awaiting_join]:
            logger.info("group %s: member %s did not join in time and was removed", group.group_id,
                        member.member_id)
            cancel_session_timer(member)
            group.remove(member.member_id)
        group.generation_id += 1
        group.new_member_added = False
        group.pending_sync.clear()
        now_ms = self._clock_ms()
        if not group.members:
            group.protocol_name = None
            group.transition(S.EMPTY, now_ms)
            logger.info("group %s: generation %d is empty", group.group_id, group.generation_id)
            return
        group.protocol_name = group.select_protocol()
        group.transition(S.COMPLETING_REBALANCE, now_ms)
        logger.info("group %s: generation %d formed with %d members, protocol %s", group.group_id,
                    group.generation_id, len(group.members), group.protocol_name)
        for member in group.members.values():
            join_future, member.join_future = member.join_future, None
            answer(join_future, group.join_result(member, with_members=member.member_id == group.leader_id))
            member.is_new = False
            self.sessions.schedule(group, member)
        group.pending_sync = set(group.members)
        group.sync_timer = self._call_later(
            group.rebalance_timeout_ms(), partial(self._on_sync_timeout, group, group.generation_id))

    def _on_sync_timeout(self, group: Group, generation_id: int) -> None:
        if not self._table.holds(group) or group.generation_id != generation_id:
            return
        group.sync_timer = None
        if group.state not in (S.COMPLETING_REBALANCE, S.STABLE) or not group.pending_sync:
            return
        for member_id in list(group.pending_sync):
            member = group.members.get(member_id)
            if member is not None:
                logger.info("group %s: member %s sent no SyncGroup in time and was removed",
                            group.group_id, member_id)
                cancel_session_timer(member)
                group.remove(member_id)
        self.prepare_rebalance_or_complete_join(group)

    def propagate_assignment(self, group: Group, error: int) -> None:
        """Answer every member waiting in SyncGroup: its assignment, or ``error``."""
        for member in group.members.values():
            if member.sync_future is not None:
                sync_future, member.sync_future = member.sync_future, None
                answer(sync_future, group.sync_result(error, member.assignment))
                self.sessions.schedule(group, member)

    def remove_member(self, group: Group, member: Member) -> None:
        """The member left, or its session ran out: a rebalance without it."""
        # A new member may be removed while its first join waits: it is told to join again.
        join_future, member.join_future = member.join_future, None
        answer(join_future, join_error(UNKNOWN_MEMBER_ID, E.UNKNOWN_MEMBER_ID))
        sync_future, member.sync_future = member.sync_future, None
        answer(sync_future, SyncResult(E.UNKNOWN_MEMBER_ID))
        cancel_session_timer(member)
        group.remove(member.member_id)
        if group.state in (S.STABLE, S.COMPLETING_REBALANCE):
            self.prepare_rebalance(group, f"member {member.member_id} was removed")
        else:
            self.maybe_complete_join(group)

"""What the members of a coordinator's group ask between its rebalances: SyncGroup (the leader hands out the
assignment, the followers wait for it), Heartbeat, LeaveGroup, and whether an OffsetCommit may be stored.
Each checks that the asker is a member of the current generation, and keeps its session
(group_sessions.py); a sync ends a rebalance, a leave starts one (group_rebalance.py)."""

from __future__ import annotations

import asyncio
import logging

from stratalog.broker.group_rebalance import Rebalancer
from stratalog.broker.group_sessions import MemberSessions
from stratalog.broker.group_state import UNKNOWN_MEMBER_ID, E, Group, S, SyncResult, answer
from stratalog.broker.group_table import GroupContext, cancel_sync_timer

logger = logging.getLogger("stratalog.broker.groups")


class GroupSync:
    """SyncGroup, Heartbeat, LeaveGroup and OffsetCommit's check, for one coordinator's groups (the methods of
    :class:`~stratalog.broker.groups.GroupCoordinator` of the same names)."""

    def __init__(self, context: GroupContext, rebalancer: Rebalancer, sessions: MemberSessions) -> None:
        self._table = context.table
        self._config = context.config
        self._clock_ms = context.clock_ms
        self._check_started = context.check_started
        self._rebalancer = rebalancer
        self._sessions = sessions

    # -- SyncGroup ---------------------------------------------------------------------------------------

    async def sync(self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None,
                   protocol_type: str | None, protocol_name: str | None,
                   assignments: dict[str, bytes]) -> SyncResult:
        group, error = self._find_member(group_id, generation_id, member_id, group_instance_id)
        if group is not None and not error:
            error = self._sync_error(group, member_id, protocol_type, protocol_name, assignments)
        if group is None or error:
            return SyncResult(error)
        is_leader = member_id == group.leader_id
        member = group.members[member_id]
        self._sync_received(group, member_id)
        if group.state is S.STABLE:
            self._sessions.schedule(group, member)
            return group.sync_result(E.NONE, member.assignment)
        future: asyncio.Future[SyncResult] = asyncio.get_running_loop().create_future()
        answer(member.sync_future, SyncResult(E.REBALANCE_IN_PROGRESS))  # given up by its client
        member.sync_future = future
        if is_leader:
            for other in group.members.values():
                other.assignment = assignments.get(other.member_id, b"")
            self._rebalancer.propagate_assignment(group, E.NONE)
            group.transition(S.STABLE, self._clock_ms())
            logger.info("group %s: generation %d is stable", group.group_id, group.generation_id)
        return await future

    def _sync_error(self, group: Group, member_id: str, protocol_type: str | None, protocol_name: str | None,
                    assignments: dict[str, bytes]) -> int:
        if ((protocol_type is not None and protocol_type != group.protocol_type)
                or (protocol_name is not None and protocol_name != group.protocol_name)):
            return E.INCONSISTENT_GROUP_PROTOCOL
        if group.state is S.EMPTY:
            return E.UNKNOWN_MEMBER_ID
        if group.state is S.PREPARING_REBALANCE:
            return E.REBALANCE_IN_PROGRESS
        if group.state is S.COMPLETING_REBALANCE and member_id == group.leader_id:
            bound = self._config.member_assignment_bytes_max
            for assigned_id, assignment in assignments.items():
                if len(assignment) > bound:
                    logger.warning("group %s: the leader's assignment of %d bytes for %s (over %d) was "
                                   "refused", group.group_id, len(assignment), assigned_id, bound)
                    return E.INVALID_REQUEST
        return E.NONE

    @staticmethod
    def _sync_received(group: Group, member_id: str) -> None:
        group.pending_sync.discard(member_id)
        if not group.pending_sync:
            cancel_sync_timer(group)

    # -- Heartbeat ---------------------------------------------------------------------------------------

    def heartbeat(self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None) -> int:
        group, error = self._find_member(group_id, generation_id, member_id, group_instance_id)
        if group is None or error:
            return error
        if group.state is S.EMPTY:
            return E.UNKNOWN_MEMBER_ID
        self._sessions.schedule(group, group.members[member_id])
        # CompletingRebalance: a member may heartbeat between its join's answer and its sync's.
        return E.REBALANCE_IN_PROGRESS if group.state is S.PREPARING_REBALANCE else E.NONE

    def _find_member(self, group_id: str, generation_id: int, member_id: str,
                     group_instance_id: str | None) -> tuple[Group | None, int]:
        """The group of a member of the current generation, or the error that says why not (the checks
        SyncGroup and Heartbeat share, in Kafka's order)."""
        if self._table.closed:
            return None, E.COORDINATOR_NOT_AVAILABLE
        self._check_started()
        if not group_id:
            return None, E.INVALID_GROUP_ID
        group = self._table.groups.get(group_id)
        if group is None:
            return None, E.UNKNOWN_MEMBER_ID
        error = group.validate_member(member_id, group_instance_id)
        if not error and generation_id != group.generation_id:
            error = E.ILLEGAL_GENERATION
        return group, error

    # -- LeaveGroup --------------------------------------------------------------------------------------

    def leave(self, group_id: str,
              members: list[tuple[str, str | None]]) -> tuple[int, list[tuple[str, str | None, int]]]:
        if self._table.closed:
            return E.COORDINATOR_NOT_AVAILABLE, []
        self._check_started()
        if not group_id:
            return E.INVALID_GROUP_ID, []
        group = self._table.groups.get(group_id)
        if group is None:
            return E.NONE, [(m, i, int(E.UNKNOWN_MEMBER_ID)) for m, i in members]
        return E.NONE, [(m, i, self._leave_one(group, m, i)) for m, i in members]

    def _leave_one(self, group: Group, member_id: str, group_instance_id: str | None) -> int:
        if group_instance_id is not None:
            existing = group.static_members.get(group_instance_id)
            if existing is None:
                return E.UNKNOWN_MEMBER_ID
            if member_id not in (UNKNOWN_MEMBER_ID, existing):
                return E.FENCED_INSTANCE_ID
            member_id = existing
        elif member_id in group.pending_join:
            group.pending_join.pop(member_id).cancel()
            self._rebalancer.maybe_complete_join(group)
            return E.NONE
        member = group.members.get(member_id)
        if member is None:
            return E.UNKNOWN_MEMBER_ID
        logger.info("group %s: member %s left", group.group_id, member_id)
        self._rebalancer.remove_member(group, member)
        return E.NONE

    # -- OffsetCommit ------------------------------------------------------------------------------------

    def validate_offset_commit(self, group_id: str, generation_id: int, member_id: str,
                               group_instance_id: str | None) -> int:
        if self._table.closed:
            return E.COORDINATOR_NOT_AVAILABLE
        self._check_started()
        group = self._table.groups.get(group_id)
        if group is None:
            # Generation >= 0 names a generation of a group this coordinator does not have (Kafka's answer
            # before OffsetCommit v9 added GROUP_ID_NOT_FOUND).
            return E.NONE if generation_id < 0 else E.ILLEGAL_GENERATION
        if generation_id < 0 and group.state is S.EMPTY:
            return E.NONE
        if generation_id >= 0 or member_id != UNKNOWN_MEMBER_ID or group_instance_id is not None:
            error = group.validate_member(member_id, group_instance_id)
            if not error and generation_id != group.generation_id:
                error = E.ILLEGAL_GENERATION
        else:
            # No member and no generation, but the group has members: only they commit.
            error = E.UNKNOWN_MEMBER_ID
        if not error and group.state is S.COMPLETING_REBALANCE:
            # The member has the new generation but not its assignment yet.
            error = E.REBALANCE_IN_PROGRESS
        if not error and member_id in group.members:
            self._sessions.schedule(group, group.members[member_id])
        return error

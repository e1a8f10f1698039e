"""JoinGroup at a coordinator: who may join a group (its bounds, its protocols), a new member's id
(MEMBER_ID_REQUIRED from v4, KIP-394), a known member's rejoin, and a static member taking over its
instance's place (KIP-345). A join that changes the group starts or completes a rebalance
(group_rebalance.py), and the joining member waits in it."""

from __future__ import annotations

import asyncio
import logging
import uuid

from stratalog.broker.group_rebalance import Rebalancer
from stratalog.broker.group_sessions import MemberSessions
from stratalog.broker.group_state import (
    UNKNOWN_MEMBER_ID,
    E,
    Group,
    JoinRequest,
    JoinResult,
    Member,
    S,
    SyncResult,
    answer,
    join_error,
    unique_protocols,
)
from stratalog.broker.group_table import GroupContext

logger = logging.getLogger("stratalog.broker.groups")


class GroupJoin:
    """The JoinGroups of one coordinator's groups."""

    def __init__(self, context: GroupContext, rebalancer: Rebalancer, sessions: MemberSessions) -> None:
        self._table = context.table
        self._config = context.config
        self._check_started = context.check_started
        self._rebalancer = rebalancer
        self._sessions = sessions

    async def join(self, group_id: str, member_id: str, group_instance_id: str | None, client_id: str,
                   client_host: str, session_timeout_ms: int, rebalance_timeout_ms: int, protocol_type: str,
                   protocols: list[tuple[str, bytes]], require_known_member_id: bool) -> JoinResult:
        """JoinGroup (:meth:`GroupCoordinator.join <stratalog.broker.groups.GroupCoordinator.join>`)."""
        protocols = unique_protocols(protocols)
        error = self._check_join(group_id, session_timeout_ms, protocols)
        if error:
            return join_error(member_id, error)
        future: asyncio.Future[JoinResult] = asyncio.get_running_loop().create_future()
        request = JoinRequest(member_id, group_instance_id, client_id, client_host, session_timeout_ms,
                               rebalance_timeout_ms, protocol_type, protocols, require_known_member_id)
        self._join(group_id, request, future)
        return await future

    def _check_join(self, group_id: str, session_timeout_ms: int, protocols: list[tuple[str, bytes]]) -> int:
        if self._table.closed:
            return E.COORDINATOR_NOT_AVAILABLE
        self._check_started()
        if not group_id:
            return E.INVALID_GROUP_ID
        if not (self._config.group_min_session_timeout_ms <= session_timeout_ms
                <= self._config.group_max_session_timeout_ms):
            return E.INVALID_SESSION_TIMEOUT
        metadata_bytes = sum(len(name.encode("utf-8", "surrogatepass")) + len(metadata)
                             for name, metadata in protocols)
        if metadata_bytes > self._config.member_metadata_bytes_max:
            logger.warning("group %s: a join with %d bytes of protocol metadata (over %d) was refused",
                           group_id, metadata_bytes, self._config.member_metadata_bytes_max)
            return E.INVALID_REQUEST
        return E.NONE

    def _join(self, group_id: str, request: JoinRequest, future: asyncio.Future[JoinResult]) -> None:
        group = self._table.groups.get(group_id)
        if group is None:
            # Only a member without an id creates a group: a member id names a member of an existing one.
            if request.member_id != UNKNOWN_MEMBER_ID:
                answer(future, join_error(request.member_id, E.UNKNOWN_MEMBER_ID))
                return
            group = self._table.create(group_id)
            if group is None:
                answer(future, join_error(request.member_id, E.COORDINATOR_NOT_AVAILABLE))
                return
        if not self._accepts_joining_member(group, request.member_id):
            member = group.members.get(request.member_id)
            if member is not None:
                self._rebalancer.remove_member(group, member)
            answer(future, join_error(UNKNOWN_MEMBER_ID, E.GROUP_MAX_SIZE_REACHED))
        elif request.member_id == UNKNOWN_MEMBER_ID:
            self._join_new_member(group, request, future)
        else:
            self._join_known_member(group, request, future)

    def _accepts_joining_member(self, group: Group, member_id: str) -> bool:
        size_max = self._config.group_max_size
        member = group.members.get(member_id)
        if group.state is S.PREPARING_REBALANCE:
            # Counting the members that joined (not all members) lets the last to rejoin of a group over the
            # bound (after the bound was lowered) be the ones turned away.
            awaiting = sum(1 for m in group.members.values() if m.awaiting_join)
            return (member is not None and member.awaiting_join) or awaiting < size_max
        if group.state in (S.COMPLETING_REBALANCE, S.STABLE):
            return member is not None or len(group.members) < size_max
        return True

    def _join_new_member(self, group: Group, request: JoinRequest, future: asyncio.Future[JoinResult]) -> None:
        if not group.supports(request.protocol_type, request.protocol_names):
            answer(future, join_error(UNKNOWN_MEMBER_ID, E.INCONSISTENT_GROUP_PROTOCOL))
            return
        new_member_id = f"{request.group_instance_id or request.client_id}-{uuid.uuid4()}"
        if request.group_instance_id is not None:
            old_member_id = group.static_members.get(request.group_instance_id)
            if old_member_id is not None:
                self._replace_static_member(group, group.members[old_member_id], new_member_id, request, future)
            else:
                self._add_member_and_rebalance(group, new_member_id, request, future)
        elif request.require_known_member_id:
            if len(group.pending_join) >= self._config.group_max_size:
                answer(future, join_error(UNKNOWN_MEMBER_ID, E.GROUP_MAX_SIZE_REACHED))
                return
            self._sessions.keep_pending(group, new_member_id, request.session_timeout_ms)
            answer(future, join_error(new_member_id, E.MEMBER_ID_REQUIRED))
        else:
            self._add_member_and_rebalance(group, new_member_id, request, future)

    def _join_known_member(self, group: Group, request: JoinRequest,
                           future: asyncio.Future[JoinResult]) -> None:
        member_id = request.member_id
        if not group.supports(request.protocol_type, request.protocol_names):
            answer(future, join_error(member_id, E.INCONSISTENT_GROUP_PROTOCOL))
            return
        if request.group_instance_id is None and member_id in group.pending_join:
            self._add_member_and_rebalance(group, member_id, request, future)
            return
        error = group.validate_member(member_id, request.group_instance_id)
        if error:
            answer(future, join_error(member_id, error))
            return
        member = group.members[member_id]
        unchanged = member.matches(request.protocols)
        if group.state is S.COMPLETING_REBALANCE and unchanged:
            # The same join again (its answer was lost): the current generation, as it was answered.
            answer(future, group.join_result(member, with_members=member_id == group.leader_id))
        elif group.state is S.STABLE and unchanged and member_id != group.leader_id:
            # A follower with nothing new: the current generation, so it can sync. (The leader's join
            # always rebalances: it is how a leader asks for a new assignment, e.g. for new partitions.)
            answer(future, group.join_result(member, with_members=False))
        elif group.state is S.EMPTY:
            answer(future, join_error(member_id, E.UNKNOWN_MEMBER_ID))
        else:
            self._update_member(group, member, request, future)
            self._rebalancer.prepare_rebalance_or_complete_join(group)

    def _add_member_and_rebalance(self, group: Group, member_id: str, request: JoinRequest,
                                  future: asyncio.Future[JoinResult]) -> None:
        pending = group.pending_join.pop(member_id, None)
        if pending is not None:
            pending.cancel()
        member = Member(member_id, request.group_instance_id, request.client_id, request.client_host,
                         request.session_timeout_ms, request.rebalance_timeout_ms, request.protocol_type,
                         request.protocols, is_new=True, join_future=future)
        if group.state is S.PREPARING_REBALANCE and group.previous_state is S.EMPTY:
            group.new_member_added = True
        group.add(member)
        # Not the session timeout: a new member has no id to heartbeat with until its join returns.
        self._sessions.schedule(group, member, self._config.group_new_member_join_timeout_ms)
        self._rebalancer.prepare_rebalance_or_complete_join(group)

    def _replace_static_member(self, group: Group, member: Member, new_member_id: str, request: JoinRequest,
                               future: asyncio.Future[JoinResult]) -> None:
        old_member_id = member.member_id
        current_leader = group.leader_id
        # Whoever still waits under the old id is a duplicate instance: fence it now.
        join_future, member.join_future = member.join_future, None
        answer(join_future, join_error(old_member_id, E.FENCED_INSTANCE_ID))
        sync_future, member.sync_future = member.sync_future, None
        answer(sync_future, SyncResult(E.FENCED_INSTANCE_ID))
        group.replace_static(member, new_member_id)
        member.client_id, member.client_host = request.client_id, request.client_host
        logger.info("group %s: static member %s rejoined; member id %s replaces %s", group.group_id,
                    request.group_instance_id, new_member_id, old_member_id)
        self._update_member(group, member, request, future)
        self._sessions.schedule(group, member)
        if group.state is S.STABLE:
            if group.select_protocol() == group.protocol_name:
                # No rebalance: the member gets the current generation and, at its sync, its assignment. The
                # leader answered is the one before the replacement, so a replaced leader does not take
                # itself for the leader and compute an assignment nobody would receive.
                join_future, member.join_future = member.join_future, None
                answer(join_future, group.join_result(member, with_members=False, leader=current_leader))
            else:
                self._rebalancer.prepare_rebalance(
                    group, f"static member {new_member_id} changes the group's protocol")
        elif group.state is S.COMPLETING_REBALANCE:
            # The leader may be assigning to the old id: the new one would get nothing.
            self._rebalancer.prepare_rebalance(group, f"static member {new_member_id} replaced {old_member_id}")
        else:
            self._rebalancer.maybe_complete_join(group)

    @staticmethod
    def _update_member(group: Group, member: Member, request: JoinRequest,
                       future: asyncio.Future[JoinResult]) -> None:
        group.set_protocols(member, request.protocols)
        member.rebalance_timeout_ms = request.rebalance_timeout_ms
        member.session_timeout_ms = request.session_timeout_ms
        # A join already waiting for this member was given up by its client (one join at a time).
        answer(member.join_future, join_error(member.member_id, E.REBALANCE_IN_PROGRESS))
        member.join_future = future

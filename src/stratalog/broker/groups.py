"""The consumer-group coordinator: Kafka's classic group protocol (JoinGroup, SyncGroup, Heartbeat,
LeaveGroup) and what OffsetCommit, DescribeGroups, ListGroups and DeleteGroups ask of it.

Protocol-agnostic: plain values in, plain values out (request handlers translate wire messages). It runs
on one asyncio event loop; every method is called from the loop's thread. A JoinGroup or SyncGroup that
must wait for the rest of the group is an ``async`` call that returns when the group gets there.

This module is the membership protocol (joins, rebalances, syncs, heartbeats, leaves, sessions) and the
coordinator's facade; the groups it holds are a GroupTable (group_table.py), and listing, deletion and
expiry are GroupAdmin's (group_admin.py).

Group state lives in memory only. As in Kafka, where classic groups are rebuilt from a log, members simply
join again after a broker restart. Committed offsets are durable (:mod:`stratalog.broker.offsets`).

The rules are Kafka's (``ClassicGroup`` and ``GroupMetadataManager`` in its group coordinator):

- States and their transitions (``_PREVIOUS_STATES``)::

      Empty --join--> PreparingRebalance --all joined / rebalance timeout--> CompletingRebalance
      CompletingRebalance --leader's sync--> Stable
      Stable | CompletingRebalance --join with new metadata, leader's join, leave, expiry--> PreparingRebalance
      PreparingRebalance --nobody left--> Empty;  Empty --DeleteGroups--> Dead

- JoinGroup v4+ (KIP-394): a member without an id is given one (``MEMBER_ID_REQUIRED``) and kept as
  *pending* for one session timeout; it joins with that id.
- Static members (KIP-345, ``group.instance.id``): a static member joining without its member id takes over
  its instance's place (the old id is then fenced with ``FENCED_INSTANCE_ID``); in a Stable group that
  does not change the chosen protocol this needs no rebalance, and the member keeps its assignment.
- A rebalance completes when every member (and every pending member) has joined, or after the largest
  rebalance timeout of the members, when the members that did not join are removed. The first rebalance
  of an empty group waits ``group_initial_rebalance_delay_ms`` more for each new member (up to the
  rebalance timeout) so that a starting fleet forms one generation, not one per member.
- The protocol: one that every member supports, chosen by each member's vote for the first of its own
  protocols (in its order of preference) among those.
- After a join completes, members that send no SyncGroup within the rebalance timeout are removed.
- A member whose last heartbeat (or join or sync) is older than its session timeout is removed, except
  while it waits in a join or sync; a new member waits in its first join for at most
  ``group_new_member_join_timeout_ms``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable
from functools import partial

from stratalog.broker.group_admin import GroupAdmin
from stratalog.broker.group_state import (
    UNKNOWN_MEMBER_ID,
    E,
    Group,
    GroupConfig,
    GroupDescription,
    GroupErrorCode,
    GroupState,
    JoinRequest,
    JoinResult,
    LoopTimers,
    Member,
    MemberDescription,
    S,
    SyncResult,
    TimerHandle,
    Timers,
    answer,
    join_error,
    unique_protocols,
    wall_clock_ms,
)
from stratalog.broker.group_table import GroupTable, cancel_join_timer, cancel_session_timer, cancel_sync_timer
from stratalog.broker.offsets import CommittedOffsets
from stratalog.invariant import InvariantError, invariant

logger = logging.getLogger(__name__)


class GroupCoordinator:
    """Consumer groups of one broker. Call :meth:`start` on the event loop first, :meth:`close` last."""

    def __init__(self, offsets: CommittedOffsets, config: GroupConfig | None = None, *,
                 clock_ms: Callable[[], int] = wall_clock_ms, timers: Timers | None = None) -> None:
        self._offsets = offsets
        self._config = config or GroupConfig()
        self._clock_ms = clock_ms
        self._timers = timers
        self._table = GroupTable(self._config, clock_ms)
        self._admin = GroupAdmin(self._table, offsets, self._config, clock_ms, self._check_started)
        self._started = False
        self._retention_task: asyncio.Task[None] | None = None

    @property
    def config(self) -> GroupConfig:
        return self._config

    def start(self) -> None:
        """Bind to the running event loop: its timers (unless others were given) and the periodic
        expiry of old offsets."""
        invariant(not self._started, "the group coordinator was started twice")
        loop = asyncio.get_running_loop()
        if self._timers is None:
            self._timers = LoopTimers(loop)
        self._started = True
        self._retention_task = loop.create_task(self._admin.expire_offsets_periodically())

    async def close(self) -> None:
        """Stop: waiting joins and syncs are answered COORDINATOR_NOT_AVAILABLE (clients find the
        coordinator again and rejoin), every timer is cancelled, and later calls get that error too. The
        offsets store is the caller's to close."""
        if self._table.closed:
            return
        self._table.closed = True
        if self._retention_task is not None:
            self._retention_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._retention_task
            self._retention_task = None
        for group in self._table.groups.values():
            self._table.drop(group, E.COORDINATOR_NOT_AVAILABLE)
        self._table.groups.clear()

    # -- JoinGroup ---------------------------------------------------------------------------------------

    async def join(self, group_id: str, member_id: str, group_instance_id: str | None, client_id: str,
                   client_host: str, session_timeout_ms: int, rebalance_timeout_ms: int, protocol_type: str,
                   protocols: list[tuple[str, bytes]], require_known_member_id: bool) -> JoinResult:
        """JoinGroup. ``require_known_member_id``: the request is v4 or later (KIP-394). JoinGroup v0 has no
        rebalance timeout: pass the session timeout (as Kafka does)."""
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
                self._remove_member(group, member)
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
            group.pending_join[new_member_id] = self._call_later(
                request.session_timeout_ms, partial(self._on_pending_member_expired, group, new_member_id))
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
            self._prepare_rebalance_or_complete_join(group)

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
        self._schedule_session_expiry(group, member, self._config.group_new_member_join_timeout_ms)
        self._prepare_rebalance_or_complete_join(group)

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
        self._schedule_session_expiry(group, member)
        if group.state is S.STABLE:
            if group.select_protocol() == group.protocol_name:
                # No rebalance: the member gets the current generation and, at its sync, its assignment. The
                # leader answered is the one before the replacement, so a replaced leader does not take
                # itself for the leader and compute an assignment nobody would receive.
                join_future, member.join_future = member.join_future, None
                answer(join_future, group.join_result(member, with_members=False, leader=current_leader))
            else:
                self._prepare_rebalance(group, f"static member {new_member_id} changes the group's protocol")
        elif group.state is S.COMPLETING_REBALANCE:
            # The leader may be assigning to the old id: the new one would get nothing.
            self._prepare_rebalance(group, f"static member {new_member_id} replaced {old_member_id}")
        else:
            self._maybe_complete_join(group)

    def _update_member(self, group: Group, member: Member, request: JoinRequest,
                       future: asyncio.Future[JoinResult]) -> None:
        group.set_protocols(member, request.protocols)
        member.rebalance_timeout_ms = request.rebalance_timeout_ms
        member.session_timeout_ms = request.session_timeout_ms
        # A join already waiting for this member was given up by its client (one join at a time).
        answer(member.join_future, join_error(member.member_id, E.REBALANCE_IN_PROGRESS))
        member.join_future = future

    # -- rebalance ---------------------------------------------------------------------------------------

    def _prepare_rebalance_or_complete_join(self, group: Group) -> None:
        if group.state is S.PREPARING_REBALANCE:
            self._maybe_complete_join(group)
        else:
            self._prepare_rebalance(group, "membership changed")

    def _prepare_rebalance(self, group: Group, reason: str) -> None:
        if group.state is S.COMPLETING_REBALANCE:
            # Members waiting in SyncGroup must join again.
            for member in group.members.values():
                member.assignment = b""
            self._propagate_assignment(group, E.REBALANCE_IN_PROGRESS)
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
        self._maybe_complete_join(group)

    def _maybe_complete_join(self, group: Group) -> None:
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
            self._schedule_session_expiry(group, member)
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
        self._prepare_rebalance_or_complete_join(group)

    def _propagate_assignment(self, group: Group, error: int) -> None:
        for member in group.members.values():
            if member.sync_future is not None:
                sync_future, member.sync_future = member.sync_future, None
                answer(sync_future, group.sync_result(error, member.assignment))
                self._schedule_session_expiry(group, member)

    # -- SyncGroup, Heartbeat, LeaveGroup ----------------------------------------------------------------

    async def sync(self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None,
                   protocol_type: str | None, protocol_name: str | None,
                   assignments: dict[str, bytes]) -> SyncResult:
        """SyncGroup. ``protocol_type``/``protocol_name``: ``None`` below v5 (nothing to check). Followers
        wait for the leader's sync; the leader's ``assignments`` (member id -> assignment) are kept."""
        group, error = self._find_member(group_id, generation_id, member_id, group_instance_id)
        if group is not None and not error:
            error = self._sync_error(group, member_id, protocol_type, protocol_name, assignments)
        if group is None or error:
            return SyncResult(error)
        is_leader = member_id == group.leader_id
        member = group.members[member_id]
        self._sync_received(group, member_id)
        if group.state is S.STABLE:
            self._schedule_session_expiry(group, member)
            return group.sync_result(E.NONE, member.assignment)
        future: asyncio.Future[SyncResult] = asyncio.get_running_loop().create_future()
        answer(member.sync_future, SyncResult(E.REBALANCE_IN_PROGRESS))  # given up by its client
        member.sync_future = future
        if is_leader:
            for other in group.members.values():
                other.assignment = assignments.get(other.member_id, b"")
            self._propagate_assignment(group, E.NONE)
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

    def _sync_received(self, group: Group, member_id: str) -> None:
        group.pending_sync.discard(member_id)
        if not group.pending_sync:
            cancel_sync_timer(group)

    def heartbeat(self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None) -> int:
        """Heartbeat: keeps the member's session; REBALANCE_IN_PROGRESS tells it to join again."""
        group, error = self._find_member(group_id, generation_id, member_id, group_instance_id)
        if group is None or error:
            return error
        if group.state is S.EMPTY:
            return E.UNKNOWN_MEMBER_ID
        self._schedule_session_expiry(group, group.members[member_id])
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

    def leave(self, group_id: str,
              members: list[tuple[str, str | None]]) -> tuple[int, list[tuple[str, str | None, int]]]:
        """LeaveGroup: (member id, group instance id) of each leaving member; returns the top-level error and
        each member's. A static member may be removed by its instance id alone (member id ""). LeaveGroup
        v0-2 carries one member: the handler answers with that member's error."""
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
            self._maybe_complete_join(group)
            return E.NONE
        member = group.members.get(member_id)
        if member is None:
            return E.UNKNOWN_MEMBER_ID
        logger.info("group %s: member %s left", group.group_id, member_id)
        self._remove_member(group, member)
        return E.NONE

    # -- sessions ----------------------------------------------------------------------------------------

    def _schedule_session_expiry(self, group: Group, member: Member, timeout_ms: int | None = None) -> None:
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
            self._remove_member(group, member)

    def _on_pending_member_expired(self, group: Group, member_id: str) -> None:
        if self._table.holds(group) and group.pending_join.pop(member_id, None) is not None:
            self._maybe_complete_join(group)

    def _remove_member(self, group: Group, member: Member) -> None:
        # A new member may be removed while its first join waits: it is told to join again.
        join_future, member.join_future = member.join_future, None
        answer(join_future, join_error(UNKNOWN_MEMBER_ID, E.UNKNOWN_MEMBER_ID))
        sync_future, member.sync_future = member.sync_future, None
        answer(sync_future, SyncResult(E.UNKNOWN_MEMBER_ID))
        cancel_session_timer(member)
        group.remove(member.member_id)
        if group.state in (S.STABLE, S.COMPLETING_REBALANCE):
            self._prepare_rebalance(group, f"member {member.member_id} was removed")
        else:
            self._maybe_complete_join(group)

    # -- OffsetCommit ------------------------------------------------------------------------------------

    def validate_offset_commit(self, group_id: str, generation_id: int, member_id: str,
                               group_instance_id: str | None) -> int:
        """What OffsetCommit may do: 0 to store the offsets, or the error for every partition. Generation -1
        with no member: a standalone consumer's (or an admin tool's) commit, for a group without members."""
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
            self._schedule_session_expiry(group, group.members[member_id])
        return error

    # -- DescribeGroups, ListGroups, DeleteGroups, retention: group_admin.py ------------------------------

    def describe(self, group_ids: list[str]) -> list[GroupDescription]:
        return self._admin.describe(group_ids)

    def list_groups(self, states_filter: set[str] | None = None) -> list[tuple[str, str, str]]:
        return self._admin.list_groups(states_filter)

    def delete_groups(self, group_ids: list[str]) -> list[tuple[str, int]]:
        return self._admin.delete_groups(group_ids)

    def unload(self, group_id: str) -> bool:
        return self._admin.unload(group_id)

    def expire_offsets(self) -> int:
        return self._admin.expire_offsets()

    # -- plumbing ----------------------------------------------------------------------------------------

    def _call_later(self, delay_ms: int, callback: Callable[[], None]) -> TimerHandle:
        timers = self._timers
        if timers is None or not self._started:
            raise InvariantError("the group coordinator was not started")
        return timers.call_later_ms(max(delay_ms, 0), callback)

    def _check_started(self) -> None:
        invariant(self._started, "call GroupCoordinator.start() on the event loop first")

__all__ = [
    "GroupConfig", "GroupCoordinator", "GroupDescription", "GroupErrorCode", "GroupState", "JoinResult",
    "MemberDescription", "SyncResult",
]

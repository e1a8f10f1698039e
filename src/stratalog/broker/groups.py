"""The consumer-group coordinator: Kafka's classic group protocol (JoinGroup, SyncGroup, Heartbeat,
LeaveGroup) and what OffsetCommit, DescribeGroups, ListGroups and DeleteGroups ask of it.

Protocol-agnostic: plain values in, plain values out (request handlers translate wire messages). It runs
on one asyncio event loop; every method is called from the loop's thread. A JoinGroup or SyncGroup that
must wait for the rest of the group is an ``async`` call that returns when the group gets there.

This module is the coordinator's facade: it owns what its parts share (a GroupContext: the groups held, a
GroupTable of group_table.py; the bounds, clock and timers) and hands each call to the part it is about.
The membership protocol's parts: JoinGroup (group_join.py), the rebalance (group_rebalance.py), SyncGroup,
Heartbeat, LeaveGroup and OffsetCommit's check (group_sync.py), the members' sessions (group_sessions.py);
listing, deletion and expiry are GroupAdmin's (group_admin.py).

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
from collections.abc import Callable

from stratalog.broker.group_admin import GroupAdmin
from stratalog.broker.group_join import GroupJoin
from stratalog.broker.group_rebalance import Rebalancer
from stratalog.broker.group_state import (
    E,
    GroupConfig,
    GroupDescription,
    GroupErrorCode,
    GroupState,
    JoinResult,
    LoopTimers,
    MemberDescription,
    SyncResult,
    TimerHandle,
    Timers,
    wall_clock_ms,
)
from stratalog.broker.group_sync import GroupSync
from stratalog.broker.group_table import GroupContext, GroupTable
from stratalog.broker.offsets import CommittedOffsets
from stratalog.invariant import InvariantError, invariant


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
        context = GroupContext(self._table, self._config, clock_ms, self._call_later, self._check_started)
        rebalancer = Rebalancer(context)
        self._joins = GroupJoin(context, rebalancer, rebalancer.sessions)
        self._syncs = GroupSync(context, rebalancer, rebalancer.sessions)
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

    # -- JoinGroup: group_join.py ------------------------------------------------------------------------

    async def join(self, group_id: str, member_id: str, group_instance_id: str | None, client_id: str,
                   client_host: str, session_timeout_ms: int, rebalance_timeout_ms: int, protocol_type: str,
                   protocols: list[tuple[str, bytes]], require_known_member_id: bool) -> JoinResult:
        """JoinGroup. ``require_known_member_id``: the request is v4 or later (KIP-394). JoinGroup v0 has no
        rebalance timeout: pass the session timeout (as Kafka does)."""
        return await self._joins.join(group_id, member_id, group_instance_id, client_id, client_host,
                                      session_timeout_ms, rebalance_timeout_ms, protocol_type, protocols,
                                      require_known_member_id)

    # -- SyncGroup, Heartbeat, LeaveGroup, OffsetCommit: group_sync.py ------------------------------------

    async def sync(self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None,
                   protocol_type: str | None, protocol_name: str | None,
                   assignments: dict[str, bytes]) -> SyncResult:
        """SyncGroup. ``protocol_type``/``protocol_name``: ``None`` below v5 (nothing to check). Followers
        wait for the leader's sync; the leader's ``assignments`` (member id -> assignment) are kept."""
        return await self._syncs.sync(group_id, generation_id, member_id, group_instance_id, protocol_type,
                                      protocol_name, assignments)

    def heartbeat(self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None) -> int:
        """Heartbeat: keeps the member's session; REBALANCE_IN_PROGRESS tells it to join again."""
        return self._syncs.heartbeat(group_id, generation_id, member_id, group_instance_id)

    def leave(self, group_id: str,
              members: list[tuple[str, str | None]]) -> tuple[int, list[tuple[str, str | None, int]]]:
        """LeaveGroup: (member id, group instance id) of each leaving member; returns the top-level error and
        each member's. A static member may be removed by its instance id alone (member id ""). LeaveGroup
        v0-2 carries one member: the handler answers with that member's error."""
        return self._syncs.leave(group_id, members)

    def validate_offset_commit(self, group_id: str, generation_id: int, member_id: str,
                               group_instance_id: str | None) -> int:
        """What OffsetCommit may do: 0 to store the offsets, or the error for every partition. Generation -1
        with no member: a standalone consumer's (or an admin tool's) commit, for a group without members."""
        return self._syncs.validate_offset_commit(group_id, generation_id, member_id, group_instance_id)

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

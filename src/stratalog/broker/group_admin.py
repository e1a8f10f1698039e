"""What is asked of a coordinator's consumer groups besides their membership protocol (groups.py):
DescribeGroups, ListGroups, DeleteGroups, the handoff of a group's coordination to another broker
(unload), and the expiry of old committed offsets and of Empty groups that have none left."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from stratalog.broker.group_state import E, GroupConfig, GroupDescription, MemberDescription, S
from stratalog.broker.group_table import GroupTable
from stratalog.broker.offsets import CommittedOffsets

logger = logging.getLogger("stratalog.broker.groups")


class GroupAdmin:
    """The listing, deletion and expiry of one coordinator's groups (its table) and their committed offsets.
    Every method is called from the event loop's thread, after the coordinator started."""

    def __init__(self, table: GroupTable, offsets: CommittedOffsets, config: GroupConfig,
                 clock_ms: Callable[[], int], check_started: Callable[[], None]) -> None:
        self._table = table
        self._offsets = offsets
        self._config = config
        self._clock_ms = clock_ms
        self._check_started = check_started

    def describe(self, group_ids: list[str]) -> list[GroupDescription]:
        """DescribeGroups. A group known only by its committed offsets (a standalone consumer's, or any
        group after a restart) is Empty with no protocol type."""
        if self._table.closed:
            return [GroupDescription(E.COORDINATOR_NOT_AVAILABLE, g, "", "", "", []) for g in group_ids]
        self._check_started()
        return [self._describe_one(group_id) for group_id in group_ids]

    def _describe_one(self, group_id: str) -> GroupDescription:
        group = self._table.groups.get(group_id)
        if group is None:
            state = S.EMPTY if self._offsets.has_group(group_id) else S.DEAD
            return GroupDescription(E.NONE, group_id, state.value, "", "", [])
        stable = group.state is S.STABLE
        members = [MemberDescription(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                                     m.metadata(group.protocol_name) if stable else b"",
                                     m.assignment if stable else b"")
                   for m in group.members.values()]
        return GroupDescription(E.NONE, group_id, group.state.value, group.protocol_type or "",
                                (group.protocol_name or "") if stable else "", members)

    def list_groups(self, states_filter: set[str] | None = None) -> list[tuple[str, str, str]]:
        """ListGroups: (group id, protocol type, state) of every group, or of those in ``states_filter``
        (state names, any case). Groups known only by their committed offsets are Empty."""
        if self._table.closed:
            return []
        self._check_started()
        listed = {gid: (gid, g.protocol_type or "", g.state.value) for gid, g in self._table.groups.items()}
        for group_id in self._offsets.groups():
            listed.setdefault(group_id, (group_id, "", S.EMPTY.value))
        wanted = None if not states_filter else {s.lower() for s in states_filter}
        return [row for _, row in sorted(listed.items()) if wanted is None or row[2].lower() in wanted]

    def delete_groups(self, group_ids: list[str]) -> list[tuple[str, int]]:
        """DeleteGroups: each group with its error (NON_EMPTY_GROUP while it has members, GROUP_ID_NOT_FOUND
        for one the coordinator does not know). A deleted group's committed offsets are deleted too (one
        durable write each, on the caller's thread)."""
        if self._table.closed:
            return [(group_id, int(E.COORDINATOR_NOT_AVAILABLE)) for group_id in group_ids]
        self._check_started()
        results = []
        for group_id in group_ids:
            group = self._table.groups.get(group_id)
            if group is not None and group.state is not S.EMPTY:
                results.append((group_id, int(E.NON_EMPTY_GROUP)))
                continue
            if group is None and not self._offsets.has_group(group_id):
                results.append((group_id, int(E.GROUP_ID_NOT_FOUND)))
                continue
            if group is not None:
                self._table.remove(group, E.COORDINATOR_NOT_AVAILABLE)
                group.transition(S.DEAD, self._clock_ms())
            self._offsets.delete_group(group_id)
            logger.info("group %s deleted", group_id)
            results.append((group_id, int(E.NONE)))
        return results

    def unload(self, group_id: str) -> bool:
        """Forget a group's membership: its coordination moved to another broker (a cluster). Whoever waits
        in a join or sync is answered NOT_COORDINATOR, so clients find the new coordinator and join there;
        committed offsets stay (they are shared). Returns whether the group was known here."""
        group = self._table.groups.get(group_id)
        if group is None:
            return False
        self._table.remove(group, E.NOT_COORDINATOR)
        logger.info("group %s unloaded: its coordinator is another broker now", group_id)
        return True

    def expire_offsets(self) -> int:
        """Drop the committed offsets past retention (see :meth:`CommittedOffsets.expire`), and Empty groups
        past retention that have none left; returns how many offsets were dropped. Runs every
        ``offsets_retention_check_interval_ms`` once started; one durable write on the loop's thread."""
        now_ms = self._clock_ms()
        retention_ms = self._config.offsets_retention_ms

        def empty_since_ms(group_id: str) -> int | None:
            group = self._table.groups.get(group_id)
            if group is None:
                return 0
            return group.state_since_ms if group.state is S.EMPTY and not group.pending_join else None

        removed = self._offsets.expire(now_ms, retention_ms, empty_since_ms)
        for group in list(self._table.groups.values()):
            since_ms = empty_since_ms(group.group_id)
            if (since_ms is not None and since_ms <= now_ms - retention_ms
                    and not self._offsets.has_group(group.group_id)):
                self._table.remove(group, E.COORDINATOR_NOT_AVAILABLE)
        return removed

    async def expire_offsets_periodically(self) -> None:
        while True:
            await asyncio.sleep(self._config.offsets_retention_check_interval_ms / 1000)
            try:
                removed = self.expire_offsets()
            except Exception as e:  # a failed pass (disk full, I/O error) is retried at the next interval
                logger.warning("expiring committed offsets failed: %s", e)
            else:
                if removed:
                    logger.info("expired %d committed offsets", removed)

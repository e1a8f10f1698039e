"""The consumer-group coordinator: Kafka's classic group protocol, driven by a manual clock (and once by the
event loop's own timers)."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from stratalog.broker.groups import (
    GroupConfig,
    GroupCoordinator,
    GroupErrorCode,
    JoinResult,
    SyncResult,
)
from stratalog.broker.offsets import CommittedOffsets, OffsetEntry

E = GroupErrorCode
T = TypeVar("T")

SESSION_MS = 100
REBALANCE_MS = 1000
CONSUMER = "consumer"
RANGE = [("range", b"range-meta")]


@dataclass(order=True)
class _Timer:
    due_ms: int
    seq: int
    callback: Callable[[], None] = field(compare=False)
    cancelled: bool = field(default=False, compare=False)

    def cancel(self) -> None:
        self.cancelled = True


class ManualTimers:
    """The coordinator's clock and deadlines, moved on by the test."""

    def __init__(self) -> None:
        self.now_ms = 0
        self._due: list[_Timer] = []
        self._seq = 0

    def clock_ms(self) -> int:
        return self.now_ms

    def call_later_ms(self, delay_ms: int, callback: Callable[[], None]) -> _Timer:
        self._seq += 1
        timer = _Timer(self.now_ms + delay_ms, self._seq, callback)
        heapq.heappush(self._due, timer)
        return timer

    async def advance(self, delta_ms: int) -> None:
        """Move the clock on, firing what falls due in order, then let the woken tasks run."""
        target_ms = self.now_ms + delta_ms
        while self._due and self._due[0].due_ms <= target_ms:
            timer = heapq.heappop(self._due)
            if not timer.cancelled:
                self.now_ms = timer.due_ms
                timer.callback()
        self.now_ms = target_ms
        await settle()


async def settle() -> None:
    """Let every task that can run reach its next wait (no time passes)."""
    for _ in range(5):
        await asyncio.sleep(0)


#: A scenario that waits longer is stuck: a call waits for something that will not come.
SCENARIO_S_MAX = 5.0


def run(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), SCENARIO_S_MAX))


@dataclass
class Harness:
    coordinator: GroupCoordinator
    timers: ManualTimers
    offsets: CommittedOffsets

    async def join(self, member_id: str = "", *, group: str = "g", instance: str | None = None,
                   protocols: list[tuple[str, bytes]] | None = None, protocol_type: str = CONSUMER,
                   client_id: str = "client", session_ms: int = SESSION_MS, rebalance_ms: int = REBALANCE_MS,
                   require_known: bool = True) -> JoinResult:
        return await self.coordinator.join(group, member_id, instance, client_id, "/127.0.0.1", session_ms,
                                           rebalance_ms, protocol_type,
                                           RANGE if protocols is None else protocols, require_known)

    async def join_new(self, **kwargs: Any) -> JoinResult:
        """KIP-394's two steps: ask for an id, then join with it."""
        first = await self.join(**kwargs)
        assert first.error_code == E.MEMBER_ID_REQUIRED
        return await self.join(first.member_id, **kwargs)

    async def sync(self, member_id: str, generation_id: int, assignments: dict[str, bytes] | None = None, *,
                   group: str = "g", instance: str | None = None) -> SyncResult:
        return await self.coordinator.sync(group, generation_id, member_id, instance, CONSUMER, "range",
                                           assignments or {})

    def heartbeat(self, member_id: str, generation_id: int, *, group: str = "g",
                  instance: str | None = None) -> int:
        return self.coordinator.heartbeat(group, generation_id, member_id, instance)

    def state(self, group: str = "g") -> str:
        return self.coordinator.describe([group])[0].state

    async def stable_pair(self, session_ms: int = SESSION_MS) -> tuple[str, str, int]:
        """Two members, a and b, in a Stable group: a leads, assigns b"a" and b"b"."""
        a = await self.join_new(client_id="a", session_ms=session_ms)
        assert (await self.sync(a.member_id, a.generation_id, {a.member_id: b"a"})).assignment == b"a"
        b_join = await started(self.join_new(client_id="b", session_ms=session_ms))
        assert self.heartbeat(a.member_id, a.generation_id) == E.REBALANCE_IN_PROGRESS
        a2 = await self.join(a.member_id, session_ms=session_ms)
        await settle()
        b = finished(b_join)
        assert a2.generation_id == b.generation_id == a.generation_id + 1
        b_sync = await started(self.sync(b.member_id, b.generation_id))
        await self.sync(a2.member_id, a2.generation_id, {a.member_id: b"a", b.member_id: b"b"})
        await settle()
        assert finished(b_sync).assignment == b"b"
        return a.member_id, b.member_id, b.generation_id


def finished(task: asyncio.Future[T]) -> T:
    """The answer of a call that must have returned by now (a wrong coordinator fails here, not hangs)."""
    assert task.done(), "the call is still waiting"
    return task.result()


async def started(coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """Start ``coro`` and let it run up to where it waits."""
    task = asyncio.ensure_future(coro)
    await settle()
    return task


@contextlib.asynccontextmanager
async def harness(tmp_path: Path, **config: int) -> AsyncIterator[Harness]:
    settings: dict[str, int] = {"group_min_session_timeout_ms": 10, "group_initial_rebalance_delay_ms": 0}
    settings.update(config)
    timers = ManualTimers()
    offsets = CommittedOffsets(tmp_path / "offsets.sqlite")
    coordinator = GroupCoordinator(offsets, GroupConfig(**settings), clock_ms=timers.clock_ms, timers=timers)
    coordinator.start()
    try:
        yield Harness(coordinator, timers, offsets)
    finally:
        await coordinator.close()
        offsets.close()


# -- joining ----------------------------------------------------------------------------------------------


def test_a_member_without_an_id_is_given_one_and_joins_with_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            first = await h.join(client_id="client-1")
            assert first.error_code == E.MEMBER_ID_REQUIRED
            assert first.member_id.startswith("client-1-")
            assert h.state() == "Empty"

            joined = await h.join(first.member_id)

            assert joined.error_code == E.NONE
            assert joined.member_id == joined.leader == first.member_id
            assert joined.generation_id == 1
            assert (joined.protocol_type, joined.protocol_name) == (CONSUMER, "range")
            assert joined.members == [(first.member_id, None, b"range-meta")]
            assert h.state() == "CompletingRebalance"
            assert (await h.join("made-up-id")).error_code == E.UNKNOWN_MEMBER_ID
    run(scenario)


def test_a_join_below_v4_is_given_its_id_and_joined_at_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            joined = await h.join(client_id="old-client", require_known=False)
            assert joined.error_code == E.NONE
            assert joined.member_id.startswith("old-client-")
            assert joined.leader == joined.member_id
    run(scenario)


def test_a_single_member_leads_and_its_sync_gives_its_assignment(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            joined = await h.join_new()

            synced = await h.sync(joined.member_id, joined.generation_id, {joined.member_id: b"all-partitions"})

            assert synced == SyncResult(E.NONE, CONSUMER, "range", b"all-partitions")
            assert h.state() == "Stable"
            assert h.heartbeat(joined.member_id, joined.generation_id) == E.NONE
            member = h.coordinator.describe(["g"])[0].members[0]
            assert (member.member_metadata, member.member_assignment) == (b"range-meta", b"all-partitions")
    run(scenario)


def test_a_second_member_makes_the_first_rejoin_and_both_sync_the_leaders_assignment(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            a = await h.join_new(client_id="a")
            await h.sync(a.member_id, 1, {a.member_id: b"everything"})

            b_join = await started(h.join_new(client_id="b"))
            assert not b_join.done()  # waits for a to rejoin
            assert h.state() == "PreparingRebalance"
            assert h.heartbeat(a.member_id, 1) == E.REBALANCE_IN_PROGRESS

            a2 = await h.join(a.member_id)
            await settle()
            b = finished(b_join)

            assert a2.generation_id == b.generation_id == 2
            assert a2.leader == b.leader == a.member_id
            assert {m[0] for m in a2.members} == {a.member_id, b.member_id}
            assert b.members == []
            b_sync = await started(h.sync(b.member_id, 2))
            assert not b_sync.done()  # waits for the leader's assignment
            a_sync = await h.sync(a.member_id, 2, {a.member_id: b"half-1", b.member_id: b"half-2"})
            await settle()
            assert a_sync.assignment == b"half-1"
            assert finished(b_sync).assignment == b"half-2"
            assert h.heartbeat(b.member_id, 2) == E.NONE
            assert h.state() == "Stable"
    run(scenario)


def test_the_first_rebalance_of_an_empty_group_waits_for_more_members(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path, group_initial_rebalance_delay_ms=300) as h:
            a = await started(h.join(client_id="a", require_known=False))
            await h.timers.advance(200)
            b = await started(h.join(client_id="b", require_known=False))
            await h.timers.advance(399)  # b came during the first 300 ms: 300 ms more from then
            assert not a.done() and not b.done()

            await h.timers.advance(1)

            assert finished(a).generation_id == finished(b).generation_id == 1
            assert len(finished(a).members) == 2
    run(scenario)


# -- protocols and bounds ---------------------------------------------------------------------------------


def test_the_protocol_is_the_common_one_most_members_prefer(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path, group_initial_rebalance_delay_ms=100) as h:
            preferences = [[("x", b"1"), ("y", b"2"), ("z", b"3")],
                           [("y", b"4"), ("x", b"5")],
                           [("y", b"6"), ("x", b"7"), ("z", b"8")]]
            joins = [await started(h.join(client_id=f"c{n}", protocols=p, require_known=False))
                     for n, p in enumerate(preferences)]
            await h.timers.advance(200)  # the initial delay, again for the members that came during it

            results = [finished(j) for j in joins]

            # z is not supported by everyone; y has two votes of three.
            assert {r.protocol_name for r in results} == {"y"}
            leader = next(r for r in results if r.members)
            assert sorted(m[2] for m in leader.members) == [b"2", b"4", b"6"]
    run(scenario)


def test_a_member_with_no_common_protocol_or_another_type_is_refused(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            assert (await h.join(protocols=[])).error_code == E.INCONSISTENT_GROUP_PROTOCOL
            await h.join_new()

            other_type = await h.join(protocol_type="connect")
            other_protocol = await h.join(protocols=[("roundrobin", b"")])

            assert other_type.error_code == E.INCONSISTENT_GROUP_PROTOCOL
            assert other_protocol.error_code == E.INCONSISTENT_GROUP_PROTOCOL
            assert len(h.coordinator.describe(["g"])[0].members) == 1
    run(scenario)


def test_a_session_timeout_outside_the_bounds_is_refused(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path, group_min_session_timeout_ms=50, group_max_session_timeout_ms=500) as h:
            assert (await h.join(session_ms=49)).error_code == E.INVALID_SESSION_TIMEOUT
            assert (await h.join(session_ms=501)).error_code == E.INVALID_SESSION_TIMEOUT
            assert (await h.join(session_ms=500)).error_code == E.MEMBER_ID_REQUIRED
    run(scenario)


def test_metadata_over_the_bound_is_refused(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path, member_metadata_bytes_max=100) as h:
            assert (await h.join(protocols=[("range", b"x" * 101)])).error_code == E.INVALID_REQUEST
            assert (await h.join(protocols=[("range", b"x" * 90)])).error_code == E.MEMBER_ID_REQUIRED
    run(scenario)


def test_a_group_at_its_size_bound_refuses_new_members(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path, group_max_size=1) as h:
            a = await h.join_new()
            await h.sync(a.member_id, a.generation_id)

            refused = await h.join()

            assert refused.error_code == E.GROUP_MAX_SIZE_REACHED
            assert h.state() == "Stable"
    run(scenario)


def test_a_stale_generation_is_illegal(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            a = await h.join_new()
            await h.sync(a.member_id, a.generation_id)

            assert h.heartbeat(a.member_id, a.generation_id - 1) == E.ILLEGAL_GENERATION
            assert (await h.sync(a.member_id, a.generation_id + 1)).error_code == E.ILLEGAL_GENERATION
            assert h.heartbeat("stranger", a.generation_id) == E.UNKNOWN_MEMBER_ID
            assert h.heartbeat(a.member_id, a.generation_id, group="other") == E.UNKNOWN_MEMBER_ID
    run(scenario)


def test_a_sync_naming_another_protocol_is_inconsistent(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            a = await h.join_new()

            synced = await h.coordinator.sync("g", a.generation_id, a.member_id, None, CONSUMER, "sticky", {})

            assert synced.error_code == E.INCONSISTENT_GROUP_PROTOCOL
    run(scenario)


# -- leaving and expiring ---------------------------------------------------------------------------------


def test_a_leaving_member_makes_the_others_rebalance(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            a, b, generation = await h.stable_pair()

            assert h.coordinator.leave("g", [(b, None), ("stranger", None)]) == (
                E.NONE, [(b, None, E.NONE), ("stranger", None, E.UNKNOWN_MEMBER_ID)])

            assert h.heartbeat(a, generation) == E.REBALANCE_IN_PROGRESS
            alone = await h.join(a)
            assert alone.generation_id == generation + 1
            assert alone.members == [(a, None, b"range-meta")]
            assert h.heartbeat(b, generation) == E.UNKNOWN_MEMBER_ID

            h.coordinator.leave("g", [(a, None)])
            assert h.state() == "Empty"
    run(scenario)


def test_a_silent_member_is_removed_when_its_session_expires(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            a, b, generation = await h.stable_pair()
            await h.timers.advance(SESSION_MS - 10)
            assert h.heartbeat(a, generation) == E.NONE  # a keeps its session; b says nothing
            assert h.state() == "Stable"

            await h.timers.advance(10)

            assert h.state() == "PreparingRebalance"
            assert h.heartbeat(b, generation) == E.UNKNOWN_MEMBER_ID
            assert h.heartbeat(a, generation) == E.REBALANCE_IN_PROGRESS
            assert [m.member_id for m in h.coordinator.describe(["g"])[0].members] == [a]
    run(scenario)


def test_session_expiry_runs_on_the_event_loops_timers(tmp_path: Path) -> None:
    async def scenario() -> None:
        offsets = CommittedOffsets(tmp_path / "offsets.sqlite")
        config = GroupConfig(group_min_session_timeout_ms=10, group_initial_rebalance_delay_ms=0)
        coordinator = GroupCoordinator(offsets, config)  # the loop's timers and the wall clock
        coordinator.start()

        async def join(member_id: str = "", rebalance_ms: int = 10_000) -> JoinResult:
            return await coordinator.join("g", member_id, None, "c", "h", 50, rebalance_ms, CONSUMER, RANGE, False)

        try:
            a = await join()
            await coordinator.sync("g", a.generation_id, a.member_id, None, None, None, {})
            b_join = await started(join())  # b's join makes a join again
            a2 = await join(a.member_id)
            b = await asyncio.wait_for(b_join, timeout=5)
            await coordinator.sync("g", b.generation_id, a.member_id, None, None, None, {})
            await coordinator.sync("g", b.generation_id, b.member_id, None, None, None, {})
            # a rejoins and waits for b, which never heartbeats: its 50 ms session ends the wait (the
            # rebalance timeout is 10 s).
            a3 = await asyncio.wait_for(join(a2.member_id), timeout=5)

            assert a3.generation_id == b.generation_id + 1
            assert a3.members == [(a.member_id, None, b"range-meta")]
        finally:
            await coordinator.close()
            offsets.close()
    run(scenario)


def test_members_that_do_not_rejoin_within_the_rebalance_timeout_are_removed(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            a, b, generation = await h.stable_pair(session_ms=5000)
            a_join = await started(h.join(a, session_ms=5000))
            await h.timers.advance(REBALANCE_MS - 1)
            assert not a_join.done()
            assert h.heartbeat(b, generation) == E.REBALANCE_IN_PROGRESS  # b is alive but does not rejoin

            await h.timers.advance(1)

            rejoined = finished(a_join)
            assert rejoined.generation_id == generation + 1
            assert [m[0] for m in rejoined.members] == [a]
    run(scenario)


def test_members_that_never_sync_are_removed_after_the_rebalance_timeout(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            a, b, _ = await h.stable_pair(session_ms=5000)
            a_join = await started(h.join(a, session_ms=5000))
            b2 = await h.join(b, session_ms=5000)
            await settle()
            a2 = finished(a_join)
            await h.sync(a, a2.generation_id, {a: b"x", b: b"y"})  # the leader syncs; b never does
            h.heartbeat(b, b2.generation_id)

            await h.timers.advance(REBALANCE_MS)

            assert h.heartbeat(b, b2.generation_id) == E.UNKNOWN_MEMBER_ID
            assert h.heartbeat(a, a2.generation_id) == E.REBALANCE_IN_PROGRESS
    run(scenario)


def test_a_pending_member_that_never_joins_expires_and_lets_the_rebalance_finish(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            a = await h.join_new()
            await h.sync(a.member_id, a.generation_id)
            pending = await h.join(session_ms=200)
            assert pending.error_code == E.MEMBER_ID_REQUIRED
            a_join = await started(h.join(a.member_id, session_ms=5000))  # the leader's join rebalances
            await h.timers.advance(199)
            assert not a_join.done()  # waits for the pending member

            await h.timers.advance(1)

            assert finished(a_join).generation_id == a.generation_id + 1
            assert (await h.join(pending.member_id)).error_code == E.UNKNOWN_MEMBER_ID
    run(scenario)


# -- static membership ------------------------------------------------------------------------------------


def test_a_restarted_static_member_takes_its_place_back_and_fences_its_old_id(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            a = await h.join(instance="instance-a", client_id="a")  # static: no MEMBER_ID_REQUIRED
            assert a.error_code == E.NONE and a.member_id.startswith("instance-a-")
            await h.sync(a.member_id, a.generation_id, {a.member_id: b"a"}, instance="instance-a")
            b_join = await started(h.join_new(client_id="b"))
            a2 = await h.join(a.member_id, instance="instance-a")
            b = await b_join
            b_sync = await started(h.sync(b.member_id, b.generation_id))
            await h.sync(a.member_id, a2.generation_id, {a.member_id: b"part-a", b.member_id: b"part-b"},
                         instance="instance-a")
            await b_sync

            restarted = finished(await started(h.join(instance="instance-a", client_id="a")))

            # No rebalance: the same generation, and the old leader named so the new id computes nothing.
            assert restarted.error_code == E.NONE
            assert restarted.member_id != a.member_id
            assert restarted.generation_id == a2.generation_id
            assert restarted.leader == a.member_id and restarted.members == []
            assert h.state() == "Stable"
            synced = await h.sync(restarted.member_id, restarted.generation_id, instance="instance-a")
            assert synced.assignment == b"part-a"
            assert h.heartbeat(b.member_id, b.generation_id) == E.NONE
            assert h.heartbeat(a.member_id, a2.generation_id, instance="instance-a") == E.FENCED_INSTANCE_ID
            assert (await h.join(a.member_id, instance="instance-a")).error_code == E.FENCED_INSTANCE_ID
            assert h.coordinator.validate_offset_commit("g", a2.generation_id, a.member_id,
                                                        "instance-a") == E.FENCED_INSTANCE_ID
    run(scenario)


def test_a_static_member_can_be_removed_by_its_instance_id(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            a = await h.join(instance="i")
            await h.sync(a.member_id, a.generation_id, instance="i")

            fenced = h.coordinator.leave("g", [("not-its-id", "i")])
            removed = h.coordinator.leave("g", [("", "i")])

            assert fenced == (E.NONE, [("not-its-id", "i", E.FENCED_INSTANCE_ID)])
            assert removed == (E.NONE, [("", "i", E.NONE)])
            assert h.state() == "Empty"
    run(scenario)


# -- offsets, admin ---------------------------------------------------------------------------------------


def test_offset_commits_are_validated_as_kafka_does(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            validate = h.coordinator.validate_offset_commit
            assert validate("standalone", -1, "", None) == E.NONE
            assert validate("standalone", 3, "m", None) == E.ILLEGAL_GENERATION

            a = await h.join_new()
            # CompletingRebalance: the member knows its generation but not yet its assignment.
            assert validate("g", a.generation_id, a.member_id, None) == E.REBALANCE_IN_PROGRESS
            await h.sync(a.member_id, a.generation_id)

            assert validate("g", a.generation_id, a.member_id, None) == E.NONE
            assert validate("g", a.generation_id - 1, a.member_id, None) == E.ILLEGAL_GENERATION
            assert validate("g", a.generation_id, "stranger", None) == E.UNKNOWN_MEMBER_ID
            assert validate("g", -1, "", None) == E.UNKNOWN_MEMBER_ID  # the group has members
            b_join = await started(h.join_new())
            assert validate("g", a.generation_id, a.member_id, None) == E.NONE  # PreparingRebalance
            await h.join(a.member_id)
            await settle()
            b = finished(b_join)

            h.coordinator.leave("g", [(a.member_id, None), (b.member_id, None)])
            assert validate("g", -1, "", None) == E.NONE  # empty again
    run(scenario)


def test_describe_list_and_delete_groups(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            a = await h.join_new(client_id="cli")
            await h.sync(a.member_id, a.generation_id, {a.member_id: b"asg"})
            standalone = OffsetEntry("t", 0, 5, -1, None, 0)
            h.offsets.commit("simple", [standalone])
            h.offsets.commit("g", [OffsetEntry("t", 0, 9, -1, None, 0)])

            described = {d.group_id: d for d in h.coordinator.describe(["g", "simple", "nobody"])}
            assert (described["g"].state, described["g"].protocol_type, described["g"].protocol_data) == (
                "Stable", CONSUMER, "range")
            (member,) = described["g"].members
            assert (member.member_id, member.client_id, member.client_host) == (a.member_id, "cli", "/127.0.0.1")
            assert (described["simple"].state, described["nobody"].state) == ("Empty", "Dead")

            assert h.coordinator.list_groups(None) == [("g", CONSUMER, "Stable"), ("simple", "", "Empty")]
            assert h.coordinator.list_groups({"empty"}) == [("simple", "", "Empty")]

            assert h.coordinator.delete_groups(["g", "nobody", "simple"]) == [
                ("g", E.NON_EMPTY_GROUP), ("nobody", E.GROUP_ID_NOT_FOUND), ("simple", E.NONE)]
            assert h.offsets.fetch("simple") == {}

            h.coordinator.leave("g", [(a.member_id, None)])
            assert h.coordinator.delete_groups(["g"]) == [("g", E.NONE)]
            assert h.offsets.fetch("g") == {}
            assert h.state("g") == "Dead"
            assert h.coordinator.list_groups(None) == []
    run(scenario)


def test_offsets_of_a_long_empty_group_expire_and_the_group_goes(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path, offsets_retention_ms=10_000) as h:
            a = await h.join_new(session_ms=60_000)
            await h.sync(a.member_id, a.generation_id)
            h.offsets.commit("g", [OffsetEntry("t", 0, 1, -1, None, h.timers.now_ms)])
            await h.timers.advance(20_000)
            h.heartbeat(a.member_id, a.generation_id)
            assert h.coordinator.expire_offsets() == 0  # the group has a member

            h.coordinator.leave("g", [(a.member_id, None)])
            await h.timers.advance(9_999)
            assert h.coordinator.expire_offsets() == 0  # empty, but not for long enough
            await h.timers.advance(1)

            assert h.coordinator.expire_offsets() == 1
            assert h.state() == "Dead"
    run(scenario)


def test_close_answers_waiting_joins_and_refuses_later_calls(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            a = await h.join_new()
            await h.sync(a.member_id, a.generation_id)
            b_join = await started(h.join_new())

            await h.coordinator.close()

            await settle()
            assert finished(b_join).error_code == E.COORDINATOR_NOT_AVAILABLE
            assert h.heartbeat(a.member_id, a.generation_id) == E.COORDINATOR_NOT_AVAILABLE
            assert (await h.join()).error_code == E.COORDINATOR_NOT_AVAILABLE
    run(scenario)

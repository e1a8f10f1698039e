"""The consumer-group coordinator's values and state: errors, bounds, results, and each group's and member's
state with the rules that only touch one group (``groups.py`` holds the coordinator that drives them)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import Protocol, TypeVar

from stratalog.invariant import invariant

_T = TypeVar("_T")

class GroupErrorCode(IntEnum):
    """The Kafka error codes the coordinator answers with."""

    NONE = 0
    COORDINATOR_NOT_AVAILABLE = 15
    NOT_COORDINATOR = 16
    ILLEGAL_GENERATION = 22
    INCONSISTENT_GROUP_PROTOCOL = 23
    INVALID_GROUP_ID = 24
    UNKNOWN_MEMBER_ID = 25
    INVALID_SESSION_TIMEOUT = 26
    REBALANCE_IN_PROGRESS = 27
    INVALID_REQUEST = 42
    NON_EMPTY_GROUP = 68
    GROUP_ID_NOT_FOUND = 69
    MEMBER_ID_REQUIRED = 79
    GROUP_MAX_SIZE_REACHED = 81
    FENCED_INSTANCE_ID = 82


E = GroupErrorCode

#: The generation of a standalone OffsetCommit (a consumer that assigns its partitions itself).
NO_GENERATION = -1
#: The member id of a member that has none yet.
UNKNOWN_MEMBER_ID = ""


@dataclass(frozen=True, slots=True)
class GroupConfig:
    #: Shortest and longest session timeout a member may ask for: Kafka's defaults of
    #: ``group.min.session.timeout.ms`` and ``group.max.session.timeout.ms``. The lower bound keeps members
    #: from being expired by one late heartbeat; the upper bound is how long a dead member can hold its
    #: partitions. Tests lower the minimum to run in milliseconds.
    group_min_session_timeout_ms: int = 6000
    group_max_session_timeout_ms: int = 1_800_000
    #: How long the first rebalance of an empty group waits for more members (each new member restarts
    #: the wait, up to the rebalance timeout): Kafka's ``group.initial.rebalance.delay.ms``. 0: none.
    group_initial_rebalance_delay_ms: int = 3000
    #: Members of one group (pending ones counted apart, against the same bound). Kafka's
    #: ``group.max.size`` is unbounded by default; a bound keeps one group's join and the leader's
    #: response (every member's metadata) within known sizes.
    group_max_size: int = 1000
    #: Groups held in memory. When full, an Empty group (its offsets stay on disk) makes room; if none is
    #: empty, joins of new groups get COORDINATOR_NOT_AVAILABLE (retried by clients).
    groups_max: int = 10_000
    #: Protocol names and metadata one member may join with, in bytes (held for the group's life, and sent
    #: to the leader with every other member's). A consumer subscribed to a thousand topics, with the
    #: partitions it owns, sends ~50 KiB.
    member_metadata_bytes_max: int = 256 << 10
    #: The assignment the leader hands one member, in bytes (held until the next rebalance).
    member_assignment_bytes_max: int = 256 << 10
    #: A new member's first join may wait this long (Kafka's ``NewMemberJoinTimeoutMs``): it has no id to
    #: heartbeat with yet, and a client that gave up and retried would otherwise leave members behind.
    group_new_member_join_timeout_ms: int = 300_000
    #: Offsets of a group empty this long (and not committed for this long) are dropped: Kafka's
    #: ``offsets.retention.minutes`` default, 7 days.
    offsets_retention_ms: int = 7 * 24 * 3600 * 1000
    #: How often expired offsets are looked for: Kafka's ``offsets.retention.check.interval.ms``.
    offsets_retention_check_interval_ms: int = 600_000


@dataclass(frozen=True, slots=True)
class JoinResult:
    """JoinGroup's answer. ``members`` (member id, group instance id, metadata of the chosen protocol)
    goes to the leader only. ``protocol_type``/``protocol_name`` are ``None`` on errors (JoinGroup below
    v7 sends ""); ``leader`` and ``member_id`` are "" when unknown."""

    error_code: int
    generation_id: int = NO_GENERATION
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    member_id: str = UNKNOWN_MEMBER_ID
    skip_assignment: bool = False
    members: list[tuple[str, str | None, bytes]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class SyncResult:
    error_code: int
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


@dataclass(frozen=True, slots=True)
class MemberDescription:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    #: The chosen protocol's metadata and the member's assignment: only for a Stable group (as Kafka).
    member_metadata: bytes
    member_assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupDescription:
    """DescribeGroups' answer for one group. A group the coordinator does not know is ``Dead`` with no
    error (DescribeGroups v6+ answers GROUP_ID_NOT_FOUND for it instead: the handler's choice)."""

    error_code: int
    group_id: str
    state: str
    protocol_type: str
    #: The chosen protocol's name, when the group is Stable; "" otherwise.
    protocol_data: str
    members: list[MemberDescription]


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class Timers(Protocol):
    """Where the coordinator's deadlines run: the event loop's timers, or a manual clock in tests."""

    def call_later_ms(self, delay_ms: int, callback: Callable[[], None]) -> TimerHandle: ...


class LoopTimers:
    """Deadlines as the event loop's ``call_later``."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def call_later_ms(self, delay_ms: int, callback: Callable[[], None]) -> TimerHandle:
        return self._loop.call_later(delay_ms / 1000, callback)


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class GroupState(Enum):
    """A group's state, by the names Kafka gives them in DescribeGroups and ListGroups."""

    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


S = GroupState

#: The states a group may come from into each state.
PREVIOUS_STATES: dict[GroupState, frozenset[GroupState]] = {
    S.PREPARING_REBALANCE: frozenset({S.STABLE, S.COMPLETING_REBALANCE, S.EMPTY}),
    S.COMPLETING_REBALANCE: frozenset({S.PREPARING_REBALANCE}),
    S.STABLE: frozenset({S.COMPLETING_REBALANCE}),
    S.EMPTY: frozenset({S.PREPARING_REBALANCE}),
    S.DEAD: frozenset({S.STABLE, S.PREPARING_REBALANCE, S.COMPLETING_REBALANCE, S.EMPTY, S.DEAD}),
}


def answer(future: asyncio.Future[_T] | None, result: _T) -> None:
    # A caller that went away (its task cancelled) cancelled its future: nobody to answer.
    if future is not None and not future.done():
        future.set_result(result)


def join_error(member_id: str, error: int) -> JoinResult:
    return JoinResult(error_code=error, member_id=member_id)


@dataclass(slots=True, eq=False)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    #: (name, metadata), in the member's order of preference.
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    #: Joined and not yet past its first completed join (expired by the new-member join timeout).
    is_new: bool = False
    join_future: asyncio.Future[JoinResult] | None = None
    sync_future: asyncio.Future[SyncResult] | None = None
    session_timer: TimerHandle | None = None

    @property
    def awaiting_join(self) -> bool:
        return self.join_future is not None

    @property
    def awaiting_sync(self) -> bool:
        return self.sync_future is not None and not self.sync_future.done()

    def metadata(self, protocol_name: str | None) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol_name:
                return metadata
        return b""

    def matches(self, protocols: list[tuple[str, bytes]]) -> bool:
        return self.protocols == protocols

    def vote(self, candidates: set[str]) -> str:
        for name, _ in self.protocols:
            if name in candidates:
                return name
        invariant(False, f"member {self.member_id} supports none of the group's protocols {candidates}")
        return ""


class Group:
    """One group's membership and state; the coordinator drives it."""

    def __init__(self, group_id: str, now_ms: int) -> None:
        self.group_id = group_id
        self.state = S.EMPTY
        self.previous_state = S.DEAD
        self.state_since_ms = now_ms
        self.generation_id = 0
        self.protocol_type: str | None = None
        self.protocol_name: str | None = None
        self.leader_id: str | None = None
        self.members: dict[str, Member] = {}
        #: group instance id -> member id of the static members.
        self.static_members: dict[str, str] = {}
        #: Member ids handed out with MEMBER_ID_REQUIRED and not yet joined, with their expiry.
        self.pending_join: dict[str, TimerHandle] = {}
        #: Members of this generation that have not sent SyncGroup yet.
        self.pending_sync: set[str] = set()
        #: How many members support each protocol name.
        self.supported: Counter[str] = Counter()
        self.new_member_added = False
        self.join_timer: TimerHandle | None = None
        #: The join timer is the initial delay (which waits even when everybody joined).
        self.join_timer_initial = False
        self.sync_timer: TimerHandle | None = None

    def transition(self, state: GroupState, now_ms: int) -> None:
        invariant(self.state in PREVIOUS_STATES[state],
                  f"group {self.group_id}: no transition from {self.state.value} to {state.value}")
        self.previous_state = self.state
        self.state = state
        self.state_since_ms = now_ms

    def supports(self, protocol_type: str, names: list[str]) -> bool:
        if self.state is S.EMPTY:
            return protocol_type != "" and bool(names)
        return (self.protocol_type == protocol_type
                and any(self.supported[name] == len(self.members) for name in names))

    def add(self, member: Member) -> None:
        if not self.members:
            self.protocol_type = member.protocol_type
        invariant(member.protocol_type == self.protocol_type, "a member of another protocol type")
        if member.group_instance_id is not None:
            invariant(member.group_instance_id not in self.static_members, "a static member added twice")
            self.static_members[member.group_instance_id] = member.member_id
        if self.leader_id is None:
            self.leader_id = member.member_id
        self.members[member.member_id] = member
        self._count(member.protocols, 1)

    def remove(self, member_id: str) -> Member | None:
        member = self.members.pop(member_id, None)
        if member is not None:
            self._count(member.protocols, -1)
            if member.group_instance_id is not None:
                self.static_members.pop(member.group_instance_id, None)
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)
        self.pending_sync.discard(member_id)
        return member

    def set_protocols(self, member: Member, protocols: list[tuple[str, bytes]]) -> None:
        self._count(member.protocols, -1)
        member.protocols = protocols
        self._count(protocols, 1)

    def _count(self, protocols: list[tuple[str, bytes]], delta: int) -> None:
        for name, _ in protocols:
            count = self.supported[name] + delta
            if count > 0:
                self.supported[name] = count
            else:
                del self.supported[name]  # names no member supports any more are not kept

    def replace_static(self, member: Member, new_member_id: str) -> None:
        """Give a static member a new id (its old id is then unknown, and fenced by its instance id)."""
        invariant(member.group_instance_id is not None, "only a static member is replaced")
        del self.members[member.member_id]
        self.pending_sync.discard(member.member_id)
        if self.leader_id == member.member_id:
            self.leader_id = new_member_id
        member.member_id = new_member_id
        self.members[new_member_id] = member
        self.static_members[member.group_instance_id or ""] = new_member_id

    def validate_member(self, member_id: str, group_instance_id: str | None) -> int:
        if group_instance_id is not None:
            existing = self.static_members.get(group_instance_id)
            if existing is None:
                return E.UNKNOWN_MEMBER_ID
            if existing != member_id:
                return E.FENCED_INSTANCE_ID
        return E.NONE if member_id in self.members else E.UNKNOWN_MEMBER_ID

    def select_protocol(self) -> str:
        invariant(bool(self.members), "no protocol to choose for an empty group")
        candidates = {name for name, count in self.supported.items() if count == len(self.members)}
        votes = Counter(member.vote(candidates) for member in self.members.values())
        # Counter keeps first-vote order: a tie goes to the protocol the earliest member voted for.
        return max(votes, key=lambda name: votes[name])

    def all_joined(self) -> bool:
        return not self.pending_join and all(m.awaiting_join for m in self.members.values())

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def leader_members(self) -> list[tuple[str, str | None, bytes]]:
        return [(m.member_id, m.group_instance_id, m.metadata(self.protocol_name)) for m in self.members.values()]

    def join_result(self, member: Member, with_members: bool, leader: str | None = None) -> JoinResult:
        return JoinResult(
            error_code=E.NONE, generation_id=self.generation_id, protocol_type=self.protocol_type,
            protocol_name=self.protocol_name, leader=(leader if leader is not None else self.leader_id) or "",
            member_id=member.member_id, members=self.leader_members() if with_members else [])

    def sync_result(self, error: int, assignment: bytes = b"") -> SyncResult:
        return SyncResult(error, self.protocol_type, self.protocol_name, assignment)


def unique_protocols(protocols: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    # Kafka keys a member's protocols by name: the first of a repeated name counts.
    seen: set[str] = set()
    unique = []
    for name, metadata in protocols:
        if name not in seen:
            seen.add(name)
            unique.append((name, bytes(metadata)))
    return unique


@dataclass(frozen=True, slots=True)
class JoinRequest:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    require_known_member_id: bool

    @property
    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]

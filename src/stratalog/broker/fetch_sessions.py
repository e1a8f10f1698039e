"""Fetch sessions (KIP-227): a consumer names its partitions once, then only what changed.

A full fetch (session epoch 0) may create a session: the broker keeps the fetch's partitions and answers
the session's id. The consumer's next fetches are incremental (that id, epoch 1, 2, ...): they carry only
the partitions added or whose fetch offset or bounds changed, and ``forgotten_topics_data`` the ones
removed; the broker reads every partition of the session and answers only those with something new: records,
a changed high watermark or log start offset, or an error. A full fetch with epoch -1 creates none (and
closes the session it names, as any full fetch does). Kafka's errors: an unknown id gets
FETCH_SESSION_ID_NOT_FOUND, a wrong epoch INVALID_FETCH_SESSION_EPOCH, a version that names topics the
other way than the session did (by id from Fetch v13, by name before) FETCH_SESSION_TOPIC_ID_ERROR.

This module is the sessions alone, sans I/O, as Kafka's FetchSession.scala has them: :meth:`FetchSessions.begin`
says what a fetch reads (a :class:`Plan`), the handler (api_fetch.py) reads it, and :meth:`FetchSessions.finish`
says what the answer carries and updates the session. The cache is Kafka's, keyed by session id, not by
connection (a consumer may come back on another one): at most ``sessions_max`` sessions; when it is full a
new session evicts the least recently used one if it went unused for ``eviction_s``, else the smallest
session (fewest partitions, then lowest id) created more than ``eviction_s`` ago if the new one has more
partitions, else the consumer goes on without a session (its fetches are all full ones, as before
sessions). Past Kafka, the partitions are bounded too: ``partitions_max`` a session and
``cache_partitions_max`` all together (each costs memory); a full fetch over them gets no session, and an
incremental one that would grow its session past them closes it (answered as a fetch without a session,
as Kafka answers one that empties its session: the consumer's next fetch is a full one).

Everything is called on the broker's event loop; the clock is the caller's (``now_s``, monotonic seconds).
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from kio.schema.errors import ErrorCode

from stratalog.invariant import invariant

#: The session id of a fetch outside any session, and of an answer that created none.
INVALID_SESSION_ID = 0
#: A full fetch that may create a session.
INITIAL_EPOCH = 0
#: A full fetch that creates none (and closes the one it names).
FINAL_EPOCH = -1
#: Session ids and epochs are int32s; an epoch past the largest goes back to 1 (Kafka's nextEpoch).
INT32_MAX = 2**31 - 1

#: A partition as a session knows it: (topic name, or topic id from Fetch v13; partition index).
Key = tuple[Hashable, int]


def next_epoch(epoch: int) -> int:
    """The epoch after ``epoch``, as Kafka counts them (FINAL_EPOCH stays final)."""
    if epoch < 0:
        return FINAL_EPOCH
    return 1 if epoch == INT32_MAX else epoch + 1


class Kind(Enum):
    """What a fetch is to the sessions."""

    SESSIONLESS = "sessionless"   # read what it names; answer everything, session id 0
    FULL = "full"                 # read what it names; answer everything; a session made if there is room
    INCREMENTAL = "incremental"   # read the session's partitions; answer those that changed
    REFUSED = "refused"           # a session error: answered with it alone


@dataclass(slots=True)
class Wanted:
    """A partition as a fetch asks for it, and as a session keeps it for the fetches that leave it out."""

    fetch_offset: int
    partition_max_bytes: int
    current_leader_epoch: int = -1


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a partition's answer says that decides whether an incremental answer carries it."""

    error_code: int
    high_watermark: int
    log_start_offset: int
    has_records: bool


@dataclass(slots=True)
class _Cached:
    """A session's partition: the fetch's parameters, and what the consumer was last told of it."""

    wanted: Wanted
    high_watermark: int = -1
    log_start_offset: int = -1


@dataclass(eq=False, slots=True)
class Session:
    session_id: int
    #: The epoch the session's next fetch must carry.
    epoch: int
    uses_topic_ids: bool
    created_s: float
    last_used_s: float
    #: In read order: partitions that returned records move to the end, so a fetch's byte budget goes
    #: round the partitions instead of always to the first ones (Kafka does the same).
    partitions: OrderedDict[Key, _Cached] = field(default_factory=OrderedDict)


@dataclass(frozen=True, slots=True)
class Plan:
    """What one fetch reads: ``partitions`` in order, each with its parameters (a session's kept ones
    for those an incremental fetch leaves out); ``error_code`` for a REFUSED fetch."""

    kind: Kind
    partitions: Sequence[tuple[Key, Wanted]] = ()
    #: Whether the fetch names topics by id (Fetch v13 on): a session made of it keeps to that.
    uses_topic_ids: bool = False
    error_code: int = 0
    session: Session | None = None
    #: The session's epoch once this fetch went through: another fetch of the session meanwhile (a
    #: duplicate) changed it, and this one is then answered INVALID_FETCH_SESSION_EPOCH.
    session_epoch: int = 0


@dataclass(frozen=True, slots=True)
class Answer:
    """What the response says: its top-level error and session id, and which of the plan's partitions it
    carries (``included[i]`` for ``plan.partitions[i]``)."""

    error_code: int
    session_id: int
    included: Sequence[bool]


class FetchSessions:
    """The session cache (see the module's doc)."""

    def __init__(self, sessions_max: int, partitions_max: int, cache_partitions_max: int, eviction_s: float,
                 new_id: Callable[[], int] | None = None) -> None:
        invariant(sessions_max >= 0 and 0 <= partitions_max <= cache_partitions_max,
                  "fetch session bounds: sessions_max >= 0, 0 <= partitions_max <= cache_partitions_max")
        self.sessions_max = sessions_max
        self.partitions_max = partitions_max
        self.cache_partitions_max = cache_partitions_max
        self.eviction_s = eviction_s
        self._new_id = new_id or _random_id
        #: By last use, least recent first.
        self._sessions: OrderedDict[int, Session] = OrderedDict()
        #: Partitions of the sessions in the cache, as of each one's last use.
        self._partitions = 0
        self._sizes: dict[int, int] = {}
        #: Counts for /metrics: fetches by kind, sessions evicted.
        self.fetches = {kind: 0 for kind in Kind}
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, session_id: int) -> Session | None:
        return self._sessions.get(session_id)

    @property
    def partitions_cached(self) -> int:
        return self._partitions

    def stats(self) -> dict[str, int]:
        """Figures for /metrics (from any thread: plain reads of ints)."""
        return {"fetch_sessions": len(self._sessions), "fetch_session_partitions": self._partitions,
                "fetch_session_evictions": self.evictions,
                **{f"fetch_requests_{kind.value}": count for kind, count in self.fetches.items()}}

    # A fetch's start --------------------------------------------------------------------------------

    def begin(self, session_id: int, epoch: int, uses_topic_ids: bool, wanted: Mapping[Key, Wanted],
              forgotten: Iterable[Key], now_s: float) -> Plan:
        """What a fetch with this session id and epoch reads. ``wanted``: the partitions it names, in its
        order; ``forgotten``: those it removes from its session."""
        plan = self._plan(session_id, epoch, uses_topic_ids, wanted, forgotten, now_s)
        self.fetches[plan.kind] += 1
        return plan

    def _plan(self, session_id: int, epoch: int, uses_topic_ids: bool, wanted: Mapping[Key, Wanted],
              forgotten: Iterable[Key], now_s: float) -> Plan:
        named = list(wanted.items())
        if epoch in (INITIAL_EPOCH, FINAL_EPOCH):
            if session_id != INVALID_SESSION_ID:
                self._remove(session_id)   # any session a full fetch names is closed
            return Plan(Kind.SESSIONLESS if epoch == FINAL_EPOCH else Kind.FULL, named, uses_topic_ids)
        session = self._sessions.get(session_id)
        error = (ErrorCode.fetch_session_id_not_found if session is None
                 else ErrorCode.invalid_fetch_session_epoch if session.epoch != epoch
                 else ErrorCode.fetch_session_topic_id_error if session.uses_topic_ids != uses_topic_ids
                 else None)
        if error is not None:
            return Plan(Kind.REFUSED, error_code=error)
        assert session is not None
        # Read once, keeping only what is in the session (or joins it): the list may be as long as the
        # request is large, and most of it may name nothing.
        removed = {key for key in forgotten if key in session.partitions or key in wanted}
        if not self._fits_after(session, wanted, removed):
            self._remove(session_id)
            return Plan(Kind.SESSIONLESS, named, uses_topic_ids)
        _update(session, wanted, removed)
        if not session.partitions:   # Kafka's rule: an emptied session is closed, the fetch answered alone
            self._remove(session_id)
            return Plan(Kind.SESSIONLESS, named, uses_topic_ids)
        session.epoch = next_epoch(session.epoch)
        self._touch(session, now_s)
        return Plan(Kind.INCREMENTAL, [(key, cached.wanted) for key, cached in session.partitions.items()],
                    uses_topic_ids, session=session, session_epoch=session.epoch)

    def _fits_after(self, session: Session, wanted: Mapping[Key, Wanted], removed: set[Key]) -> bool:
        """Whether the session stays within the partition bounds once ``wanted`` is added and ``removed``
        (keys of the session or of ``wanted``) taken out, counted without changing it."""
        partitions = session.partitions
        added = sum(1 for key in wanted if key not in partitions)
        size_after = len(partitions) + added - len(removed)
        others = self._partitions - self._sizes.get(session.session_id, 0)
        return size_after <= self.partitions_max and others + size_after <= self.cache_partitions_max

    # A fetch's end ----------------------------------------------------------------------------------

    def finish(self, plan: Plan, outcomes: Sequence[Outcome], now_s: float) -> Answer:
        """What the answer to ``plan`` carries, given each of its partitions' ``outcomes`` (in the plan's
        order); a FULL fetch's session is made here, with what this answer tells the consumer."""
        invariant(len(outcomes) == len(plan.partitions), "one outcome per partition read")
        if plan.kind is Kind.REFUSED:
            return Answer(plan.error_code, INVALID_SESSION_ID, [False] * len(outcomes))
        if plan.kind is Kind.SESSIONLESS:
            return Answer(0, INVALID_SESSION_ID, [True] * len(outcomes))
        if plan.kind is Kind.FULL:
            return Answer(0, self._create(plan, outcomes, now_s), [True] * len(outcomes))
        session = plan.session
        assert session is not None
        if session.epoch != plan.session_epoch:
            # Another fetch of the session went through meanwhile: this one was a duplicate.
            return Answer(ErrorCode.invalid_fetch_session_epoch, session.session_id, [False] * len(outcomes))
        included = [_must_answer(session, key, outcome) for (key, _), outcome in zip(plan.partitions, outcomes,
                                                                                       strict=True)]
        return Answer(0, session.session_id, included)

    def _create(self, plan: Plan, outcomes: Sequence[Outcome], now_s: float) -> int:
        size = len(plan.partitions)
        if not size or size > self.partitions_max or not self._make_room(size, now_s):
            return INVALID_SESSION_ID
        session_id = self._new_id()
        while session_id == INVALID_SESSION_ID or session_id in self._sessions:
            session_id = self._new_id()
        session = Session(session_id, next_epoch(INITIAL_EPOCH), plan.uses_topic_ids, now_s, now_s)
        for (key, wanted), outcome in zip(plan.partitions, outcomes, strict=True):
            # A partition answered with an error goes in again once the error is gone (as in _must_answer).
            high_watermark = -1 if outcome.error_code else outcome.high_watermark
            session.partitions[key] = _Cached(wanted, high_watermark, outcome.log_start_offset)
        self._sessions[session_id] = session
        self._sizes[session_id] = size
        self._partitions += size
        return session_id

    # The cache --------------------------------------------------------------------------------------

    def _make_room(self, size: int, now_s: float) -> bool:
        """Whether a new session of ``size`` partitions fits, after evicting what Kafka's rules let it."""
        while len(self._sessions) >= self.sessions_max or self._partitions + size > self.cache_partitions_max:
            victim = self._evictable(size, now_s)
            if victim is None:
                return False
            self._remove(victim)
            self.evictions += 1
        return True

    def _evictable(self, size: int, now_s: float) -> int | None:
        """The session a new one of ``size`` partitions may evict: the least recently used if unused for
        ``eviction_s``; else the smallest of those created more than ``eviction_s`` ago, if it is smaller."""
        if not self._sessions:
            return None
        least_recent = next(iter(self._sessions.values()))
        if now_s - least_recent.last_used_s > self.eviction_s:
            return least_recent.session_id
        old = [(self._sizes[s.session_id], s.session_id) for s in self._sessions.values()
               if now_s - s.created_s > self.eviction_s]
        if not old:
            return None
        smallest_size, smallest_id = min(old)
        return smallest_id if size > smallest_size else None

    def _touch(self, session: Session, now_s: float) -> None:
        session.last_used_s = now_s
        self._sessions.move_to_end(session.session_id)
        size = len(session.partitions)
        self._partitions += size - self._sizes[session.session_id]
        self._sizes[session.session_id] = size

    def _remove(self, session_id: int) -> None:
        if self._sessions.pop(session_id, None) is not None:
            self._partitions -= self._sizes.pop(session_id)


def _update(session: Session, wanted: Mapping[Key, Wanted], forgotten: set[Key]) -> None:
    """An incremental fetch's changes: partitions added or their parameters replaced, then those forgotten
    removed (Kafka's order)."""
    partitions = session.partitions
    for key, params in wanted.items():
        cached = partitions.get(key)
        if cached is None:
            partitions[key] = _Cached(params)
        else:
            cached.wanted = params
    for key in forgotten:
        partitions.pop(key, None)


def _must_answer(session: Session, key: Key, outcome: Outcome) -> bool:
    """Kafka's rule for an incremental answer: a partition goes in with records, a high watermark or log
    start offset the consumer was not told yet, or an error (and then its high watermark is forgotten, so
    it goes in again once the error is gone). One with records moves to the end of the session's order."""
    cached = session.partitions.get(key)
    if cached is None:
        return False   # forgotten by a later fetch of the session meanwhile
    answer = outcome.has_records or outcome.error_code != 0
    if cached.high_watermark != outcome.high_watermark:
        cached.high_watermark = outcome.high_watermark
        answer = True
    if cached.log_start_offset != outcome.log_start_offset:
        cached.log_start_offset = outcome.log_start_offset
        answer = True
    if outcome.error_code != 0:
        cached.high_watermark = -1
    if outcome.has_records:
        session.partitions.move_to_end(key)
    return answer


def _random_id() -> int:
    """A session id no other consumer can guess (a guessed id lets its holder close the session)."""
    return 1 + secrets.randbelow(INT32_MAX)

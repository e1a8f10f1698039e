"""Fetch sessions (KIP-227) as a pure object: Kafka's rules, named one by one, then the whole cache against
a model under hypothesis."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from kio.schema.errors import ErrorCode

from stratalog.broker.fetch_sessions import (
    INT32_MAX,
    INVALID_SESSION_ID,
    FetchSessions,
    Key,
    Kind,
    Outcome,
    Plan,
    Wanted,
    next_epoch,
)

QUIET = Outcome(0, 10, 0, has_records=False)


def sessions(sessions_max: int = 10, partitions_max: int = 100, cache_partitions_max: int = 1000,
             eviction_s: float = 120.0) -> FetchSessions:
    ids = itertools.count(1)
    return FetchSessions(sessions_max, partitions_max, cache_partitions_max, eviction_s, new_id=lambda: next(ids))


def wanted(*keys: Key, offset: int = 0) -> dict[Key, Wanted]:
    return {key: Wanted(offset, 1 << 20) for key in keys}


def keys(plan: Plan) -> list[Key]:
    return [key for key, _ in plan.partitions]


def full(cache: FetchSessions, *names: Key, now_s: float = 0.0, outcomes: Sequence[Outcome] | None = None) -> int:
    """A full fetch of ``names`` answered with ``outcomes`` (QUIET each): the session id it got."""
    plan = cache.begin(0, 0, False, wanted(*names), (), now_s)
    assert plan.kind is Kind.FULL
    answer = cache.finish(plan, outcomes or [QUIET] * len(names), now_s)
    assert answer.error_code == 0 and all(answer.included)
    return answer.session_id


def incremental(cache: FetchSessions, session_id: int, epoch: int, outcomes: Iterable[Outcome] | None = None,
                added: Iterable[Key] = (), forgotten: Iterable[Key] = (), now_s: float = 0.0) -> list[Key]:
    """An incremental fetch: the partitions its answer carries."""
    plan = cache.begin(session_id, epoch, False, wanted(*added), forgotten, now_s)
    assert plan.kind is Kind.INCREMENTAL, plan
    got = list(outcomes) if outcomes is not None else [QUIET] * len(plan.partitions)
    answer = cache.finish(plan, got, now_s)
    assert (answer.error_code, answer.session_id) == (0, session_id)
    return [key for key, carried in zip(keys(plan), answer.included, strict=True) if carried]


A0, A1, B0 = ("a", 0), ("a", 1), ("b", 0)


def test_a_full_fetch_with_epoch_zero_makes_a_session_whose_next_epoch_is_one() -> None:
    cache = sessions()
    session_id = full(cache, A0, A1)
    assert session_id != INVALID_SESSION_ID
    session = cache.get(session_id)
    assert session is not None and session.epoch == 1 and list(session.partitions) == [A0, A1]
    assert cache.partitions_cached == 2


def test_a_full_fetch_with_the_final_epoch_makes_none() -> None:
    cache = sessions()
    plan = cache.begin(0, -1, False, wanted(A0), (), 0.0)
    assert plan.kind is Kind.SESSIONLESS
    assert cache.finish(plan, [QUIET], 0.0).session_id == INVALID_SESSION_ID
    assert len(cache) == 0


def test_an_incremental_fetch_reads_every_partition_of_its_session_and_answers_what_changed() -> None:
    cache = sessions()
    session_id = full(cache, A0, A1, B0)
    quiet, moved = QUIET, Outcome(0, 11, 0, has_records=False)
    assert incremental(cache, session_id, 1, [quiet, quiet, quiet]) == []
    assert incremental(cache, session_id, 2, [quiet, moved, quiet]) == [A1], "a new high watermark"
    assert incremental(cache, session_id, 3, [quiet, moved, Outcome(0, 10, 4, False)]) == [B0], "a new log start"
    assert incremental(cache, session_id, 4, [Outcome(0, 10, 0, True), moved, Outcome(0, 10, 4, False)]) == [A0], \
        "records"


def test_records_move_a_partition_to_the_end_of_the_read_order() -> None:
    cache = sessions()
    session_id = full(cache, A0, A1, B0)
    incremental(cache, session_id, 1, [Outcome(0, 10, 0, True), QUIET, QUIET])
    plan = cache.begin(session_id, 2, False, {}, (), 0.0)
    assert keys(plan) == [A1, B0, A0]


def test_an_error_is_always_answered_and_its_end_answered_once() -> None:
    cache = sessions()
    session_id = full(cache, A0)
    failed = Outcome(ErrorCode.not_leader_or_follower, -1, -1, has_records=False)
    assert incremental(cache, session_id, 1, [failed]) == [A0]
    assert incremental(cache, session_id, 2, [failed]) == [A0], "still failing: still answered"
    assert incremental(cache, session_id, 3, [QUIET]) == [A0], "the error is gone: its offsets go again"
    assert incremental(cache, session_id, 4, [QUIET]) == []


def test_added_partitions_join_and_forgotten_ones_leave() -> None:
    cache = sessions()
    session_id = full(cache, A0, A1)
    plan = cache.begin(session_id, 1, False, wanted(B0, A0, offset=7), [A1], 0.0)
    assert keys(plan) == [A0, B0]
    assert dict(plan.partitions)[A0].fetch_offset == 7, "a partition named again takes its new parameters"
    cache.finish(plan, [QUIET, QUIET], 0.0)
    assert cache.partitions_cached == 2
    plan = cache.begin(session_id, 2, False, {}, (), 0.0)
    assert dict(plan.partitions)[A0].fetch_offset == 7, "kept for the fetches that leave it out"


def test_a_forgotten_list_is_read_once_whatever_its_length() -> None:
    """Only the forgotten keys that are in the session are kept: a list of millions costs one pass."""
    cache = sessions()
    session_id = full(cache, A0, A1)
    forgotten = itertools.chain(((f"gone-{i}", 0) for i in range(100_000)), [A1])
    plan = cache.begin(session_id, 1, False, {}, forgotten, 0.0)
    assert keys(plan) == [A0] and next(forgotten, None) is None


def test_forgetting_every_partition_closes_the_session() -> None:
    cache = sessions()
    session_id = full(cache, A0)
    plan = cache.begin(session_id, 1, False, {}, [A0, A0, B0], 0.0)
    assert plan.kind is Kind.SESSIONLESS and cache.get(session_id) is None
    assert cache.finish(plan, [], 0.0).session_id == INVALID_SESSION_ID
    assert cache.partitions_cached == 0


def test_a_wrong_epoch_an_unknown_id_and_a_change_of_topic_naming_are_refused() -> None:
    cache = sessions()
    session_id = full(cache, A0)
    for epoch in (2, 5, -7, INT32_MAX):
        plan = cache.begin(session_id, epoch, False, {}, (), 0.0)
        assert (plan.kind, plan.error_code) == (Kind.REFUSED, ErrorCode.invalid_fetch_session_epoch)
        answer = cache.finish(plan, [], 0.0)
        assert (answer.error_code, answer.session_id) == (ErrorCode.invalid_fetch_session_epoch, 0)
    plan = cache.begin(session_id + 1, 1, False, {}, (), 0.0)
    assert (plan.kind, plan.error_code) == (Kind.REFUSED, ErrorCode.fetch_session_id_not_found)
    plan = cache.begin(session_id, 1, True, {}, (), 0.0)
    assert (plan.kind, plan.error_code) == (Kind.REFUSED, ErrorCode.fetch_session_topic_id_error)
    assert incremental(cache, session_id, 1) == [], "refusals leave the session as it was: epoch 1 goes on"


def test_a_full_fetch_naming_a_session_closes_it() -> None:
    cache = sessions()
    first = full(cache, A0)
    plan = cache.begin(first, -1, False, wanted(A0), (), 0.0)
    assert plan.kind is Kind.SESSIONLESS and cache.get(first) is None
    second = full(cache, A0)
    plan = cache.begin(second, 0, False, wanted(A1), (), 0.0)
    assert plan.kind is Kind.FULL and cache.get(second) is None
    third = cache.finish(plan, [QUIET], 0.0).session_id
    assert third not in (0, second) and cache.partitions_cached == 1


def test_a_duplicate_fetch_of_the_same_epoch_is_refused_and_a_stale_answer_too() -> None:
    cache = sessions()
    session_id = full(cache, A0)
    first = cache.begin(session_id, 1, False, {}, (), 0.0)
    duplicate = cache.begin(session_id, 1, False, {}, (), 0.0)
    assert duplicate.error_code == ErrorCode.invalid_fetch_session_epoch
    after = cache.begin(session_id, 2, False, {}, (), 0.0)   # the consumer went on before the first answer
    assert cache.finish(first, [QUIET], 0.0).error_code == ErrorCode.invalid_fetch_session_epoch
    assert cache.finish(after, [QUIET], 0.0).error_code == 0


def test_epochs_wrap_to_one() -> None:
    assert next_epoch(1) == 2 and next_epoch(INT32_MAX) == 1 and next_epoch(-1) == -1


def test_a_full_cache_takes_a_new_session_only_over_a_stale_or_smaller_old_one() -> None:
    cache = sessions(sessions_max=2, eviction_s=10.0)
    small = full(cache, A0, now_s=0.0)
    large = full(cache, A0, A1, now_s=0.0)
    assert full(cache, A0, A1, B0, now_s=5.0) == INVALID_SESSION_ID, "both are younger than eviction_s"
    incremental(cache, small, 1, now_s=9.0)
    incremental(cache, large, 1, now_s=9.0)
    assert full(cache, A0, now_s=11.0) == INVALID_SESSION_ID, "old enough, but not smaller than the new one"
    bigger = full(cache, A0, A1, now_s=12.0)
    assert bigger != INVALID_SESSION_ID and cache.get(small) is None and cache.evictions == 1
    assert full(cache, B0, now_s=22.0) != INVALID_SESSION_ID, "unused for longer than eviction_s: evicted"
    assert cache.get(large) is None and cache.evictions == 2


def test_sessions_past_the_partition_bounds_are_not_made_or_are_closed() -> None:
    cache = sessions(partitions_max=2, cache_partitions_max=3)
    assert full(cache, A0, A1, B0) == INVALID_SESSION_ID, "more partitions than a session keeps"
    session_id = full(cache, A0, A1)
    assert full(cache, A0, A1) == INVALID_SESSION_ID, "the cache's partitions would go past 3"
    plan = cache.begin(session_id, 1, False, wanted(B0), (), 0.0)
    assert plan.kind is Kind.SESSIONLESS and keys(plan) == [B0], "growing past the bound closes it"
    assert cache.get(session_id) is None and cache.partitions_cached == 0


def test_a_session_of_many_may_evict_several_smaller_old_ones() -> None:
    cache = sessions(sessions_max=10, partitions_max=3, cache_partitions_max=3, eviction_s=1.0)
    ones = [full(cache, key) for key in (A0, A1, B0)]
    assert full(cache, ("c", 0), ("c", 1), now_s=0.5) == INVALID_SESSION_ID
    assert full(cache, ("c", 0), ("c", 1), now_s=2.0) != INVALID_SESSION_ID
    assert [cache.get(i) is None for i in ones] == [True, True, False]
    assert cache.partitions_cached == 3


# The whole cache against a model -----------------------------------------------------------------------

KEYS = [(topic, p) for topic in ("a", "b") for p in range(5)]
OUTCOMES = st.builds(Outcome, error_code=st.sampled_from([0, 0, 0, int(ErrorCode.offset_out_of_range)]),
                     high_watermark=st.integers(0, 3), log_start_offset=st.integers(0, 2), has_records=st.booleans())
SESSIONS_MAX, PARTITIONS_MAX, CACHE_PARTITIONS_MAX, EVICTION_S = 3, 6, 12, 10.0


class ModelSession:
    """What a consumer knows of its session: its epoch, and what it was last told of each partition, in the
    broker's read order."""

    def __init__(self, told: dict[Key, tuple[int, int]]) -> None:
        self.epoch = 1
        self.told = told


class SessionsMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.cache = sessions(SESSIONS_MAX, PARTITIONS_MAX, CACHE_PARTITIONS_MAX, EVICTION_S)
        self.model: dict[int, ModelSession] = {}
        self.now_s = 0.0
        self.evictions_seen = 0

    def _vanished(self) -> None:
        """Sessions gone from the cache that no fetch closed: only evictions take them."""
        before = self.evictions_seen
        gone = [i for i in self.model if self.cache.get(i) is None]
        for i in gone:
            del self.model[i]
        assert len(gone) == self.cache.evictions - before
        self.evictions_seen = self.cache.evictions

    @rule(names=st.lists(st.sampled_from(KEYS), unique=True, max_size=8), final=st.booleans(), data=st.data())
    def full_fetch(self, names: list[Key], final: bool, data: st.DataObject) -> None:
        room = (len(self.cache) < SESSIONS_MAX and self.cache.partitions_cached + len(names) <= CACHE_PARTITIONS_MAX)
        plan = self.cache.begin(0, -1 if final else 0, False, wanted(*names), (), self.now_s)
        assert keys(plan) == names
        outcomes = data.draw(st.lists(OUTCOMES, min_size=len(names), max_size=len(names)))
        answer = self.cache.finish(plan, outcomes, self.now_s)
        assert answer.error_code == 0 and all(answer.included)
        made = answer.session_id != INVALID_SESSION_ID
        if final or not names or len(names) > PARTITIONS_MAX:
            assert not made
        elif room:
            assert made, "a session fits: it is made"
        self._vanished()
        if made:
            self.model[answer.session_id] = ModelSession(
                {k: (-1 if o.error_code else o.high_watermark, o.log_start_offset) for k, o in zip(names, outcomes,
                                                                                                   strict=True)})

    @precondition(lambda self: self.model)
    @rule(pick=st.integers(0, SESSIONS_MAX - 1), added=st.lists(st.sampled_from(KEYS), unique=True, max_size=4),
          forgotten=st.lists(st.sampled_from(KEYS), max_size=4), data=st.data())
    def incremental_fetch(self, pick: int, added: list[Key], forgotten: list[Key], data: st.DataObject) -> None:
        session_id = sorted(self.model)[pick % len(self.model)]
        model = self.model[session_id]
        told = dict(model.told)
        for key in added:
            told.setdefault(key, (-1, -1))
        for key in forgotten:
            told.pop(key, None)
        others = sum(len(m.told) for i, m in self.model.items() if i != session_id)
        plan = self.cache.begin(session_id, model.epoch, False, wanted(*added), forgotten, self.now_s)
        if not told or len(told) > PARTITIONS_MAX or others + len(told) > CACHE_PARTITIONS_MAX:
            assert plan.kind is Kind.SESSIONLESS and keys(plan) == added
            assert self.cache.get(session_id) is None
            del self.model[session_id]
            return
        assert plan.kind is Kind.INCREMENTAL and keys(plan) == list(told)
        outcomes = data.draw(st.lists(OUTCOMES, min_size=len(told), max_size=len(told)))
        answer = self.cache.finish(plan, outcomes, self.now_s)
        expected = []
        for (key, (hw, start)), o in zip(list(told.items()), outcomes, strict=True):
            expected.append(o.has_records or o.error_code != 0 or (hw, start) != (o.high_watermark, o.log_start_offset))
            told[key] = (-1 if o.error_code else o.high_watermark, o.log_start_offset)
            if o.has_records:
                told[key] = told.pop(key)
        assert list(answer.included) == expected
        model.told = told
        model.epoch = next_epoch(model.epoch)

    @precondition(lambda self: self.model)
    @rule(pick=st.integers(0, SESSIONS_MAX - 1), off_by=st.sampled_from([-1, 1, 2, 1 << 20]))
    def wrong_epoch(self, pick: int, off_by: int) -> None:
        session_id = sorted(self.model)[pick % len(self.model)]
        plan = self.cache.begin(session_id, self.model[session_id].epoch + off_by, False, wanted(*KEYS), KEYS,
                                self.now_s)
        if self.model[session_id].epoch + off_by in (0, -1):
            return self._closed_by_full_fetch(session_id, plan)
        assert plan.error_code == ErrorCode.invalid_fetch_session_epoch
        return None

    def _closed_by_full_fetch(self, session_id: int, plan: Plan) -> None:
        assert plan.kind in (Kind.FULL, Kind.SESSIONLESS) and self.cache.get(session_id) is None
        del self.model[session_id]

    @rule(session_id=st.integers(1, 50), epoch=st.integers(1, 5))
    def unknown_session(self, session_id: int, epoch: int) -> None:
        if session_id in self.model:
            return
        assert self.cache.begin(session_id, epoch, False, {}, (), self.now_s).error_code == \
            ErrorCode.fetch_session_id_not_found

    @rule(seconds=st.sampled_from([1.0, 5.0, 11.0]))
    def time_passes(self, seconds: float) -> None:
        self.now_s += seconds

    @invariant()
    def bounded_and_agreeing(self) -> None:
        assert len(self.cache) <= SESSIONS_MAX
        assert self.cache.partitions_cached <= CACHE_PARTITIONS_MAX
        assert self.cache.partitions_cached == sum(len(m.told) for m in self.model.values())
        for session_id, model in self.model.items():
            session = self.cache.get(session_id)
            assert session is not None and session.epoch == model.epoch
            assert list(session.partitions) == list(model.told)
            assert len(session.partitions) <= PARTITIONS_MAX


SessionsMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_sessions_against_a_model = SessionsMachine.TestCase

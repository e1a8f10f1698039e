"""The plan of who holds what (cluster/assignment.py): orphans are taken over evenly, the balance is
kept within one by handoffs from live holders, handoffs under way and resources not ready are left alone,
and a balanced cluster plans nothing. A property test checks the whole promise on random states."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from stratalog.cluster.assignment import Holder, Kind, Move, MoveType, Resource, plan


def partitions(n: int, topic: str = "t") -> list[Resource]:
    return [Resource(Kind.PARTITION, f"{topic}/{p}") for p in range(n)]


def after(moves: list[Move], holders: dict[Resource, Holder]) -> dict[Resource, Holder]:
    """The holders once every move has been carried out (handoffs released)."""
    done = dict(holders)
    for move in moves:
        done[move.resource] = move.to
    return done


def counts(holders: dict[Resource, Holder], live: dict[int, int]) -> dict[int, int]:
    result = dict.fromkeys(live, 0)
    for holder in holders.values():
        if live.get(holder.broker_id) == holder.broker_epoch:
            result[holder.broker_id] += 1
    return result


def test_orphans_spread_evenly_over_the_live_brokers() -> None:
    moves = plan(partitions(7), {}, {1: 1, 2: 1, 3: 1})
    assert all(m.type is MoveType.TAKEOVER for m in moves)
    assert sorted(counts(after(moves, {}), {1: 1, 2: 1, 3: 1}).values()) == [2, 2, 3]


def test_a_dead_brokers_resources_go_to_the_least_loaded_live_ones() -> None:
    res = partitions(6)
    holders = {r: Holder(1 + i % 3, 1) for i, r in enumerate(res)}    # 2 each on brokers 1, 2, 3
    live = {1: 1, 2: 1}                                               # 3 died
    moves = plan(res, holders, live)
    assert {m.resource for m in moves} == {r for r, h in holders.items() if h.broker_id == 3}
    assert all(m.type is MoveType.TAKEOVER for m in moves)
    assert counts(after(moves, holders), live) == {1: 3, 2: 3}


def test_a_restarted_broker_is_a_new_incarnation_whose_old_holds_are_orphans() -> None:
    res = partitions(2)
    holders = {res[0]: Holder(1, 1), res[1]: Holder(2, 1)}
    moves = plan(res, holders, {1: 2, 2: 1})          # broker 1 restarted: epoch 2
    assert moves == [Move(res[0], Holder(1, 2), MoveType.TAKEOVER)]


def test_a_joining_broker_gets_its_share_by_handoffs() -> None:
    res = partitions(6)
    holders = {r: Holder(1, 1) for r in res}
    live = {1: 1, 2: 1, 3: 1}
    moves = plan(res, holders, live)
    assert all(m.type is MoveType.HANDOFF for m in moves) and len(moves) == 4
    assert counts(after(moves, holders), live) == {1: 2, 2: 2, 3: 2}


def test_a_balanced_cluster_plans_nothing() -> None:
    res = partitions(5)
    holders = {r: Holder(1 + i % 2, 1) for i, r in enumerate(res)}
    assert plan(res, holders, {1: 1, 2: 1}) == []


def test_handoffs_under_way_count_as_their_targets_and_are_not_planned_again() -> None:
    res = partitions(4)
    holders = {r: Holder(1, 1) for r in res}
    live = {1: 1, 2: 1}
    first = plan(res, holders, live)
    assert len(first) == 2
    handing = {m.resource: m.to for m in first}
    assert plan(res, holders, live, handing_to=handing) == []
    # The target died before the holder let go: the resources stay with their holder, and nothing moves.
    assert plan(res, holders, {1: 1}, handing_to=handing) == []


def test_resources_not_ready_are_neither_taken_over_nor_counted() -> None:
    res = partitions(3)
    holders = {res[0]: Holder(9, 1), res[1]: Holder(9, 1)}      # broker 9 died; its log not replayed yet
    moves = plan(res, holders, {1: 1}, not_ready={res[0], res[1]})
    assert moves == [Move(res[2], Holder(1, 1), MoveType.TAKEOVER)]


def test_kinds_are_balanced_apart() -> None:
    res = [*partitions(2), Resource(Kind.GROUP, "g1"), Resource(Kind.GROUP, "g2"), Resource(Kind.TRANSACTION, "t1"),
           Resource(Kind.TRANSACTION, "t2")]
    moves = plan(res, {}, {1: 1, 2: 1})
    held = after(moves, {})
    for kind in Kind:
        assert sorted(counts({r: h for r, h in held.items() if r.kind is kind}, {1: 1, 2: 1}).values()) == [1, 1]


def test_no_live_broker_plans_nothing() -> None:
    assert plan(partitions(3), {}, {}) == []


@given(
    resource_count=st.integers(0, 40),
    live=st.dictionaries(st.integers(0, 6), st.integers(1, 3), min_size=1, max_size=5),
    holder_seed=st.lists(st.tuples(st.integers(0, 8), st.integers(1, 3)), max_size=40),
    not_ready_mask=st.lists(st.booleans(), max_size=40),
)
def test_every_ready_resource_ends_on_a_live_broker_and_the_load_is_even(
        resource_count: int, live: dict[int, int], holder_seed: list[tuple[int, int]],
        not_ready_mask: list[bool]) -> None:
    res = partitions(resource_count)
    holders = {r: Holder(*holder_seed[i]) for i, r in enumerate(res) if i < len(holder_seed)}
    not_ready = {r for i, r in enumerate(res) if i < len(not_ready_mask) and not_ready_mask[i]
                 and live.get(holders[r].broker_id if r in holders else -1) != (holders[r].broker_epoch
                                                                              if r in holders else None)}
    moves = plan(res, holders, live, not_ready)
    assert moves == plan(res, holders, live, not_ready), "the plan is deterministic"
    assert len({m.resource for m in moves}) == len(moves), "one move per resource at most"
    done = after(moves, holders)
    for r in res:
        if r not in not_ready:
            assert live.get(done[r].broker_id) == done[r].broker_epoch, f"{r} is not served"
    load = counts(done, live)
    assert max(load.values()) - min(load.values()) <= 1
    for m in moves:
        if m.type is MoveType.HANDOFF:
            held_by = holders[m.resource]
            assert live.get(held_by.broker_id) == held_by.broker_epoch, "handoffs only from live holders"

"""Who should lead what: a pure plan from the cluster's state, no I/O (leases.py applies it).

A *resource* is something exactly one broker serves at a time: a topic partition, a consumer group's
coordination, or a transactional id's. Its *holder* is the broker (id and incarnation epoch) the database
says serves it. The plan:

1. **Takeovers**: a resource with no holder, or whose holder is not live (its lease ran out) or is live in
   another incarnation (it restarted and lost its state), goes to the live broker holding the fewest
   resources of its kind, ties to the lowest broker id; counts update as the plan goes, so a batch of
   orphans spreads evenly.
2. **Handoffs**: while the most loaded live broker holds two or more resources of a kind above the least
   loaded, one moves (the last by name of the most loaded broker, ties to the highest broker id, to the
   least loaded, ties to the lowest id). A handoff is from a live holder: it hands the resource over
   itself once it has flushed it (leases.py), so nothing it acknowledged is left behind.

Resources the caller marks as not ready (a dead broker's partitions whose write-ahead log has not been
replayed yet) are neither taken over nor counted as movable. The plan is deterministic: every broker that
computes it from the same state gets the same moves.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

#: Handoffs go on while the most loaded live broker holds more than this many resources of a kind above the
#: least loaded: one more would only move the imbalance to another broker.
IMBALANCE_MAX = 1


class Kind(StrEnum):
    PARTITION = "partition"
    GROUP = "group"
    TRANSACTION = "transaction"


@dataclass(frozen=True, slots=True, order=True)
class Resource:
    kind: Kind
    name: str


@dataclass(frozen=True, slots=True)
class Holder:
    broker_id: int
    broker_epoch: int


class MoveType(StrEnum):
    TAKEOVER = "takeover"    # from nobody, a dead broker or a former incarnation: applied at once
    HANDOFF = "handoff"      # from a live holder: it releases the resource once flushed


@dataclass(frozen=True, slots=True)
class Move:
    resource: Resource
    to: Holder
    type: MoveType


def plan(resources: Iterable[Resource], holders: Mapping[Resource, Holder], live: Mapping[int, int],
         not_ready: Collection[Resource] = (), handing_to: Mapping[Resource, Holder] | None = None) -> list[Move]:
    """The moves that make ``resources`` served and balanced. ``holders``: the current holder of each
    resource that has one; ``live``: live broker id -> its current incarnation epoch; ``handing_to``:
    handoffs under way (a resource whose live target is set counts as the target's, and is left alone;
    one whose target is gone is its holder's again)."""
    if not live:
        return []
    moves: list[Move] = []
    by_kind: dict[Kind, list[Resource]] = {}
    for resource in sorted(set(resources)):
        by_kind.setdefault(resource.kind, []).append(resource)
    for kind_resources in by_kind.values():
        moves += _plan_kind(kind_resources, holders, live, set(not_ready), handing_to or {})
    return moves


def _is_live(holder: Holder | None, live: Mapping[int, int]) -> bool:
    return holder is not None and live.get(holder.broker_id) == holder.broker_epoch


def _plan_kind(resources: list[Resource], holders: Mapping[Resource, Holder], live: Mapping[int, int],
               not_ready: set[Resource], handing_to: Mapping[Resource, Holder]) -> list[Move]:
    counted: dict[int, list[Resource]] = {broker_id: [] for broker_id in live}
    movable: dict[int, list[Resource]] = {broker_id: [] for broker_id in live}
    orphans: list[Resource] = []
    for resource in resources:
        holder, target = holders.get(resource), handing_to.get(resource)
        if _is_live(holder, live) and _is_live(target, live):
            assert target is not None
            counted[target.broker_id].append(resource)          # on its way: leave it alone
        elif _is_live(holder, live):
            assert holder is not None
            counted[holder.broker_id].append(resource)
            movable[holder.broker_id].append(resource)
        elif resource not in not_ready:
            orphans.append(resource)
    moves = []
    for resource in orphans:
        target_id = min(counted, key=lambda b: (len(counted[b]), b))
        counted[target_id].append(resource)
        moves.append(Move(resource, Holder(target_id, live[target_id]), MoveType.TAKEOVER))
    while True:
        most = max(counted, key=lambda b: (len(counted[b]), b))
        least = min(counted, key=lambda b: (len(counted[b]), b))
        if len(counted[most]) - len(counted[least]) <= IMBALANCE_MAX or not movable[most]:
            return moves
        resource = max(movable[most])
        movable[most].remove(resource)
        counted[most].remove(resource)
        counted[least].append(resource)
        moves.append(Move(resource, Holder(least, live[least]), MoveType.HANDOFF))

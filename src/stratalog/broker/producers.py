"""Idempotent producers: each batch of a (producer id, epoch) written once per partition, in order.

A producer numbers its batches per partition (baseSequence, wrapping at 2^31). For each producer and
partition the broker keeps the sequences and base offsets of its last ``BATCHES_KEPT`` batches (as
Kafka does: a producer has at most 5 requests in flight), so a retried batch gets the offset it got
the first time instead of being written again, and a batch after a gap is refused. The decision,
given what is known:

| known state                        | batch                               | answer                         |
|------------------------------------|-------------------------------------|--------------------------------|
| none                               | sequence 0                          | append                         |
| none                               | other sequence                      | OUT_OF_ORDER_SEQUENCE_NUMBER   |
| epoch e                            | epoch < e                           | INVALID_PRODUCER_EPOCH         |
| epoch e                            | epoch > e, sequence 0               | append (a new epoch starts)    |
| epoch e                            | epoch > e, other sequence           | OUT_OF_ORDER_SEQUENCE_NUMBER   |
| epoch e, last batches kept         | same first and last sequence as one | duplicate: that batch's offset |
| epoch e, last sequence s           | first sequence s + 1                | append                         |
| epoch e                            | anything else                       | OUT_OF_ORDER_SEQUENCE_NUMBER   |

State is rebuilt at start from the batches themselves (their headers carry producer id, epoch and
sequences), reading each partition from a recent snapshot's offset on: see ``Broker``.
"""

from __future__ import annotations

import enum
from collections import OrderedDict, deque
from dataclasses import dataclass, field

#: Batches remembered per producer and partition: Kafka's bound on a producer's in-flight requests
#: with idempotence (max.in.flight.requests.per.connection <= 5).
BATCHES_KEPT = 5
SEQUENCE_MODULUS = 1 << 31


class Verdict(enum.Enum):
    APPEND = "append"
    DUPLICATE = "duplicate"
    OUT_OF_ORDER = "out of order sequence"
    FENCED = "invalid producer epoch"


@dataclass(slots=True)
class _PartitionState:
    epoch: int
    #: (first sequence, last sequence, base offset) of the last batches, oldest first. A base offset of
    #: -1 marks a batch whose append is still in flight.
    batches: deque[tuple[int, int, int]] = field(default_factory=lambda: deque(maxlen=BATCHES_KEPT))


def last_sequence(base_sequence: int, count: int) -> int:
    return (base_sequence + count - 1) % SEQUENCE_MODULUS


class ProducerStates:
    """Sequence state of idempotent producers, per (producer id, partition key). Bounded: beyond
    ``entries_max`` the least recently used entry is forgotten (its producer then gets
    OUT_OF_ORDER_SEQUENCE_NUMBER for anything but sequence 0, as after a long silence in Kafka)."""

    def __init__(self, entries_max: int) -> None:
        self._entries_max = entries_max
        self._states: OrderedDict[tuple[int, object], _PartitionState] = OrderedDict()

    def __len__(self) -> int:
        return len(self._states)

    def check(self, producer_id: int, epoch: int, partition: object, base_sequence: int,
              count: int) -> tuple[Verdict, int]:
        """What to do with a batch; for DUPLICATE also the offset the batch got first (-1: still in flight)."""
        state = self._states.get((producer_id, partition))
        if state is None:
            return (Verdict.APPEND, -1) if base_sequence == 0 else (Verdict.OUT_OF_ORDER, -1)
        if epoch < state.epoch:
            return Verdict.FENCED, -1
        if epoch > state.epoch:
            return (Verdict.APPEND, -1) if base_sequence == 0 else (Verdict.OUT_OF_ORDER, -1)
        last = last_sequence(base_sequence, count)
        for first_seq, last_seq, offset in state.batches:
            if (first_seq, last_seq) == (base_sequence, last):
                return Verdict.DUPLICATE, offset
        if not state.batches or base_sequence == (state.batches[-1][1] + 1) % SEQUENCE_MODULUS:
            return Verdict.APPEND, -1
        return Verdict.OUT_OF_ORDER, -1

    def record(self, producer_id: int, epoch: int, partition: object, base_sequence: int, count: int,
               base_offset: int) -> None:
        """A batch was appended (``base_offset`` -1 while its offset is not known yet)."""
        key = (producer_id, partition)
        state = self._states.get(key)
        if state is None or epoch != state.epoch:
            state = _PartitionState(epoch)
            self._states[key] = state
        state.batches.append((base_sequence, last_sequence(base_sequence, count), base_offset))
        self._states.move_to_end(key)
        while len(self._states) > self._entries_max:
            self._states.popitem(last=False)

    def marked(self, producer_id: int, epoch: int, partition: object) -> None:
        """A transaction marker of ``producer_id`` at ``epoch`` was written into the partition: batches of
        older epochs are fenced from now on (a coordinator that aborts a lapsed transaction bumps the epoch
        and ends it with the new one, so the lapsed producer's late batches cannot open another)."""
        key = (producer_id, partition)
        state = self._states.get(key)
        if state is None or epoch > state.epoch:
            self._states[key] = _PartitionState(epoch)
            self._states.move_to_end(key)
            while len(self._states) > self._entries_max:
                self._states.popitem(last=False)

    def settle(self, producer_id: int, partition: object, base_sequence: int, base_offset: int) -> None:
        """The batch recorded in flight at ``base_sequence`` got ``base_offset``."""
        state = self._states.get((producer_id, partition))
        if state is None:
            return
        for i, (first_seq, last_seq, offset) in enumerate(state.batches):
            if first_seq == base_sequence and offset == -1:
                state.batches[i] = (first_seq, last_seq, base_offset)
                return

    def forget(self, producer_id: int, partition: object, base_sequence: int) -> None:
        """Drop a batch that failed, and the batches recorded in flight after it (they cannot land before
        it): the producer retries them, and must be told neither that they are duplicates nor that they
        are out of order. The batches written before it stay, so the retry continues the sequence."""
        state = self._states.get((producer_id, partition))
        if state is None:
            return
        for i, (first_seq, _, offset) in enumerate(state.batches):
            if first_seq == base_sequence and offset == -1:
                for _ in range(len(state.batches) - i):
                    state.batches.pop()
                return

    def entries(self) -> list[tuple[int, object, int, list[tuple[int, int, int]]]]:
        """(producer id, partition, epoch, settled batches) of every producer: what a snapshot keeps."""
        return [(pid, partition, state.epoch, [b for b in state.batches if b[2] >= 0])
                for (pid, partition), state in self._states.items()]

    def restore(self, producer_id: int, partition: object, epoch: int, batches: list[tuple[int, int, int]]) -> None:
        state = _PartitionState(epoch)
        state.batches.extend(batches)
        self._states[(producer_id, partition)] = state
        self._states.move_to_end((producer_id, partition))

    def forget_partition(self, partition: object) -> None:
        for key in [k for k in self._states if k[1] == partition]:
            del self._states[key]

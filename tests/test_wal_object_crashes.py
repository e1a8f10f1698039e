"""Crashes at random moments of a faulty store's life, several in a row: no acknowledged record is ever
lost, no record comes back wrong (nor one from before a crash whose offset a later writer reused), and
recovery never mistakes a crash for lost data."""

from __future__ import annotations

import random

import pytest

from enginekit import MemoryStore
from owalkit import OWNER, PREFIX, small_config
from stratalog.errors import WALFailedError
from stratalog.objects.faulty import FaultyStore, ObjectFaultPlan
from stratalog.wal.object_format import decode_trim_marker
from stratalog.wal.object_wal import ObjectWAL

#: Seeds run: each a different mix of config, record sizes, faults and crash moments.
SEEDS = 40
#: Crashes per seed: a writer after a recovery reuses the offsets of what recovery removed.
CRASHES = 3
APPENDS_MAX = 200


def _faulty(inner: MemoryStore, seed: int) -> FaultyStore:
    plan = ObjectFaultPlan(fail_before_probability=0.02, fail_after_probability=0.02,
                           interrupt_put_probability=0.01, delay_probability=0.2, delay_s=0.002,
                           random_kinds=frozenset({"put", "delete"}))
    return FaultyStore(inner, seed=seed, plan=plan)


@pytest.mark.parametrize("seed", range(SEEDS))
def test_crashes_at_any_moment_keep_every_acknowledged_record(seed: int) -> None:
    rng = random.Random(seed)
    image: dict[str, bytes] = {}
    bodies: dict[int, bytes] = {}  # the last body appended at each offset
    durable = 0
    for crash in range(CRASHES + 1):
        inner = MemoryStore()
        inner.objects.update(image)
        config = small_config(puts_in_flight_max=rng.randint(1, 6), object_bytes_soft_max=rng.choice([1, 300, 4096]),
                              linger_s=rng.choice([0.0, 0.001]), put_attempts_max=rng.randint(1, 3),
                              read_attempts_max=5)  # recovery itself must not fail here
        wal = ObjectWAL.open(_faulty(inner, seed * CRASHES + crash), OWNER, config)
        records = list(wal.recover())

        trim = decode_trim_marker(image[PREFIX + "trim"]) if PREFIX + "trim" in image else -1
        offsets = [r.offset for r in records]
        assert offsets == list(range(trim + 1, trim + 1 + len(offsets)))  # in order, from the trim, no holes
        assert trim + len(offsets) >= durable - 1  # nothing acknowledged is missing
        assert all(r.data == bodies[r.offset] for r in records)  # nothing wrong, nothing stale
        if crash == CRASHES:
            wal.close()
            return

        for _ in range(rng.randint(0, APPENDS_MAX)):
            body = rng.randbytes(rng.randint(0, 400))
            try:
                bodies[wal.append(body).offset] = body
                if rng.random() < 0.05 and wal.durable_offset - 1 > wal.trim_offset:
                    wal.trim(rng.randint(wal.trim_offset + 1, wal.durable_offset - 1))
            except WALFailedError:
                break
        durable = wal.durable_offset  # read first: every record acknowledged by now has landed by the copy
        with inner._lock:
            image = dict(inner.objects)  # the crash: what the store holds at this moment
        wal.close()  # lets the crashed writer's threads end; what they do now reaches the old store only

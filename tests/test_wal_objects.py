"""The object WAL's behaviour: append, ordered acknowledgement, fail-stop, trim, limits, reopen."""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future

import pytest

from enginekit import MemoryStore
from owalkit import OWNER, PREFIX, GatedStore, key, new_wal, reopen, small_config
from stratalog.errors import (
    OverCapacityError,
    RecordTooLargeError,
    WALClosedError,
    WALFailedError,
    WALStateError,
)
from stratalog.objects.faulty import Fault, FaultyStore, ObjectFaultPlan
from stratalog.wal.config import ObjectWALConfig
from stratalog.wal.object_format import decode_object, decode_trim_marker
from stratalog.wal.object_wal import ObjectWAL
from waiting import WAIT_S, wait_until


def test_records_come_back_after_close_and_reopen() -> None:
    store = MemoryStore()
    wal = new_wal(store, object_bytes_soft_max=4096)
    bodies = [os.urandom(n) for n in (0, 1, 100, 4000, 64 << 10)]
    results = [wal.append(b) for b in bodies]
    results.append(wal.append([b"par", bytearray(b"ts"), memoryview(b" joined")]))
    assert [r.offset for r in results] == list(range(6))
    assert results[-1].future.result(WAIT_S) == 6
    wal.close()
    records, again, _ = reopen(store.objects)
    assert [(r.offset, r.data) for r in records] == [*enumerate(bodies), (5, b"parts joined")]
    assert again.durable_offset == 6 and again.append(b"next").offset == 6
    again.close()


def test_a_new_prefix_needs_no_recovery_and_an_old_one_does() -> None:
    store = MemoryStore()
    wal = ObjectWAL.open(store, OWNER, small_config())
    wal.append(b"first").future.result(WAIT_S)  # a new log takes appends at once
    wal.close()
    old = ObjectWAL.open(store, OWNER, small_config())
    with pytest.raises(WALStateError, match="recover"):
        old.append(b"too early")
    assert [r.data for r in old.recover()] == [b"first"]
    with pytest.raises(WALStateError, match="runs once"):
        old.recover()
    old.close()


def test_records_within_the_linger_share_one_object() -> None:
    store = MemoryStore()
    wal = new_wal(store, linger_s=1.0, object_bytes_soft_max=1 << 20)
    results = [wal.append(b"r%d" % i) for i in range(5)]
    assert len({id(r.future) for r in results}) == 1  # one batch, one future
    wal.close()  # seals the open batch without waiting out the linger
    assert list(store.objects) == [key(0)]
    _, bodies = decode_object(0, store.objects[key(0)])
    assert bodies == [b"r0", b"r1", b"r2", b"r3", b"r4"]


def test_the_linger_alone_seals_a_batch() -> None:
    store = MemoryStore()
    wal = new_wal(store, linger_s=0.01, object_bytes_soft_max=1 << 20)
    assert wal.append(b"alone").future.result(WAIT_S) == 1
    assert list(store.objects) == [key(0)]
    wal.close()


def test_an_object_is_sealed_before_it_grows_past_its_size_bound() -> None:
    store = MemoryStore()
    # 34 bytes a record (24 of header): two fit under 100, a third would not.
    wal = new_wal(store, linger_s=1.0, object_bytes_soft_max=100)
    for _ in range(6):
        wal.append(b"0123456789")
    wal.close()
    assert sorted(store.objects) == [key(0), key(2), key(4)]


def test_futures_complete_in_offset_order_when_puts_finish_out_of_order() -> None:
    store = GatedStore(MemoryStore(), gated={key(0), key(1), key(2)})
    wal = new_wal(store, puts_in_flight_max=4)
    completed: list[int] = []
    results = [wal.append(b"rec%d" % i) for i in range(3)]
    for r in results:
        r.future.add_done_callback(lambda f, o=r.offset: completed.append(o))
    for i in range(3):
        store.wait_arrived(key(i))  # all three puts under way at once
    store.open_gate(key(2))
    store.wait_landed(key(2))
    store.open_gate(key(1))
    store.wait_landed(key(1))
    assert completed == [] and wal.durable_offset == 0  # objects 1 and 2 are put, 0 is not
    store.open_gate(key(0))
    assert results[2].future.result(WAIT_S) == 3
    assert completed == [0, 1, 2] and wal.durable_offset == 3
    wal.close()


def test_concurrent_appenders_are_acknowledged_in_offset_order() -> None:
    store = MemoryStore()
    wal = new_wal(store, puts_in_flight_max=8, object_bytes_soft_max=200)
    completed: list[int] = []
    lock = threading.Lock()

    def on_done(future: Future[int]) -> None:
        with lock:
            completed.append(future.result())

    def appender(t: int) -> None:
        for i in range(200):
            wal.append(b"%d-%d" % (t, i)).future.add_done_callback(on_done)

    threads = [threading.Thread(target=appender, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wal.close()
    ends = sorted(set(completed))
    assert completed == sorted(completed) and ends[-1] == 800
    records, again, _ = reopen(store.objects)
    assert [r.offset for r in records] == list(range(800))
    assert sorted(r.data for r in records) == sorted(b"%d-%d" % (t, i) for t in range(4) for i in range(200))
    again.close()


def test_records_gather_in_one_batch_while_every_put_slot_is_busy() -> None:
    store = GatedStore(MemoryStore(), gated={key(0)})
    wal = new_wal(store, puts_in_flight_max=1, object_bytes_soft_max=1 << 20, linger_s=0.0)
    wal.append(b"first")
    store.wait_arrived(key(0))
    later = [wal.append(b"later%d" % i) for i in range(20)]
    store.open_gate(key(0))
    assert later[-1].future.result(WAIT_S) == 21
    wal.close()
    assert sorted(store.inner.objects) == [key(0), key(1)]  # 20 records, one put


def test_a_put_that_fails_is_retried_then_acknowledged() -> None:
    faulty = FaultyStore(MemoryStore(), plan=ObjectFaultPlan(fail_before={"put": {1, 2}}))
    wal = new_wal(faulty, put_attempts_max=3)
    assert wal.append(b"kept").future.result(WAIT_S) == 1
    assert faulty.calls["put"] == 3 and wal.failure is None
    wal.close()


def test_a_put_failing_every_attempt_stops_the_log_and_nothing_later_is_acknowledged() -> None:
    # Object 1's put fails all three attempts while object 2's lands: 2 must never be acknowledged.
    inner = MemoryStore()
    gated = GatedStore(inner, gated={key(1)})
    faulty = FaultyStore(gated, plan=ObjectFaultPlan(fail_after={"put": {2, 4, 5}}))
    wal = new_wal(faulty, put_attempts_max=3)
    first = wal.append(b"zero")
    assert first.future.result(WAIT_S) == 1
    second, third = wal.append(b"one"), wal.append(b"two")
    gated.wait_landed(key(2))
    gated.open_gate(key(1))
    with pytest.raises(WALFailedError, match="putting WAL object"):
        second.future.result(WAIT_S)
    with pytest.raises(WALFailedError):
        third.future.result(WAIT_S)
    assert wal.durable_offset == 1 and isinstance(wal.failure, WALFailedError)
    with pytest.raises(WALFailedError):
        wal.append(b"after")
    with pytest.raises(WALFailedError):
        wal.trim(0)
    wal.close()
    assert wal.durable_offset == 1


def test_an_interrupted_put_stops_the_log_and_reopening_keeps_what_was_acknowledged() -> None:
    inner = MemoryStore()
    faulty = FaultyStore(inner, plan=ObjectFaultPlan(interrupt_puts={2}))
    wal = new_wal(faulty, put_attempts_max=1)
    assert wal.append(b"acked").future.result(WAIT_S) == 1
    cut = wal.append(b"cut off")
    with pytest.raises(WALFailedError, match="interrupted"):
        cut.future.result(WAIT_S)
    assert faulty.faults[Fault.INTERRUPT_PUT] == 1
    wal.close()
    records, again, _ = reopen(inner.objects)
    assert [r.data for r in records] == [b"acked"]
    assert again.append(b"next").offset == 1
    again.close()


def test_trim_deletes_whole_objects_at_or_below_it_and_records_after_it_survive() -> None:
    store = MemoryStore()
    wal = new_wal(store, object_bytes_soft_max=100, linger_s=1.0)
    results = [wal.append(b"0123456789") for _ in range(6)]  # objects [0,1], [2,3], [4,5]
    wal.close()
    records, wal, store = reopen(store.objects)
    assert results[-1].offset == 5 and len(records) == 6
    wal.trim(2)  # inside the second object: only the first goes
    assert wal.trim_offset == 2
    assert decode_trim_marker(store.objects[PREFIX + "trim"]) == 2  # durable when trim returns
    wait_until(lambda: key(0) not in store.objects, "the trimmed object's delete")
    assert sorted(store.objects) == [key(2), key(4), PREFIX + "trim"]
    wal.trim(1)  # backwards: nothing happens
    assert wal.trim_offset == 2
    with pytest.raises(ValueError, match="only durable records"):
        wal.trim(6)
    wal.close()
    records, again, _ = reopen(store.objects)
    assert [r.offset for r in records] == [3, 4, 5]
    assert again.recovery_stats.trimmed_records == 1 and again.trim_offset == 2
    again.close()


def test_trim_that_cannot_put_its_marker_stops_the_log() -> None:
    faulty = FaultyStore(MemoryStore(), plan=ObjectFaultPlan(fail_before={"put": {2, 3}}))
    wal = new_wal(faulty, put_attempts_max=2)
    wal.append(b"x").future.result(WAIT_S)
    with pytest.raises(WALFailedError, match="trim marker"):
        wal.trim(0)
    assert wal.trim_offset == -1
    with pytest.raises(WALFailedError):
        wal.append(b"y")
    wal.close()


def test_a_failed_delete_after_trim_is_left_for_recovery() -> None:
    faulty = FaultyStore(MemoryStore(), plan=ObjectFaultPlan(fail_before={"delete": {1, 2}}))
    wal = new_wal(faulty, read_attempts_max=2)
    for i in range(3):
        last = wal.append(b"%d" % i)
    last.future.result(WAIT_S)
    wal.trim(1)
    wal.close()  # waits for the deletes: object 0's failed twice, object 1's went
    assert wal.failure is None
    assert sorted(faulty.inner.objects) == [key(0), key(2), PREFIX + "trim"]
    records, again, store = reopen(faulty.inner.objects)
    assert [r.offset for r in records] == [2]
    assert again.recovery_stats.trimmed_objects == 1 and key(0) not in store.objects
    again.close()


def test_append_waits_for_room_then_says_the_store_is_too_slow() -> None:
    store = GatedStore(MemoryStore(), gated={key(0)})
    wal = new_wal(store, buffered_bytes_max=64 << 10, record_bytes_max=40 << 10, append_wait_s_max=0.0)
    wal.append(bytes(40 << 10))
    with pytest.raises(OverCapacityError, match="too slow"):
        wal.append(bytes(40 << 10))
    store.open_gate(key(0))
    wal.close()


def test_a_record_above_the_limit_is_refused() -> None:
    wal = new_wal(MemoryStore(), record_bytes_max=1000)
    with pytest.raises(RecordTooLargeError, match="record_bytes_max=1000"):
        wal.append(bytes(1001))
    wal.close()


def test_a_closed_log_refuses_appends_and_close_is_idempotent() -> None:
    wal = new_wal(MemoryStore())
    wal.close()
    wal.close()
    with pytest.raises(WALClosedError):
        wal.append(b"late")


def test_the_context_manager_closes_and_acknowledges() -> None:
    store = MemoryStore()
    with new_wal(store, linger_s=1.0, object_bytes_soft_max=1 << 20) as wal:
        result = wal.append(b"in")
    assert result.future.result(0) == 1


@pytest.mark.parametrize("bad", [
    {"linger_s": -1.0}, {"puts_in_flight_max": 0}, {"put_attempts_max": 0}, {"record_bytes_max": 0},
    {"buffered_bytes_max": 10}, {"recovery_gets_in_flight_max": 0},
])
def test_config_bounds_that_make_no_sense_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ObjectWALConfig(**bad).validate()  # type: ignore[arg-type]


def test_a_log_closed_while_recovering_changes_nothing_and_takes_no_appends() -> None:
    store = MemoryStore()
    wal = new_wal(store)
    for body in (b"a", b"b"):
        wal.append(body).future.result(WAIT_S)
    wal.close()
    store.objects[key(5)] = store.objects[key(1)]  # a stale object recovery would delete (past a gap)
    image = dict(store.objects)
    reopened = ObjectWAL.open(store, OWNER, small_config())
    records = reopened.recover()
    assert next(records).data == b"a"
    reopened.close()
    assert [r.data for r in records] == [b"b"]
    assert store.objects == image
    with pytest.raises(WALClosedError):
        reopened.append(b"c")

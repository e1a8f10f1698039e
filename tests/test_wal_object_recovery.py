"""Object WAL recovery: one test per row of the decision table (docs/formats/object-wal.md), crashes at
each step of a put, and a second process replaying a dead owner's prefix."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from enginekit import MemoryStore
from owalkit import OWNER, PREFIX, GatedStore, key, new_wal, reopen, small_config
from stratalog.errors import RecoveryReadError
from stratalog.objects.faulty import FaultyStore, ObjectFaultPlan
from stratalog.objects.local import LocalDirStore
from stratalog.objects.store import ObjectInfo
from stratalog.wal.format import crc32c
from stratalog.wal.object_format import DAMAGED_DIR, encode_object, encode_trim_marker
from stratalog.wal.object_recovery import LostRecordsError, ObjectRecoveryStats
from stratalog.wal.object_wal import ObjectWAL, read_records
from waiting import WAIT_S

TRIM = PREFIX + "trim"


def image_of(*objects: tuple[int, list[bytes]], trim: int | None = None, window: int = 4) -> dict[str, bytes]:
    """A store's objects as a writer with ``window`` puts in flight leaves them."""
    image = {key(first): encode_object(first, bodies, window) for first, bodies in objects}
    if trim is not None:
        image[TRIM] = encode_trim_marker(trim)
    return image


def data_of(records: list) -> list[tuple[int, bytes]]:
    return [(r.offset, r.data) for r in records]


def refused(image: dict[str, bytes], error: type[Exception], match: str) -> None:
    """Recovery of ``image`` raises ``error`` and leaves every object as it was."""
    store = MemoryStore()
    store.objects.update(image)
    wal = ObjectWAL.open(store, OWNER, small_config())
    with pytest.raises(error, match=match):
        list(wal.recover())
    assert store.objects == image
    wal.close()


# The decision table, row by row -------------------------------------------------------------------------


def test_row1_objects_wholly_below_the_trim_are_deleted_unread() -> None:
    # A trim's deletes cut off by a crash: the marker says 3, objects [0, 1] and [2, 3] are still there.
    records, wal, store = reopen(image_of((0, [b"a", b"b"]), (2, [b"c", b"d"]), (4, [b"e"]), trim=3))
    assert data_of(records) == [(4, b"e")]
    assert wal.recovery_stats.trimmed_objects == 2 and wal.recovery_stats.objects_read == 1
    assert sorted(store.objects) == [key(4), TRIM]
    wal.close()


def test_row2_objects_in_sequence_are_returned_in_offset_order() -> None:
    records, wal, _ = reopen(image_of((0, [b"a", b"b"]), (2, [b"c"]), (3, [b"d", b"e", b"f"])))
    assert data_of(records) == [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"d"), (4, b"e"), (5, b"f")]
    assert wal.durable_offset == 6 and wal.append(b"g").offset == 6
    wal.close()


def test_row3_an_object_straddling_the_trim_returns_only_what_follows_it() -> None:
    records, wal, store = reopen(image_of((0, [b"a", b"b", b"c"]), (3, [b"d"]), trim=1))
    assert data_of(records) == [(2, b"c"), (3, b"d")]
    assert wal.recovery_stats.trimmed_records == 2 and key(0) in store.objects
    wal.close()


def test_row4_a_last_object_at_or_below_the_trim_is_deleted_and_the_writer_continues_after_it() -> None:
    records, wal, store = reopen(image_of((0, [b"a", b"b"]), trim=1))
    assert records == [] and wal.recovery_stats.trimmed_objects == 1
    assert sorted(store.objects) == [TRIM]
    assert wal.append(b"c").offset == 2
    wal.close()


def test_row5_an_object_inside_the_previous_one_stops_recovery() -> None:
    refused(image_of((0, [b"a", b"b", b"c"]), (2, [b"x"])), LostRecordsError, "two writers")


def test_row6_objects_past_a_put_that_never_landed_are_unacknowledged_and_deleted() -> None:
    # The crash itself: object 1's put is under way and never lands; objects 2 and 3 landed after it.
    gated = GatedStore(MemoryStore(), gated={key(1)})
    wal = new_wal(gated, puts_in_flight_max=4)
    acked = wal.append(b"zero")
    assert acked.future.result(WAIT_S) == 1
    lost = [wal.append(b"one"), wal.append(b"two"), wal.append(b"three")]
    gated.wait_landed(key(2))
    gated.wait_landed(key(3))
    image = dict(gated.inner.objects)  # the crash: what the store holds now
    assert not any(r.future.done() for r in lost)
    gated.open_gate(key(1))
    wal.close()

    records, again, store = reopen(image)
    assert data_of(records) == [(0, b"zero")]
    assert again.recovery_stats.unacknowledged_objects == 2
    assert sorted(store.objects) == [key(0)]  # deleted before any new put could overlap them
    assert again.append(b"new one").future.result(WAIT_S) == 2
    again.close()
    records, third, _ = reopen(store.objects)
    assert data_of(records) == [(0, b"zero"), (1, b"new one")]
    third.close()


def test_row6_a_gap_at_the_start_within_the_window_is_a_crash_too() -> None:
    records, wal, store = reopen(image_of((1, [b"b"]), (2, [b"c"]), window=4))
    assert records == [] and wal.recovery_stats.unacknowledged_objects == 2 and store.objects == {}
    assert wal.append(b"a").offset == 0
    wal.close()


def test_row7_more_objects_past_a_gap_than_puts_in_flight_means_acknowledged_records_are_missing() -> None:
    # A writer with 3 puts in flight leaves at most 2 objects past one that never landed; here are 3.
    image = image_of((0, [b"a"]), (2, [b"c"]), (3, [b"d"]), (4, [b"e"]), window=3)
    refused(image, LostRecordsError, "no WAL object holds offset 1, but 3 object")
    # The same objects written with 4 in flight are the tail of a crash.
    records, wal, _ = reopen(image_of((0, [b"a"]), (2, [b"c"]), (3, [b"d"]), (4, [b"e"]), window=4))
    assert data_of(records) == [(0, b"a")] and wal.recovery_stats.unacknowledged_objects == 3
    wal.close()


def test_row7_a_lost_trim_marker_shows_as_missing_records() -> None:
    image = image_of(*[(n, [b"%d" % n]) for n in range(10, 20)], window=4)  # offsets 0..9 were trimmed
    refused(image, LostRecordsError, "no WAL object holds offset 0")


def test_row8_a_half_written_last_object_is_moved_aside_and_the_writer_reuses_its_offsets() -> None:
    store = MemoryStore()
    wal = new_wal(store)
    for body in (b"zero", b"one", b"two"):
        wal.append(body).future.result(WAIT_S)
    wal.close()
    image = dict(store.objects)
    image[key(2)] = image[key(2)][:40]  # a store without atomic puts, cut off part way
    records, again, after = reopen(image)
    assert data_of(records) == [(0, b"zero"), (1, b"one")]
    stats = again.recovery_stats
    assert (stats.damaged_objects, stats.bad_body_records) == (1, 1)
    aside = [k for k in after.objects if k.startswith(f"{PREFIX}{DAMAGED_DIR}/{key(2)[len(PREFIX):]}-")]
    assert len(aside) == 1 and after.objects[aside[0]] == image[key(2)]
    assert key(2) not in after.objects
    assert again.append(b"two again").future.result(WAIT_S) == 3
    again.close()
    records, third, _ = reopen(after.objects)
    assert data_of(records) == [(0, b"zero"), (1, b"one"), (2, b"two again")]
    third.close()


def test_row8_a_corrupt_last_object_counts_the_records_its_header_names() -> None:
    image = image_of((0, [b"a"]), (1, [b"b", b"c", b"d"]))
    damaged = bytearray(image[key(1)])
    damaged[60] ^= 0x40  # a body byte: the header is intact
    image[key(1)] = bytes(damaged)
    records, wal, _ = reopen(image)
    assert data_of(records) == [(0, b"a")] and wal.recovery_stats.bad_body_records == 3
    assert wal.append(b"b'").offset == 1
    wal.close()


def test_row9_a_corrupt_object_in_the_middle_stops_recovery() -> None:
    image = image_of((0, [b"a"]), (1, [b"b"]), (2, [b"c"]))
    damaged = bytearray(image[key(1)])
    damaged[-1] ^= 0x01
    image[key(1)] = bytes(damaged)
    refused(image, LostRecordsError, r"is damaged .* 1 object.s. follow it")


def test_row10_a_newer_format_says_upgrade() -> None:
    image = image_of((0, [b"a"]))
    newer = bytearray(image[key(0)])
    newer[4] = 2
    newer[32:36] = crc32c(bytes(newer[:32])).to_bytes(4, "little")
    image[key(0)] = bytes(newer)
    refused(image, RecoveryReadError, "upgrade stratalog")


def test_row11_a_get_that_keeps_failing_stops_recovery() -> None:
    inner = MemoryStore()
    inner.objects.update(image_of((0, [b"a"]), (1, [b"b"])))
    faulty = FaultyStore(inner, plan=ObjectFaultPlan(fail_before={"get": {1, 2, 3, 4}}))
    wal = ObjectWAL.open(faulty, OWNER, small_config(read_attempts_max=2, recovery_gets_in_flight_max=1))
    with pytest.raises(RecoveryReadError, match=r"reading WAL object .* failed"):
        list(wal.recover())
    wal.close()


def test_row11_an_object_listed_then_gone_stops_recovery() -> None:
    class Vanishing(MemoryStore):
        def list(self, prefix: str = "") -> object:
            listed = [*super().list(prefix), ObjectInfo(key(1), 100)]
            return iter(sorted(listed, key=lambda info: info.key))

    store = Vanishing()
    store.objects.update(image_of((0, [b"a"])))
    wal = ObjectWAL.open(store, OWNER, small_config())
    with pytest.raises(RecoveryReadError, match="listed but is gone"):
        list(wal.recover())
    wal.close()


def test_a_damaged_trim_marker_stops_recovery() -> None:
    image = image_of((0, [b"a"]), trim=0)
    image[TRIM] = image[TRIM][:-1]
    refused(image, RecoveryReadError, r"trim marker .* is unreadable")


def test_a_failed_cleanup_stops_recovery_before_any_put() -> None:
    inner = MemoryStore()
    inner.objects.update(image_of((0, [b"a"]), (2, [b"c"])))
    faulty = FaultyStore(inner, plan=ObjectFaultPlan(fail_before={"delete": {1, 2}}))
    wal = ObjectWAL.open(faulty, OWNER, small_config(read_attempts_max=2))
    with pytest.raises(RecoveryReadError, match=r"deleting WAL object .* failed"):
        list(wal.recover())
    assert faulty.calls["put"] == 0
    wal.close()


# Replay by another process ------------------------------------------------------------------------------


def test_read_records_returns_what_recover_would_and_changes_nothing() -> None:
    image = image_of((0, [b"a", b"b"]), (2, [b"c"]), (4, [b"e"]), trim=0)
    store = MemoryStore()
    store.objects.update(image)
    stats = ObjectRecoveryStats()
    assert data_of(list(read_records(store, OWNER, small_config(), stats))) == [(1, b"b"), (2, b"c")]
    assert stats.unacknowledged_objects == 1 and stats.next_offset == 3
    assert store.objects == image


_DYING_OWNER = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from stratalog.objects.local import LocalDirStore
    from stratalog.wal.config import ObjectWALConfig
    from stratalog.wal.object_wal import ObjectWAL

    wal = ObjectWAL.open(LocalDirStore(Path(sys.argv[1])), "dead-broker", ObjectWALConfig(linger_s=0.001))
    assert list(wal.recover()) == []
    for i in range(300):
        result = wal.append(b"record-%d" % i)
        if i == 99:
            result.future.result(30)
            wal.trim(49)
    durable = result.future.result(30)
    for i in range(300, 400):
        wal.append(b"record-%d" % i)  # in flight when the process dies
    print(durable, flush=True)
    os._exit(0)  # dies without closing: no last put, nothing cleaned up
""")


def test_a_second_process_replays_everything_a_dead_owner_acknowledged(tmp_path: Path) -> None:
    root = tmp_path / "objects"
    done = subprocess.run([sys.executable, "-c", _DYING_OWNER, str(root)], capture_output=True, text=True,
                          timeout=WAIT_S, check=True)
    durable = int(done.stdout)
    assert durable == 300
    store = LocalDirStore(root)
    replayed = list(read_records(store, "dead-broker"))
    offsets = [r.offset for r in replayed]
    assert offsets == list(range(50, len(offsets) + 50)) and offsets[-1] >= durable - 1
    assert all(r.data == b"record-%d" % r.offset for r in replayed)
    # Taking over: the new owner recovers the same records, then writes after them.
    heir = ObjectWAL.open(store, "dead-broker")
    assert [r.offset for r in heir.recover()] == offsets
    assert heir.append(b"next").future.result(WAIT_S) == offsets[-1] + 2
    heir.close()
    store.close()

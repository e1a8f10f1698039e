"""SpaceGuard: one test per row of free_space.py's state table, and the bound and its checks."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from stratalog.free_space import Headroom, SpaceGuard, Usage, disk_usage
from stratalog.objects.store import ObjectStoreFullError

MIB = 1 << 20
HEADROOM = Headroom(bytes_min=100 * MIB, percent_min=10.0, check_interval_s=1.0, recheck_interval_s=0.1)


class Disk:
    """A filesystem whose free bytes the test sets, and a clock the test moves."""

    def __init__(self, total_bytes: int = 500 * MIB, free_bytes: int = 400 * MIB) -> None:
        self.total_bytes = total_bytes
        self.free_bytes = free_bytes
        self.looks = 0
        self.now = 0.0

    def usage(self, path: Path) -> Usage:
        self.looks += 1
        return Usage(self.total_bytes, self.free_bytes)

    def clock(self) -> float:
        return self.now


def guard(disk: Disk) -> SpaceGuard:
    return SpaceGuard([Path("/data")], HEADROOM, logging.getLogger("test.space"), usage=disk.usage, clock=disk.clock)


def test_the_bound_is_the_larger_of_bytes_and_percent() -> None:
    assert HEADROOM.bound_bytes(Usage(500 * MIB, 0)) == 100 * MIB     # 10% is 50 MiB
    assert HEADROOM.bound_bytes(Usage(5000 * MIB, 0)) == 500 * MIB    # 10% is 500 MiB
    with pytest.raises(ValueError, match="free_percent_min"):
        Headroom(0, 100.0, 1.0, 0.1).validate("")
    with pytest.raises(ValueError, match="free_space_check_interval_s"):
        Headroom(0, 1.0, 0.0, 0.1).validate("")


def test_writable_to_disk_low_when_a_check_finds_free_bytes_below_the_bound(
        caplog: pytest.LogCaptureFixture) -> None:
    disk = Disk()
    space = guard(disk)
    assert space.check() is None and space.refusal is None
    disk.free_bytes = 99 * MIB
    with caplog.at_level(logging.ERROR, "test.space"):
        refusal = space.check()
    assert refusal == space.refusal
    assert refusal is not None and "/data" in refusal and "99 MiB free" in refusal and "100 MiB" in refusal
    assert [r.getMessage() for r in caplog.records] == [refusal], "the change is logged once"
    assert space.figures == {Path("/data"): (99 * MIB, 100 * MIB)}
    assert space.stats() == {"space_free_bytes": 99 * MIB, "space_kept_free_bytes": 100 * MIB,
                             "space_refusing": 1}


def test_disk_low_to_writable_when_a_check_finds_room_again(caplog: pytest.LogCaptureFixture) -> None:
    disk = Disk(free_bytes=10 * MIB)
    space = guard(disk)
    assert space.check() is not None
    disk.free_bytes = 90 * MIB
    caplog.clear()
    with caplog.at_level(logging.WARNING, "test.space"):
        assert space.check() is not None, "still below the bound: still refused"
        assert caplog.records == [], "the same state with other figures is not logged again"
        disk.free_bytes = 150 * MIB
        assert space.check() is None and space.refusal is None
    assert [r.getMessage() for r in caplog.records] == ["writes accepted again: space is back"]


def test_writable_to_objects_full_when_an_upload_runs_out_of_room() -> None:
    space = guard(Disk())
    space.check()
    space.objects_full(ObjectStoreFullError("QuotaExceeded"))
    assert space.refusal is not None and "an upload ran out of room" in space.refusal
    assert "QuotaExceeded" in space.refusal
    assert space.check() is not None, "a disk with room does not end it: an upload going through does"


def test_objects_full_to_writable_when_an_upload_goes_through() -> None:
    space = guard(Disk())
    space.objects_full(ObjectStoreFullError("full"))
    space.objects_ok()
    assert space.refusal is None
    space.objects_ok()   # an upload with nothing to end: nothing changes
    assert space.refusal is None


def test_both_at_once_name_the_disk_first_and_each_ends_alone() -> None:
    disk = Disk(free_bytes=MIB)
    space = guard(disk)
    space.check()
    space.objects_full(ObjectStoreFullError("full"))
    assert space.refusal is not None and space.refusal.startswith("the disk under /data")
    disk.free_bytes = 400 * MIB
    space.check()
    assert space.refusal is not None and "an upload ran out of room" in space.refusal
    space.objects_ok()
    assert space.refusal is None


def test_a_refusal_looks_again_at_most_once_per_recheck_interval() -> None:
    disk = Disk(free_bytes=MIB)
    space = guard(disk)
    space.check()
    looks = disk.looks
    for _ in range(100):
        assert space.recheck() is not None
    assert disk.looks == looks, "a storm of refused writes within the interval costs no look"
    disk.free_bytes = 400 * MIB
    disk.now += HEADROOM.recheck_interval_s
    assert space.recheck() is None and disk.looks == looks + 1, "the next refusal after it looks, and finds room"


def test_a_directory_that_cannot_be_looked_at_is_skipped(tmp_path: Path) -> None:
    space = SpaceGuard([tmp_path / "missing", tmp_path], Headroom(0, 0.0, 1.0, 0.1), logging.getLogger("t"))
    assert space.check() is None
    assert list(space.figures) == [tmp_path]
    real = disk_usage(tmp_path)
    assert 0 < real.free_bytes <= real.total_bytes

"""Object stores: one contract suite run on the local directory, the fault wrapper and a real S3 server."""

from __future__ import annotations

import errno
import os
import random
import secrets
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from conftest import SeaweedS3
from stratalog.chaos.ports import free_ports
from stratalog.errors import OutOfSpaceError
from stratalog.io import libc
from stratalog.objects import local as local_module
from stratalog.objects import s3 as s3_module
from stratalog.objects.faulty import DELAY_S_MAX, Fault, FaultyStore, InjectedFaultError, ObjectFaultPlan
from stratalog.objects.local import TEMP_PREFIX, LocalDirStore
from stratalog.objects.s3 import PARTS_MAX, S3Config, S3Store, part_bytes_for
from stratalog.objects.store import (
    ObjectInfo,
    ObjectNotFoundError,
    ObjectStore,
    ObjectStoreError,
    ObjectStoreFullError,
    made_ahead,
    put_parts,
)
from stratalog.objects.uri import open_object_store, redact
from waiting import wait_until

MiB = 1 << 20
real_content_md5 = s3_module._content_md5
STORE_KINDS = ("local", "faulty-local", "s3")


def payload(size_bytes: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size_bytes)


def small_s3_config(**overrides: Any) -> S3Config:
    """Bounds small enough that a few keys page and an 11 MiB object goes up in parts (5 MiB, S3's least)."""
    settings: dict[str, Any] = {
        "multipart_threshold_bytes": 5 * MiB,
        "multipart_part_bytes": 5 * MiB,
        "list_page_keys_max": 7,
        "attempts_max": 2,
    }
    settings.update(overrides)
    return S3Config(**settings)


def s3_store(server: SeaweedS3, prefix: str | None = None, config: S3Config | None = None) -> S3Store:
    """A store under a fresh prefix of the session's bucket, so tests never see each other's keys."""
    return S3Store(
        server.bucket, prefix if prefix is not None else f"t-{secrets.token_hex(6)}",
        endpoint_url=server.endpoint_url, region=server.region, access_key=server.access_key,
        secret_key=server.secret_key, config=config or small_s3_config(),
    )


@pytest.fixture(params=STORE_KINDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ObjectStore]:
    made: ObjectStore
    if request.param == "local":
        made = LocalDirStore(tmp_path / "objects")
    elif request.param == "faulty-local":
        made = FaultyStore(LocalDirStore(tmp_path / "objects"), seed=1)
    else:
        made = s3_store(request.getfixturevalue("seaweedfs"))
    yield made
    made.close()


@pytest.fixture
def s3(seaweedfs: SeaweedS3) -> Iterator[S3Store]:
    made = s3_store(seaweedfs)
    yield made
    made.close()


def keys_of(infos: Iterator[ObjectInfo]) -> list[str]:
    return [info.key for info in infos]


# The contract: every store ----------------------------------------------------------------------------


def test_put_then_get_returns_the_whole_object(store: ObjectStore) -> None:
    data = payload(1000)
    store.put("obj/a", data)
    assert store.get("obj/a") == data


def test_ranged_get_returns_first_middle_and_last_bytes(store: ObjectStore) -> None:
    data = payload(1000)
    store.put("obj/r", data)
    assert store.get("obj/r", 0, 1) == data[:1]
    assert store.get("obj/r", 400, 600) == data[400:600]
    assert store.get("obj/r", 999, 1000) == data[999:]


def test_ranged_get_to_the_end_and_past_it_acts_like_a_slice(store: ObjectStore) -> None:
    data = payload(1000)
    store.put("obj/s", data)
    assert store.get("obj/s", 990) == data[990:]
    assert store.get("obj/s", 990, None) == data[990:]
    assert store.get("obj/s", 990, 5000) == data[990:]
    assert store.get("obj/s", 1000) == b""
    assert store.get("obj/s", 2000, 3000) == b""
    assert store.get("obj/s", 10, 10) == b""


def test_empty_object(store: ObjectStore) -> None:
    store.put("obj/empty", b"")
    assert store.get("obj/empty") == b""
    assert store.get("obj/empty", 0, 0) == b""
    assert store.get("obj/empty", 0, 10) == b""
    assert store.size("obj/empty") == 0
    assert list(store.list("obj/")) == [ObjectInfo("obj/empty", 0)]


def test_size_is_the_object_length(store: ObjectStore) -> None:
    store.put("obj/sized", payload(12345))
    assert store.size("obj/sized") == 12345


def test_overwrite_replaces_the_whole_object(store: ObjectStore) -> None:
    store.put("obj/o", payload(5000, seed=1))
    store.put("obj/o", b"short")
    assert store.get("obj/o") == b"short"
    assert store.size("obj/o") == 5


def test_missing_key_raises_not_found(store: ObjectStore) -> None:
    calls: list[Callable[[], object]] = [
        lambda: store.get("no/such"),
        lambda: store.get("no/such", 5, 10),
        lambda: store.get("no/such", 5, 5),
        lambda: store.size("no/such"),
    ]
    for call in calls:
        with pytest.raises(ObjectNotFoundError, match="no/such") as caught:
            call()
        assert isinstance(caught.value, ObjectStoreError)
        assert isinstance(caught.value, KeyError)


def test_delete_removes_and_is_idempotent(store: ObjectStore) -> None:
    store.put("obj/d", b"x")
    store.delete("obj/d")
    with pytest.raises(ObjectNotFoundError):
        store.get("obj/d")
    store.delete("obj/d")
    store.delete("never/existed")
    assert list(store.list()) == []


def test_list_gives_keys_under_a_prefix_in_key_order(store: ObjectStore) -> None:
    # Directory-walk order and key order disagree on these: '-' and '.' sort before '/'.
    keys = ["d/x", "d-x", "d.x", "d/y/z", "d0", "e", "dd/a", "c", "d/x-1"]
    for position, key in enumerate(keys):
        store.put(key, payload(position))
    assert list(store.list()) == [ObjectInfo(key, keys.index(key)) for key in sorted(keys)]
    assert keys_of(store.list("d")) == sorted(key for key in keys if key.startswith("d"))
    assert keys_of(store.list("d/")) == ["d/x", "d/x-1", "d/y/z"]
    assert keys_of(store.list("d/y")) == ["d/y/z"]
    assert keys_of(store.list("d/x")) == ["d/x", "d/x-1"]
    assert keys_of(store.list("nothing")) == []
    assert keys_of(store.list("nothing/below")) == []


def test_list_pages_through_many_keys(store: ObjectStore) -> None:
    keys = [f"many/{number:03d}" for number in range(23)]  # three full pages of 7 and a partial one
    for key in random.Random(3).sample(keys, len(keys)):
        store.put(key, key.encode())
    assert list(store.list("many/")) == [ObjectInfo(key, len(key)) for key in keys]


def test_put_accepts_bytes_bytearray_and_memoryview(store: ObjectStore) -> None:
    data = payload(300)
    store.put("buf/bytearray", bytearray(data))
    store.put("buf/memoryview", memoryview(data)[100:200])
    assert store.get("buf/bytearray") == data
    assert store.get("buf/memoryview") == data[100:200]


@pytest.mark.parametrize("key", [
    "", "/abs/key", "a//b", "a/", "../x", "a/../b", "./a", "a/./b", "a\x00b", f"a/{TEMP_PREFIX}x",
    "x" * 256, "a/" * 600 + "b",
])
def test_bad_keys_are_refused(store: ObjectStore, key: str) -> None:
    for call in (lambda: store.put(key, b"x"), lambda: store.get(key), lambda: store.size(key),
                 lambda: store.delete(key)):
        with pytest.raises(ValueError, match="key"):
            call()


def test_bad_ranges_are_refused(store: ObjectStore) -> None:
    store.put("obj/range", b"0123456789")
    with pytest.raises(ValueError, match="start"):
        store.get("obj/range", -1)
    with pytest.raises(ValueError, match="end"):
        store.get("obj/range", 5, 4)


def test_large_object_round_trips_and_reads_across_part_boundaries(store: ObjectStore) -> None:
    # 11 MiB: above the S3 store's 5 MiB test threshold, so it goes up as parts of 5, 5 and 1 MiB.
    data = payload(11 * MiB)
    store.put("big/eleven", data)
    assert store.size("big/eleven") == len(data)
    assert store.get("big/eleven") == data
    for start, end in [(0, 1), (5 * MiB - 1, 5 * MiB + 1), (10 * MiB - 10, 10 * MiB + 10), (len(data) - 1, None)]:
        assert store.get("big/eleven", start, end) == data[start:end]


# The local directory -------------------------------------------------------------------------------


def test_rename_moves_the_object_and_replaces_the_destination(store: ObjectStore) -> None:
    store.put("staging/w/a", payload(3000))
    store.put("data/old", b"replaced")
    store.rename("staging/w/a", "data/old")
    assert store.get("data/old") == payload(3000)
    assert keys_of(store.list()) == ["data/old"]
    store.rename("data/old", "data/new/deeper")
    assert keys_of(store.list()) == ["data/new/deeper"] and store.size("data/new/deeper") == 3000
    with pytest.raises(ObjectNotFoundError):
        store.rename("data/old", "data/other")
    assert keys_of(store.list()) == ["data/new/deeper"]


def temp_files(root: Path) -> list[Path]:
    return [path for path in root.rglob("*") if path.name.startswith(TEMP_PREFIX)]


def test_local_objects_are_plain_files_under_the_root(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path / "root")
    store.put("p/q/r", b"hello")
    assert (tmp_path / "root" / "p" / "q" / "r").read_bytes() == b"hello"
    assert temp_files(tmp_path) == []


def test_local_put_syncs_the_file_and_every_directory_it_changed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = LocalDirStore(tmp_path / "root")
    synced: list[int] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(local_module.os, "fsync", recording_fsync)
    store.put("top", b"1")
    assert len(synced) == 2  # the file, then the root holding the rename
    synced.clear()
    store.put("new/dirs/key", b"1")
    assert len(synced) == 4  # root (for new/), new/ (for dirs/), the file, dirs/ (for the rename)


def test_local_rename_is_one_os_rename_and_syncs_both_directories(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = LocalDirStore(tmp_path / "root")
    store.put("staging/a", b"1")
    store.put("data/existing", b"0")
    synced: list[int] = []
    renamed: list[tuple[Any, Any]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def recording_fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    def recording_replace(src: Any, dst: Any) -> None:
        renamed.append((src, dst))
        real_replace(src, dst)

    monkeypatch.setattr(local_module.os, "fsync", recording_fsync)
    monkeypatch.setattr(local_module.os, "replace", recording_replace)
    store.rename("staging/a", "data/b")
    assert renamed == [(tmp_path / "root" / "staging" / "a", tmp_path / "root" / "data" / "b")]
    assert len(synced) == 2  # data/ (the new entry), then staging/ (the removed one)
    assert (tmp_path / "root" / "data" / "b").read_bytes() == b"1"


def _record_syncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The local store's fdatasync calls, as how much of the file is out when each piece is synced."""
    pieces: list[int] = []
    real_fdatasync = os.fdatasync

    def recording_fdatasync(fd: int) -> None:
        pieces.append(os.fstat(fd).st_size)
        real_fdatasync(fd)

    monkeypatch.setattr(local_module.os, "fdatasync", recording_fdatasync)
    return pieces

def test_local_put_syncs_large_objects_piece_by_piece(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = LocalDirStore(tmp_path / "root", sync_every_bytes=1000)
    pieces = _record_syncs(monkeypatch)
    data = bytes(range(256)) * 14  # 3,584 bytes: three whole pieces, then the last and the final fsync
    store.put("big", data)
    assert pieces == [1000, 2000, 3000]
    assert store.get("big") == data
    pieces.clear()
    store.put("small", b"x" * 1000)
    assert pieces == []  # one piece: the final fsync alone
    with pytest.raises(ValueError, match="sync_every_bytes"):
        LocalDirStore(tmp_path / "other", sync_every_bytes=0)


def test_local_put_parts_writes_parts_as_they_come_and_syncs_by_piece(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = LocalDirStore(tmp_path / "root", sync_every_bytes=1000)
    pieces = _record_syncs(monkeypatch)
    parts = [b"a" * 700, memoryview(b"b" * 900), bytearray(b"c" * 1500)]
    put_parts(store, "joined", iter(parts))
    assert store.get("joined") == b"a" * 700 + b"b" * 900 + b"c" * 1500
    assert pieces == [1000, 2000, 3000]  # pieces cut across parts, as for one put of the same bytes


def test_local_put_parts_that_fail_midway_store_nothing(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path / "root")

    def parts() -> Iterator[bytes]:
        yield b"first part"
        raise RuntimeError("the producer of the parts failed")

    with pytest.raises(RuntimeError, match="producer"):
        put_parts(store, "half", parts())
    assert not list(store.list()) and not list((tmp_path / "root").iterdir())  # no object, no temp file left


def test_put_parts_joins_the_parts_for_a_store_without_it(tmp_path: Path) -> None:
    inner = LocalDirStore(tmp_path / "root")
    faulty = FaultyStore(inner, plan=ObjectFaultPlan())
    assert not hasattr(faulty, "put_parts")
    put_parts(faulty, "k", [b"ab", b"cd"])
    assert inner.get("k") == b"abcd"


def test_local_reader_reads_the_same_bytes_sequentially_and_at_random(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path / "root")
    data = secrets.token_bytes(100_000)
    store.put("obj", data)
    reader = store.open_reader("obj")
    store.put("obj", b"replaced")  # a reader keeps the object it opened, through both descriptors
    try:
        rng = random.Random(3)
        for _ in range(50):
            a = rng.randrange(len(data))
            b = rng.randrange(a, len(data) + 1)
            assert reader.read(a, b) == data[a:b] == reader.read(a, b, random_access=True)
        with pytest.raises(ObjectStoreError, match="ends before"):
            reader.read(len(data) - 5, len(data) + 5, random_access=True)
    finally:
        reader.close()


def test_local_reader_hints_read_ahead_through_libc_keeping_the_gil(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    assert libc._fadvise_keeping_gil is not None    # Linux: libc's posix_fadvise through ctypes.PyDLL
    store = LocalDirStore(tmp_path / "root")
    data = secrets.token_bytes(3 * 4096)
    store.put("obj", data)
    reader = store.open_reader("obj")
    calls: list[tuple[int, int, int, int]] = []
    real = libc._fadvise_keeping_gil

    def recording(fd: int, offset: int, length: int, advice: int) -> int:
        calls.append((fd, offset, length, advice))
        return real(fd, offset, length, advice)

    monkeypatch.setattr(libc, "_fadvise_keeping_gil", recording)
    try:
        reader.will_need(4096, 3 * 4096)
        assert len(calls) == 1 and calls[0][1:] == (4096, 2 * 4096, os.POSIX_FADV_WILLNEED)
        # An empty range asks for nothing (posix_fadvise would take a length of 0 as the rest of the file).
        reader.will_need(8192, 8192)
        assert len(calls) == 1
        assert real(calls[0][0], 4096, 4096, os.POSIX_FADV_WILLNEED) == 0
        assert reader.read(4096, 3 * 4096) == data[4096:]
    finally:
        reader.close()
    assert real(calls[0][0], 0, 4096, os.POSIX_FADV_WILLNEED) == errno.EBADF   # an error number, not a raise

def test_local_reader_takes_small_cached_reads_without_the_gil_hand_off(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    assert libc._preadv2_keeping_gil is not None    # Linux: libc's preadv2 through ctypes.PyDLL
    store = LocalDirStore(tmp_path / "root")
    data = secrets.token_bytes(200_000)
    store.put("obj", data)
    reader = store.open_reader("obj")
    try:
        assert reader.read(0, len(data)) == data     # large: os.pread; and now all of it is in the page cache
        fd = reader._fd
        assert local_module._pread_cached(fd, 5000, 1000) == data[1000:6000]
        assert local_module._pread_cached(fd, 100, len(data) - 50) is None    # short: left to os.pread
        taken: list[tuple[int, int]] = []
        real = local_module._pread_cached

        def recording(fd: int, size: int, offset: int) -> bytes | None:
            taken.append((offset, size))
            return real(fd, size, offset)

        monkeypatch.setattr(local_module, "_pread_cached", recording)
        assert reader.read(100, 4196, random_access=True) == data[100:4196]
        assert reader.read(0, 100_000) == data[:100_000]    # above CACHED_READ_BYTES_MAX: not tried
        assert reader.read(200, 4296, cached_first=False) == data[200:4296]   # the caller's peek just failed
        assert taken == [(100, 4096)]
        monkeypatch.setattr(local_module, "_pread_cached", lambda fd, size, offset: None)    # not cached
        assert reader.read(7, 9000) == data[7:9000]
        with pytest.raises(ObjectStoreError, match="ends before"):
            reader.read(len(data) - 5, len(data) + 5)
    finally:
        reader.close()


def test_cached_reads_past_4_gib_get_the_right_bytes(tmp_path: Path) -> None:
    """The offset goes to preadv2 in a 64-bit box each thread reuses: no truncation, no stale offset."""
    path = tmp_path / "sparse"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        high = (5 << 30) + 8192
        os.pwrite(fd, b"a" * 4096, 4096)
        os.pwrite(fd, b"b" * 4096, high)
        for offset, byte in ((high, b"b"), (4096, b"a"), (high, b"b")):
            view = libc.cached_view(fd, 4096, offset)
            assert view is not None and view.tobytes() == byte * 4096
    finally:
        os.close(fd)


def test_local_reader_peek_gives_cached_bytes_as_a_view_and_none_otherwise(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    store = LocalDirStore(tmp_path / "root")
    data = secrets.token_bytes(100_000)
    store.put("obj", data)
    reader = store.open_reader("obj")
    try:
        assert reader.read(0, len(data)) == data     # now all of it is in the page cache
        view = reader.peek(4096, 12288, random_access=True)
        assert isinstance(view, memoryview) and view == data[4096:12288]
        assert reader.peek(10, 20) == data[10:20]
        assert reader.peek(len(data) - 10, len(data) + 10) is None           # past the end: left to read()
        assert reader.peek(0, libc.CACHED_READ_BYTES_MAX + 1) is None  # too large to try
        assert reader.peek(5, 5) is None
        with pytest.raises(ValueError, match="must be >= its start"):
            reader.peek(10, 5)
        monkeypatch.setattr(libc, "_preadv2_keeping_gil", None)       # no preadv2 here: never cached
        assert reader.peek(10, 20) is None
    finally:
        reader.close()


def test_local_failed_sync_stores_nothing_and_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = LocalDirStore(tmp_path / "root")
    store.put("kept", b"old")

    def failing_fsync(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(local_module.os, "fsync", failing_fsync)
    with pytest.raises(ObjectStoreFullError, match="disk is full"):
        store.put("kept", b"new")
    with pytest.raises(ObjectStoreError, match="nothing was stored"):
        store.put("fresh", b"new")
    monkeypatch.undo()
    assert store.get("kept") == b"old"
    with pytest.raises(ObjectNotFoundError):
        store.get("fresh")
    assert temp_files(tmp_path) == []


def test_local_list_skips_temp_files_and_remove_temp_files_deletes_them(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path / "root")
    store.put("dir/real", b"1")
    (tmp_path / "root" / "dir" / f"{TEMP_PREFIX}0123").write_bytes(b"half a put")
    (tmp_path / "root" / f"{TEMP_PREFIX}4567").write_bytes(b"half a put")
    assert keys_of(store.list()) == ["dir/real"]
    assert store.remove_temp_files() == 2
    assert temp_files(tmp_path) == []
    assert keys_of(store.list()) == ["dir/real"]


def test_a_recycled_object_is_gone_and_its_file_is_written_over_by_a_later_put(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path / "root")
    store.put("q/old", bytes(range(256)) * 64)                 # 16 KiB
    inode = (tmp_path / "root" / "q" / "old").stat().st_ino
    store.recycle("q/old", spare_bytes_max=1 << 20)
    with pytest.raises(ObjectNotFoundError):
        store.get("q/old")
    assert keys_of(store.list()) == [] and store.spare_bytes() == 16384
    store.put("small", b"no hint: never a spare")               # small puts leave the spares alone
    assert store.spare_bytes() == 16384
    new = b"shorter than the spare"
    put_parts(store, "q/new", [new[:5], new[5:]], size_hint=len(new))
    assert store.get("q/new") == new                             # the spare's tail is cut off
    assert (tmp_path / "root" / "q" / "new").stat().st_ino == inode
    assert store.spare_bytes() == 0
    put_parts(store, "q/next", [b"x" * 10], size_hint=10)      # no spare left: a new file
    assert store.get("q/next") == b"x" * 10
    assert keys_of(store.list()) == ["q/new", "q/next", "small"]


def test_recycling_keeps_spares_within_their_bound_and_deletes_the_rest(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path / "root")
    for name in ("a", "b", "c"):
        store.put(name, b"z" * 1000)
    store.recycle("a", spare_bytes_max=2500)
    store.recycle("b", spare_bytes_max=2500)
    store.recycle("c", spare_bytes_max=2500)                   # a third would pass the bound: deleted
    store.recycle("absent", spare_bytes_max=2500)              # nothing to do
    assert store.spare_bytes() == 2000 and keys_of(store.list()) == []
    assert store.remove_temp_files() == 2 and store.spare_bytes() == 0
    store.put("d", b"z" * 700)
    store.recycle("d", spare_bytes_max=2500)
    assert store.drop_spares() == 700 and store.spare_bytes() == 0


def test_a_put_takes_the_smallest_spare_that_holds_it_else_the_largest(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path / "root")
    for name, size in (("s", 100), ("m", 1000), ("l", 5000)):
        store.put(name, b"-" * size)
        store.recycle(name, spare_bytes_max=1 << 20)
    put_parts(store, "fits-m", [b"1" * 900], size_hint=900)
    assert store.spare_bytes() == 5100                           # the 1000-byte spare went
    put_parts(store, "big", [b"2" * 9000], size_hint=9000)
    assert store.spare_bytes() == 100                            # none holds it: the largest went
    assert store.get("fits-m") == b"1" * 900 and store.get("big") == b"2" * 9000


def test_local_key_and_keys_below_it_cannot_both_exist(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path / "root")
    store.put("a", b"file")
    with pytest.raises(ObjectStoreError, match="'a' is an object"):
        store.put("a/b", b"below")
    store.put("x/y", b"below")
    with pytest.raises(ObjectStoreError, match="is a directory"):
        store.put("x", b"file")
    with pytest.raises(ObjectNotFoundError):
        store.get("x")
    with pytest.raises(ObjectNotFoundError):
        store.size("x")
    store.delete("x")
    assert store.get("x/y") == b"below"
    assert temp_files(tmp_path) == []


def test_local_root_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(ObjectStoreError, match="not a directory"):
        LocalDirStore(tmp_path / "file")


def test_local_list_prefix_cannot_leave_the_root(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path / "root")
    with pytest.raises(ValueError, match=r"\.\."):
        list(store.list("../"))


# S3 ------------------------------------------------------------------------------------------------


def count_calls(store: S3Store, operation: str) -> list[str]:
    """Record every call of a botocore operation (e.g. 'UploadPart') the store makes."""
    seen: list[str] = []

    def record(**kwargs: Any) -> None:
        seen.append(operation)

    store.client.meta.events.register(f"before-call.s3.{operation}", record)
    return seen


def open_uploads(store: S3Store) -> list[str]:
    response = store.client.list_multipart_uploads(Bucket=store.bucket, Prefix=store.prefix)
    return [upload["Key"] for upload in response.get("Uploads", [])]


def test_s3_put_above_the_threshold_goes_up_in_parts(s3: S3Store) -> None:
    puts, parts = count_calls(s3, "PutObject"), count_calls(s3, "UploadPart")
    s3.put("small", payload(5 * MiB))
    assert (len(puts), len(parts)) == (1, 0)
    s3.put("large", payload(11 * MiB))
    assert (len(puts), len(parts)) == (1, 3)
    assert s3.get("large") == payload(11 * MiB)


def test_s3_rename_copies_on_the_server_in_parts_past_the_copy_limit(s3: S3Store,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    copies, part_copies = count_calls(s3, "CopyObject"), count_calls(s3, "UploadPartCopy")
    puts, gets = count_calls(s3, "PutObject"), count_calls(s3, "GetObject")
    s3.put("staging/small", payload(1000))
    s3.put("staging/large", payload(11 * MiB))
    puts.clear()
    s3.rename("staging/small", "data/small")
    assert (len(copies), len(part_copies)) == (1, 0)
    monkeypatch.setattr(s3_module, "COPY_BYTES_MAX", 5 * MiB)
    monkeypatch.setattr(s3_module, "COPY_PART_BYTES", 5 * MiB)
    s3.rename("staging/large", "data/large")
    assert (len(copies), len(part_copies)) == (1, 3)
    assert not puts and not gets, "a rename sent the object's bytes through the client"
    assert keys_of(s3.list()) == ["data/large", "data/small"]
    assert s3.get("data/large") == payload(11 * MiB) and s3.get("data/small") == payload(1000)
    assert open_uploads(s3) == []


def test_s3_failed_multipart_put_is_aborted_and_leaves_nothing(
        s3: S3Store, monkeypatch: pytest.MonkeyPatch) -> None:
    real_upload_part = s3.client.upload_part
    calls: list[int] = []

    def failing_upload_part(**kwargs: Any) -> Any:
        calls.append(kwargs["PartNumber"])
        if kwargs["PartNumber"] == 2:
            raise ClientError({"Error": {"Code": "InternalError", "Message": "injected"}}, "UploadPart")
        return real_upload_part(**kwargs)

    monkeypatch.setattr(s3.client, "upload_part", failing_upload_part)
    with pytest.raises(ObjectStoreError, match=r"multipart put s3://.*/large.*InternalError"):
        s3.put("large", payload(11 * MiB))
    assert calls == [1, 2]
    assert open_uploads(s3) == []
    with pytest.raises(ObjectNotFoundError):
        s3.size("large")


@pytest.mark.parametrize(("code", "status"), [("QuotaExceeded", 403), ("XMinioStorageFull", 507),
                                              ("InternalError", 507)])
def test_s3_out_of_room_is_an_object_store_full_error(s3: S3Store, monkeypatch: pytest.MonkeyPatch,
                                                      code: str, status: int) -> None:
    """A bucket over its quota or a backend out of storage (by its code, or HTTP 507 whatever the code)
    is ObjectStoreFullError: a store refuses writes until room is made instead of retrying and stopping."""
    def full(**kwargs: Any) -> Any:
        raise ClientError({"Error": {"Code": code, "Message": "no room"},
                           "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject")

    monkeypatch.setattr(s3.client, "put_object", full)
    with pytest.raises(ObjectStoreFullError, match="out of room") as raised:
        s3.put("small", b"x")
    assert isinstance(raised.value, OutOfSpaceError)


def test_s3_abort_incomplete_uploads_removes_orphans(s3: S3Store) -> None:
    upload = s3.client.create_multipart_upload(Bucket=s3.bucket, Key=f"{s3.prefix}orphan")
    s3.client.upload_part(Bucket=s3.bucket, Key=f"{s3.prefix}orphan", UploadId=upload["UploadId"],
                          PartNumber=1, Body=b"part")
    assert open_uploads(s3) == [f"{s3.prefix}orphan"]
    assert s3.abort_incomplete_uploads(started_before=datetime(2000, 1, 1, tzinfo=UTC)) == 0
    assert s3.abort_incomplete_uploads("other") == 0
    assert s3.abort_incomplete_uploads() == 1
    assert open_uploads(s3) == []
    assert s3.abort_incomplete_uploads() == 0


def test_s3_lists_past_a_thousand_keys_with_the_default_page(seaweedfs: SeaweedS3) -> None:
    store = s3_store(seaweedfs, config=S3Config())
    keys = [f"k/{number:04d}" for number in range(1001)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda key: store.put(key, b""), keys))
    assert keys_of(store.list("k/")) == keys
    store.close()


def test_s3_prefixes_keep_stores_apart(seaweedfs: SeaweedS3) -> None:
    first, second = s3_store(seaweedfs, "shared/one"), s3_store(seaweedfs, "shared/one-more/")
    assert first.prefix == "shared/one/"
    first.put("k", b"1")
    second.put("k", b"2")
    assert list(first.list()) == [ObjectInfo("k", 1)]
    assert first.get("k") == b"1"
    assert second.get("k") == b"2"
    first.close()
    second.close()


def test_s3_missing_bucket_says_so(seaweedfs: SeaweedS3) -> None:
    store = S3Store("no-such-bucket-here", endpoint_url=seaweedfs.endpoint_url, access_key=seaweedfs.access_key,
                    secret_key=seaweedfs.secret_key, config=small_s3_config())
    with pytest.raises(ObjectStoreError, match="bucket 'no-such-bucket-here' does not exist") as caught:
        store.get("k")
    assert not isinstance(caught.value, ObjectNotFoundError)
    store.close()


def test_s3_wrong_credentials_say_what_to_check(seaweedfs: SeaweedS3) -> None:
    store = S3Store(seaweedfs.bucket, endpoint_url=seaweedfs.endpoint_url, access_key="nobody",
                    secret_key="wrong", config=small_s3_config())
    with pytest.raises(ObjectStoreError, match=r"access denied.*AWS_ACCESS_KEY_ID"):
        store.put("k", b"1")
    store.close()


def test_s3_unreachable_endpoint_fails_fast_with_advice() -> None:
    (port,) = free_ports(1)  # nothing listens there
    store = S3Store("bucket", endpoint_url=f"http://127.0.0.1:{port}", access_key="a", secret_key="b",
                    config=S3Config(attempts_max=1, connect_timeout_s=1.0))
    with pytest.raises(ObjectStoreError, match=r"cannot connect after 1 attempts.*endpoint URL"):
        store.get("k")
    store.close()


def test_s3_body_damaged_on_the_way_is_refused(s3: S3Store, monkeypatch: pytest.MonkeyPatch) -> None:
    # The digest of other bytes stands in for a body garbled in transit: the server must refuse it.
    monkeypatch.setattr(s3_module, "_content_md5", lambda data: real_content_md5(b"other bytes"))
    with pytest.raises(ObjectStoreError, match="damaged on its way"):
        s3.put("k", b"the real bytes")
    monkeypatch.undo()
    with pytest.raises(ObjectNotFoundError):
        s3.get("k")


def test_s3_config_refuses_sizes_s3_does_not_allow() -> None:
    with pytest.raises(ValueError, match="multipart_part_bytes"):
        S3Config(multipart_part_bytes=MiB).validate()
    with pytest.raises(ValueError, match="list_page_keys_max"):
        S3Config(list_page_keys_max=1001).validate()
    with pytest.raises(ValueError, match="both access_key and secret_key"):
        S3Store("bucket", access_key="only-one")


def test_s3_part_size_grows_so_an_object_fits_in_ten_thousand_parts() -> None:
    assert part_bytes_for(11 * MiB, 5 * MiB) == 5 * MiB
    assert part_bytes_for(100_000 * MiB, 8 * MiB) == 10 * MiB
    assert -(-(100_000 * MiB) // part_bytes_for(100_000 * MiB, 8 * MiB)) <= PARTS_MAX
    with pytest.raises(ValueError, match="larger than S3 allows"):
        part_bytes_for(6 << 40, 8 * MiB)


# The fault-injecting wrapper ----------------------------------------------------------------------


def faulty(tmp_path: Path, plan: ObjectFaultPlan, seed: int = 0) -> tuple[FaultyStore, list[float]]:
    slept: list[float] = []
    return FaultyStore(LocalDirStore(tmp_path / "objects"), seed, plan, sleep=slept.append), slept


def test_faulty_fail_before_raises_and_nothing_changes(tmp_path: Path) -> None:
    store, _ = faulty(tmp_path, ObjectFaultPlan(fail_before={"put": {2}, "delete": {1}}))
    store.put("k", b"1")
    with pytest.raises(InjectedFaultError, match="put #2 failed before") as caught:
        store.put("k", b"2")
    assert isinstance(caught.value, ObjectStoreError)
    with pytest.raises(InjectedFaultError):
        store.delete("k")
    assert store.get("k") == b"1"
    assert store.faults == {Fault.FAIL_BEFORE: 2}


def test_faulty_fail_after_raises_although_the_call_took_effect(tmp_path: Path) -> None:
    store, _ = faulty(tmp_path, ObjectFaultPlan(fail_after={"put": {1}, "delete": {1}, "list": {1}}))
    with pytest.raises(InjectedFaultError, match="took effect"):
        store.put("k", b"landed")
    assert store.inner.get("k") == b"landed"
    with pytest.raises(InjectedFaultError):
        list(store.list())
    with pytest.raises(InjectedFaultError):
        store.delete("k")
    with pytest.raises(ObjectNotFoundError):
        store.inner.get("k")


def test_faulty_rename_fails_before_or_after_it_took_effect(tmp_path: Path) -> None:
    store, _ = faulty(tmp_path, ObjectFaultPlan(fail_before={"rename": {1}}, fail_after={"rename": {2}}))
    store.put("a", b"1")
    with pytest.raises(InjectedFaultError, match="before"):
        store.rename("a", "b")
    assert keys_of(store.inner.list()) == ["a"]
    with pytest.raises(InjectedFaultError, match="took effect"):
        store.rename("a", "b")
    assert keys_of(store.inner.list()) == ["b"]


def test_faulty_interrupted_put_lands_nothing(tmp_path: Path) -> None:
    store, _ = faulty(tmp_path, ObjectFaultPlan(interrupt_puts={2, 3}))
    store.put("k", b"old")
    with pytest.raises(InjectedFaultError, match="interrupted"):
        store.put("k", b"new")
    with pytest.raises(InjectedFaultError, match="interrupted"):
        store.put("fresh", b"new")
    assert store.get("k") == b"old"
    assert keys_of(store.list()) == ["k"]
    assert store.faults == {Fault.INTERRUPT_PUT: 2}


def test_faulty_delay_sleeps_then_goes_on(tmp_path: Path) -> None:
    store, slept = faulty(tmp_path, ObjectFaultPlan(delay={"get": {1}}, delay_s=0.25))
    store.put("k", b"1")
    assert store.get("k") == b"1"
    assert store.get("k") == b"1"
    assert slept == [0.25]
    assert [(entry.kind, entry.call_number, entry.fault) for entry in store.history] == [("get", 1, Fault.DELAY)]


def test_faulty_counts_calls_by_kind(tmp_path: Path) -> None:
    store, _ = faulty(tmp_path, ObjectFaultPlan(fail_before={"get": {1}}))
    store.put("a", b"1")
    store.put("b", b"2")
    with pytest.raises(InjectedFaultError):
        store.get("a")
    store.get("a")
    store.size("a")
    list(store.list())
    store.rename("b", "c")
    store.delete("a")
    assert store.calls == {"put": 2, "get": 2, "size": 1, "list": 1, "delete": 1, "rename": 1}


def test_faulty_chance_faults_replay_from_the_seed(tmp_path: Path) -> None:
    plan = ObjectFaultPlan(fail_before_probability=0.2, fail_after_probability=0.2, random_kinds=frozenset({"get"}))

    def run(seed: int, directory: Path) -> list[bool]:
        store, _ = faulty(directory, plan, seed)
        store.put("k", b"1")
        outcomes = []
        for _ in range(200):
            try:
                store.get("k")
                outcomes.append(True)
            except InjectedFaultError:
                outcomes.append(False)
        return outcomes

    first, again, other = run(7, tmp_path / "a"), run(7, tmp_path / "b"), run(8, tmp_path / "c")
    assert first == again
    assert first != other
    assert 0.2 < first.count(False) / len(first) < 0.5  # about 1 - 0.8 * 0.8 = 0.36


def test_faulty_plan_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="fail_before_probability"):
        ObjectFaultPlan(fail_before_probability=1.5).validate()
    with pytest.raises(ValueError, match="delay_s"):
        ObjectFaultPlan(delay_s=DELAY_S_MAX + 1).validate()
    with pytest.raises(ValueError, match="unknown calls"):
        ObjectFaultPlan(fail_after={"stat": {1}}).validate()  # type: ignore[dict-item]


# URIs ----------------------------------------------------------------------------------------------


def test_uri_none_is_the_local_directory_under_the_data_dir(tmp_path: Path) -> None:
    store = open_object_store(None, tmp_path)
    assert isinstance(store, LocalDirStore)
    assert store.root == tmp_path / "objects"


def test_uri_file_is_a_local_directory(tmp_path: Path) -> None:
    for uri in (f"file://{tmp_path}/there", f"file://localhost{tmp_path}/there"):
        store = open_object_store(uri, tmp_path / "unused")
        assert isinstance(store, LocalDirStore)
        assert store.root == tmp_path / "there"


def test_uri_s3_carries_bucket_prefix_endpoint_region_and_keys(tmp_path: Path) -> None:
    store = open_object_store("s3://my-bucket/some/prefix?endpoint=http://127.0.0.1:8333&region=eu-west-1"
                              "&access_key=id&secret_key=key", tmp_path)
    assert isinstance(store, S3Store)
    assert (store.bucket, store.prefix, store.endpoint_url) == ("my-bucket", "some/prefix/", "http://127.0.0.1:8333")
    assert store.client.meta.region_name == "eu-west-1"
    bare = open_object_store("s3://my-bucket", tmp_path)
    assert isinstance(bare, S3Store)
    assert (bare.bucket, bare.prefix) == ("my-bucket", "")
    store.close()
    bare.close()


def test_uri_s3_takes_credentials_from_the_environment(
        seaweedfs: SeaweedS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", seaweedfs.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", seaweedfs.secret_key)
    store = open_object_store(f"s3://{seaweedfs.bucket}/env-{secrets.token_hex(4)}?endpoint={seaweedfs.endpoint_url}",
                              tmp_path)
    store.put("k", b"via env")
    assert store.get("k") == b"via env"
    store.close()


@pytest.mark.parametrize(("uri", "message"), [
    ("gs://bucket/prefix", "'gs'"),
    ("", "no scheme"),
    ("/plain/path", "no scheme"),
    ("s3://", "no bucket"),
    ("s3:///prefix", "no bucket"),
    ("s3://bucket?colour=blue", "unknown parameter 'colour'"),
    ("s3://bucket?region=a&region=b", "'region' twice"),
    ("s3://id:secret@bucket/p", "bare bucket name"),
    ("file://host/path", "names host 'host'"),
    ("file:relative/path", "absolute path"),
    ("file:///abs?x=1", "no query"),
])
def test_uri_mistakes_are_named(tmp_path: Path, uri: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        open_object_store(uri, tmp_path)


def test_uri_errors_never_show_the_secret(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as caught:
        open_object_store("s3://bucket?secret_key=hunter2&bogus=1", tmp_path)
    assert "hunter2" not in str(caught.value)
    with pytest.raises(ValueError) as caught:
        open_object_store("s3://id:hunter2@bucket", tmp_path)
    assert "hunter2" not in str(caught.value)
    assert redact("s3://b?access_key=a&secret_key=s&region=r") == "s3://b?access_key=a&secret_key=***&region=r"


def test_local_put_parts_takes_a_piece_size_for_one_put(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = LocalDirStore(tmp_path / "root", sync_every_bytes=1000)
    pieces = _record_syncs(monkeypatch)
    put_parts(store, "big", [b"a" * 2500, b"b" * 2500], sync_every_bytes=2000)
    assert pieces == [2000, 4000] and store.get("big") == b"a" * 2500 + b"b" * 2500
    pieces.clear()
    put_parts(store, "default", [b"a" * 2500])
    assert pieces == [1000, 2000]  # the store's own piece size
    with pytest.raises(ValueError, match="sync_every_bytes"):
        store.put_parts("bad", [b"x"], sync_every_bytes=0)
    faulty = FaultyStore(LocalDirStore(tmp_path / "other"), plan=ObjectFaultPlan())
    put_parts(faulty, "k", [b"ab", b"cd"], sync_every_bytes=2000)  # a store without put_parts: joined
    assert faulty.get("k") == b"abcd"


def test_parts_made_ahead_come_in_order_one_ahead_in_another_thread() -> None:
    made: list[tuple[int, str]] = []
    taken: list[int] = []

    def parts() -> Iterator[bytes]:
        for i in range(5):
            made.append((i, threading.current_thread().name))
            yield bytes([i]) * 3

    for part in made_ahead(parts(), "ahead-test"):
        taken.append(part[0])
        # While the caller holds part i, part i + 1 is made and no further (two parts at most).
        wait_until(lambda part=part: len(made) >= min(part[0] + 2, 5), f"part {part[0] + 1} to be made")
        assert len(made) == min(part[0] + 2, 5)
    assert taken == list(range(5))
    assert all(name.startswith("ahead-test") for _, name in made)


def test_an_error_making_a_part_reaches_the_caller_and_an_early_stop_closes_the_parts() -> None:
    def failing() -> Iterator[bytes]:
        yield b"a"
        raise ValueError("no second part")

    with pytest.raises(ValueError, match="no second part"):
        list(made_ahead(failing(), "ahead-test"))

    closed = threading.Event()

    def endless() -> Iterator[bytes]:
        try:
            while True:
                yield b"x"
        finally:
            closed.set()

    ahead = made_ahead(endless(), "ahead-test")
    assert next(ahead) == b"x"
    ahead.close()
    assert closed.is_set(), "stopping early closes the parts generator"


def test_a_put_of_parts_made_ahead_stores_them_all(store: ObjectStore) -> None:
    parts = [secrets.token_bytes(n) for n in (1, 5000, 0, 70000, 3)]
    put_parts(store, "ahead/obj", made_ahead(iter(parts), "ahead-test"))
    assert store.get("ahead/obj") == b"".join(parts)

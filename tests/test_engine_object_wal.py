"""The stream store on the object WAL: what it acknowledges survives a crash, in memory and on real S3."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from conftest import SeaweedS3
from enginekit import MemoryStore, abandon, small_store_config
from owalkit import OWNER, PREFIX, small_config
from stratalog.engine.store import StreamStore
from stratalog.objects.s3 import S3Config, S3Store
from stratalog.objects.store import ObjectStore
from stratalog.wal.object_wal import ObjectWAL
from waiting import WAIT_S


def open_store(path: Path, objects: ObjectStore) -> StreamStore:
    wal = ObjectWAL.open(objects, OWNER, small_config(object_bytes_soft_max=64 << 10))
    return StreamStore.open(path, objects, small_store_config(), wal=wal)


def values(store: StreamStore, name: str) -> list[bytes]:
    return [r.value for r in store.open_stream(name).fetch(0, max_bytes=1 << 30)]


def wal_keys(objects: ObjectStore) -> list[str]:
    return [info.key for info in objects.list(PREFIX) if info.key != PREFIX + "trim"]


def test_everything_acknowledged_survives_an_abandoned_store(tmp_path: Path) -> None:
    objects = MemoryStore()
    store = open_store(tmp_path, objects)
    a, b = store.create_stream("a"), store.create_stream("b")
    a.append([b"a0", b"a1"]).result(WAIT_S)
    store.flush()  # uploaded: the WAL is trimmed behind it
    assert store.stats()["wal_trim_offset"] == 0
    last = [a.append([b"a%d" % i]) for i in range(2, 40)] + [b.append([b"b%d" % i]) for i in range(25)]
    for future in last:
        future.result(WAIT_S)
    abandon(store)  # like a crash: nothing more is uploaded
    assert wal_keys(objects)  # the tail is only in the WAL's objects
    reopened = open_store(tmp_path, objects)
    assert reopened.recovery.batches_replayed == 38 + 25
    assert values(reopened, "a") == [b"a%d" % i for i in range(40)]
    assert values(reopened, "b") == [b"b%d" % i for i in range(25)]
    reopened.close()
    assert wal_keys(objects) == []  # a clean close uploads everything and trims the WAL to nothing


def test_wal_and_wal_device_together_are_refused(tmp_path: Path) -> None:
    objects = MemoryStore()
    wal = ObjectWAL.open(objects, OWNER, small_config())
    with pytest.raises(ValueError, match="not both"):
        StreamStore.open(tmp_path, objects, small_store_config(), wal=wal, wal_device=object())  # type: ignore[arg-type]
    wal.close()


def test_the_store_runs_on_the_object_wal_in_real_s3(tmp_path: Path, seaweedfs: SeaweedS3) -> None:
    prefix = f"t-{secrets.token_hex(6)}"

    def s3() -> S3Store:  # a store per open, as a restarted process makes: the store closes its own
        return S3Store(seaweedfs.bucket, prefix, endpoint_url=seaweedfs.endpoint_url, region=seaweedfs.region,
                       access_key=seaweedfs.access_key, secret_key=seaweedfs.secret_key,
                       config=S3Config(attempts_max=2))

    store = open_store(tmp_path, s3())
    stream = store.create_stream("s")
    futures = [stream.append([b"v%d" % i, b"w%d" % i]) for i in range(50)]
    assert futures[-1].result(WAIT_S) == 98
    abandon(store)
    look = s3()
    assert wal_keys(look)
    look.close()
    reopened = open_store(tmp_path, s3())
    assert reopened.recovery.batches_replayed == 50
    assert values(reopened, "s") == [v for i in range(50) for v in (b"v%d" % i, b"w%d" % i)]
    reopened.close()

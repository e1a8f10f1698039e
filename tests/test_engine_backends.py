"""The engine on real object storage: the local directory store and S3 (SeaweedFS on 127.0.0.1)."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from conftest import SeaweedS3
from enginekit import abandon, small_store_config
from stratalog.engine.manifest import read_manifest
from stratalog.engine.store import DATA_PREFIX, StreamStore
from stratalog.errors import StratalogError
from stratalog.objects.local import LocalDirStore
from stratalog.objects.store import ObjectStore

Factory = Callable[[], ObjectStore]


@pytest.fixture(params=["local", "s3"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Factory]:
    """Makes handles on one object store location: a reopened store needs a fresh handle on the same place."""
    if request.param == "local":
        yield lambda: LocalDirStore(tmp_path / "objects")
        return
    from stratalog.objects.s3 import S3Store

    server: SeaweedS3 = request.getfixturevalue("seaweedfs")
    prefix = f"engine-{secrets.token_hex(6)}"
    yield lambda: S3Store(server.bucket, prefix, endpoint_url=server.endpoint_url, region=server.region,
                          access_key=server.access_key, secret_key=server.secret_key)


def data_keys(store: ObjectStore) -> set[str]:
    return {info.key for info in store.list(DATA_PREFIX)}


def test_cold_reads_reopen_and_wal_replay(tmp_path: Path, backend: Factory) -> None:
    store = StreamStore.open(tmp_path / "d", backend(), small_store_config())
    a, b = store.create_stream("a"), store.create_stream("b")
    for i in range(300):
        a.append([b"a%d" % i])
        b.append([b"b%d" % i] * 3)
    store.flush()
    a.append([b"tail"]).result()
    abandon(store)
    store = StreamStore.open(tmp_path / "d", backend(), small_store_config())
    assert store.recovery.batches_replayed == 1
    a, b = store.open_stream("a"), store.open_stream("b")
    assert [r.value for r in a.fetch(0, max_bytes=1 << 30)] == [b"a%d" % i for i in range(300)] + [b"tail"]
    assert len(b.fetch(0, max_bytes=1 << 30)) == 900
    store.close()


def test_interrupted_upload_leaves_no_orphan_after_reopen(tmp_path: Path, backend: Factory) -> None:
    store = StreamStore.open(tmp_path / "d", backend(), small_store_config(upload_attempts_max=1))
    s = store.create_stream("s")
    for i in range(50):
        s.append([b"r%d" % i]).result()

    def killed(*_: object) -> int:
        raise StratalogError("killed between the put and the commit")

    store.metadata.commit_objects = killed  # type: ignore[method-assign]
    with pytest.raises(StratalogError):
        store.flush()
    abandon(store)
    probe = backend()
    assert len(data_keys(probe)) == 1, "the interrupted upload should have left its object"
    store = StreamStore.open(tmp_path / "d", backend(), small_store_config())
    assert store.recovery.orphan_objects_deleted == 1
    assert [r.value for r in store.open_stream("s").fetch(0)] == [b"r%d" % i for i in range(50)]
    store.flush()
    assert data_keys(probe) == {o.key for o in store.metadata.objects()}
    store.close()
    probe.close()


def test_trimmed_objects_are_deleted_and_the_manifest_reads_from_the_store_alone(
        tmp_path: Path, backend: Factory) -> None:
    store = StreamStore.open(tmp_path / "d", backend(), small_store_config())
    s = store.create_stream("s")
    s.append([b"old"] * 10).result()
    store.flush()
    s.append([b"new"] * 10).result()
    store.flush()
    probe = backend()
    assert len(data_keys(probe)) == 2
    s.trim(10)
    assert store.delete_unreferenced() == 1
    assert len(data_keys(probe)) == 1
    manifest = read_manifest(probe)
    info = manifest.stream_by_name("s")
    assert info is not None and (info.start_offset, info.end_offset) == (10, 20)
    assert [(r.entry.start_offset, r.entry.end_offset) for r in manifest.blocks[info.stream_id]] == [(10, 20)]
    store.close()
    probe.close()


def test_s3_uri_opens_the_store(tmp_path: Path, seaweedfs: SeaweedS3) -> None:
    uri = (f"s3://{seaweedfs.bucket}/uri-{secrets.token_hex(4)}?endpoint={seaweedfs.endpoint_url}"
           f"&region={seaweedfs.region}&access_key={seaweedfs.access_key}&secret_key={seaweedfs.secret_key}")
    with StreamStore.open(tmp_path / "d", uri, small_store_config()) as store:
        s = store.create_stream()
        s.append([b"via uri"]).result()
        store.flush()
        assert [r.value for r in s.fetch(0)] == [b"via uri"]

"""Pipeline jobs on the local[2] Spark session: compaction, retention, export, and re-runs after a crash."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from conftest import SeaweedS3
from enginekit import small_store_config
from stratalog.engine.manifest import read_manifest
from stratalog.engine.store import DATA_PREFIX, StreamStore, object_key
from stratalog.records import NewRecord
from stratalog.spark import jobs
from stratalog.spark.reader import open_store

pytestmark = pytest.mark.slow
STREAMS = 12
ROUNDS = 4


@pytest.fixture(params=["local", "s3"])
def uri(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "local":
        yield str(tmp_path / "objects")
        return
    server: SeaweedS3 = request.getfixturevalue("seaweedfs")
    query = urlencode({"endpoint": server.endpoint_url, "region": server.region,
                       "access_key": server.access_key, "secret_key": server.secret_key})
    yield f"s3://{server.bucket}/jobs-{secrets.token_hex(6)}?{query}"


def small_objects_store(data_dir: Path, uri: str) -> None:
    """STREAMS streams uploaded in ROUNDS flushes: every object holds a little of every stream."""
    store = StreamStore.open(data_dir, open_store(uri), small_store_config())
    for n in range(STREAMS):
        store.create_stream(f"s{n}", retention_ms=None)
    for r in range(ROUNDS):
        for n in range(STREAMS):
            store.open_stream(f"s{n}").append(
                [NewRecord(b"r%d-s%d-%d" % (r, n, i), timestamp_ms=1000 * (r + 1)) for i in range(25)]).result()
        store.flush()
    store.close()


def all_rows(spark: Any, uri: str) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in spark.read.format("stratalog").option("path", uri).load().collect())


def data_keys(uri: str) -> set[str]:
    return {info.key for info in open_store(uri).list(DATA_PREFIX)}


def referenced_keys(uri: str) -> set[str]:
    manifest = read_manifest(open_store(uri))
    return {ref.key for refs in manifest.blocks.values() for ref in refs}


def test_compaction_makes_per_stream_objects_and_reads_the_same(spark: Any, tmp_path: Path, uri: str) -> None:
    small_objects_store(tmp_path / "d", uri)
    before = all_rows(spark, uri)
    assert len(referenced_keys(uri)) == ROUNDS
    report = jobs.compact(spark, tmp_path / "d", uri, config=small_store_config())
    assert report.objects_replaced == ROUNDS and report.objects_written == STREAMS
    manifest = read_manifest(open_store(uri))
    for stream_id, refs in manifest.blocks.items():
        assert len({r.key for r in refs}) == 1, f"stream {stream_id} spans several objects"
    assert len(referenced_keys(uri)) == STREAMS
    assert all_rows(spark, uri) == before
    again = jobs.compact(spark, tmp_path / "d", uri, config=small_store_config())
    assert again.objects_written == 0


def test_compaction_reruns_cleanly_after_a_crash_before_its_commit(spark: Any, tmp_path: Path, uri: str) -> None:
    small_objects_store(tmp_path / "d", uri)
    before = all_rows(spark, uri)
    # A run that wrote its outputs and died before replace_objects: objects no commit names.
    store = StreamStore.open(tmp_path / "d", open_store(uri), small_store_config())
    manifest = read_manifest(store.object_store)
    runs = jobs.plan_compaction(manifest.blocks, jobs.compaction_candidates(manifest.blocks))
    outputs = []
    for run in runs:
        object_id = store.metadata.allocate_object_id()
        outputs.append(jobs.CompactionOutput(object_id, object_key(object_id), run[0].entry.stream_id, tuple(run)))
    store.close()
    half_written = [o.key for o in jobs.write_compacted(uri, outputs[: len(outputs) // 2])]
    assert set(half_written) <= data_keys(uri)
    report = jobs.compact(spark, tmp_path / "d", uri, config=small_store_config())
    assert report.objects_written == STREAMS
    assert not set(half_written) & data_keys(uri)  # the crashed run's objects are gone
    assert all_rows(spark, uri) == before


def test_retention_trims_and_deletes_unreferenced_objects(spark: Any, tmp_path: Path, uri: str) -> None:
    small_objects_store(tmp_path / "d", uri)
    config = small_store_config(object_grace_s=0.0)
    jobs.compact(spark, tmp_path / "d", uri, config=config)
    assert len(data_keys(uri)) == ROUNDS + STREAMS  # the replaced objects wait for their grace period
    store = StreamStore.open(tmp_path / "d", open_store(uri), config)
    store.set_retention(store.open_stream("s0"), retention_ms=10_000, retention_bytes=None)
    store.close()
    report = jobs.retention(spark, tmp_path / "d", uri, config=config, now_ms=1_000_000)
    assert report.objects_deleted == ROUNDS + 1 and report.streams_trimmed == 1
    assert data_keys(uri) == referenced_keys(uri)
    rows = all_rows(spark, uri)
    assert len(rows) == (STREAMS - 1) * ROUNDS * 25
    assert not any(r[0] == "s0" for r in rows)
    assert jobs.retention(spark, tmp_path / "d", uri, config=config, now_ms=1_000_000).objects_deleted == 0


def test_export_writes_parquet_partitioned_by_stream(spark: Any, tmp_path: Path, uri: str) -> None:
    small_objects_store(tmp_path / "d", uri)
    out = tmp_path / "export"
    report = jobs.export(spark, uri, str(out), streams="s1,s3")
    assert report.rows == 2 * ROUNDS * 25
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["stream=s1", "stream=s3"]
    exported = sorted((r.stream, r.offset, r.value) for r in spark.read.parquet(str(out)).collect())
    source = sorted((r[0], r[1], r[4]) for r in all_rows(spark, uri) if r[0] in ("s1", "s3"))
    assert exported == source
    jobs.export(spark, uri, str(out), streams="s1")  # a re-run replaces the output
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["stream=s1"]


def test_pipeline_command_compacts_and_reports(tmp_path: Path) -> None:
    import subprocess
    import sys

    uri = str(tmp_path / "d" / "objects")
    small_objects_store(tmp_path / "d", uri)
    command = Path(sys.executable).parent / "stratalog"
    done = subprocess.run([str(command), "pipeline", "compact", str(tmp_path / "d"),
                           "--master", "local[1]"], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"replaced {ROUNDS} objects with {STREAMS} per-stream objects" in done.stdout
    assert len(referenced_keys(uri)) == STREAMS


def test_retention_can_clean_what_a_dead_write_staged(spark: Any, tmp_path: Path) -> None:
    from stratalog.engine.staging import STAGING_PREFIX
    from stratalog.spark.write import StagingWriter

    uri = str(tmp_path / "objects")
    small_objects_store(tmp_path / "d", uri)
    writer = StagingWriter(open_store(uri), f"{STAGING_PREFIX}dead-write/", object_bytes=100)
    for _ in range(3):  # staged, never committed: the driver died
        writer.add("s0", [NewRecord(b"x" * 200)])
    assert len(list(open_store(uri).list(STAGING_PREFIX))) == 3
    kept = jobs.retention(spark, tmp_path / "d", uri, config=small_store_config())
    assert kept.staged_objects_deleted == 0 and len(list(open_store(uri).list(STAGING_PREFIX))) == 3
    cleaned = jobs.retention(spark, tmp_path / "d", uri, config=small_store_config(), clean_staging=True)
    assert cleaned.staged_objects_deleted == 3 and cleaned.objects_deleted == 0
    assert not list(open_store(uri).list(STAGING_PREFIX))
    assert len(all_rows(spark, uri)) == STREAMS * ROUNDS * 25

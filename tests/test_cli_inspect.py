"""`stratalog inspect` reads a store, its WAL and its objects without changing them."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from enginekit import abandon, small_store_config
from queuekit import small_queue_config
from stratalog.cli import cli
from stratalog.engine.store import StreamStore
from stratalog.objects.uri import LOCAL_DIR_NAME
from stratalog.queues import QueueStore
from waiting import wait_until


def run(*args: str, exit_code: int = 0) -> str:
    result = CliRunner().invoke(cli, ["inspect", *args], catch_exceptions=False, terminal_width=200)
    assert result.exit_code == exit_code, result.output
    return result.output


def test_inspect_shows_streams_objects_ranges_wal_and_object(tmp_path: Path) -> None:
    store = StreamStore.open(tmp_path, config=small_store_config())
    s = store.create_stream("orders")
    for _ in range(20):
        s.append([b"x" * 100] * 5)
    store.flush()
    s.append([b"tail"]).result()
    key = store.metadata.objects()[0].key
    abandon(store)  # the tail stays in the WAL
    before = files(tmp_path)

    summary = run(str(tmp_path))
    assert "orders" in summary and "100" in summary and key in summary
    assert "0" in run(str(tmp_path), "--stream", "orders")
    wal = run(str(tmp_path), "--wal")
    assert "1 records" in wal and "graceful" in wal
    assert "ok" in run(str(tmp_path), "--object", key, "--verify")
    after = files(tmp_path)
    # SQLite may add its shared-memory and log files beside the database to read it; nothing else changes.
    sqlite_aux = {"meta.sqlite-wal", "meta.sqlite-shm"}
    assert {k: v for k, v in after.items() if k not in sqlite_aux} == before, "inspect changed a file"


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_inspect_shows_a_spark_written_object_with_its_real_placement(tmp_path: Path) -> None:
    from stratalog.engine.staging import commit_staged
    from stratalog.records import NewRecord
    from stratalog.spark.write import StagingWriter, WriteMessage

    store = StreamStore.open(tmp_path, config=small_store_config())
    store.create_stream("first")  # so the written stream's real id differs from its provisional one (0)
    writer = StagingWriter(store.object_store, "spark-staging/w/000000-")
    writer.add("orders", [NewRecord(b"x" * 10) for _ in range(7)])
    (staged,) = writer.finish()
    staged_view = run(str(tmp_path), "--object", staged.key, "--verify")
    assert "provisional object" in staged_view and "no metadata names this object" in staged_view
    commit_staged(store, [WriteMessage(0, (staged,))])
    orders = store.open_stream("orders").stream_id
    key = store.metadata.ranges(orders, 0)[0].key
    store.close()
    out = run(str(tmp_path), "--object", key, "--verify")
    assert "format version 3" in out and "provisional object" in out and "ok" in out
    row = next(line for line in out.splitlines() if "ok" in line)
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    assert (cells[0], cells[1], cells[2]) == ("0", "0", "7"), "the index as the task wrote it"
    assert (cells[7], cells[8], cells[9]) == (str(orders), "0", "7"), "the placement metadata gives it"


def test_inspect_shows_and_checks_a_queue_stores_run_objects(tmp_path: Path) -> None:
    """An upload and a merge's pieces are shown with their runs; --verify checks every page and names the
    first damaged one; a file that is no stratalog object gets a clear error, not a traceback."""
    config = small_queue_config(compact_fanout=2, upload_idle_s=0.01, upload_bytes_threshold=16 << 10,
                                compact_object_bytes_max=48 << 10)
    with QueueStore.open(tmp_path, config=config) as qs:
        for r in range(6):
            qs.put_many([f"q{q}" for q in range(300)], [bytes([r]) * (60 + q % 40) for q in range(300)])
            qs.flush()
            wait_until(lambda: not qs.stats()["log_cache_records"], f"round {r} to be uploaded")
        wait_until(lambda: not qs.compactor.retiring and qs.compactor.plan(qs.log_cache.view.objects) is None,
                   "the merges to settle")
        keys = [o.key for o in qs.log_cache.view.objects]
    pieces = [k for k in keys if "-" in k]
    assert len(pieces) >= 2, keys
    first = run(str(tmp_path), "--object", pieces[0], "--verify")
    assert "queue run object" in first and "names streams 0 .. 299" in first and "q0" in first
    assert "ok: the index and all" in first
    later = run(str(tmp_path), "--object", pieces[1], "--verify")
    assert "names no new stream" in later and "ok: the index and all" in later

    path = tmp_path / LOCAL_DIR_NAME / pieces[1]
    raw = bytearray(path.read_bytes())
    raw[5000] ^= 0x40   # page 1 of its runs
    path.write_bytes(raw)
    damaged = run(str(tmp_path), "--object", pieces[1], "--verify", exit_code=1)
    assert "pages failed their CRC (the first: page 1," in damaged
    (tmp_path / LOCAL_DIR_NAME / "queues" / "junk.slq").write_bytes(bytes(100))
    junk = run(str(tmp_path), "--object", "queues/junk.slq", exit_code=1)
    assert "neither a stream object" in junk and "Traceback" not in junk


def test_inspect_of_a_queue_store_shows_its_queues_and_run_objects(tmp_path: Path) -> None:
    config = small_queue_config(upload_idle_s=0.01, upload_bytes_threshold=16 << 10)
    with QueueStore.open(tmp_path, config=config) as qs:
        qs.put_many([f"q{q}" for q in range(120)], [bytes(200)] * 120)
        qs.flush()
        wait_until(lambda: not qs.stats()["log_cache_records"], "the puts to be uploaded")
        keys = [o.key for o in qs.log_cache.view.objects]
    shown = run(str(tmp_path))
    assert "queue store: 120 queues in" in shown and "0 streams" not in shown
    assert all(key in shown for key in keys)
    manifest = tmp_path / LOCAL_DIR_NAME / "queue-manifest"
    raw = bytearray(manifest.read_bytes())
    raw[-1] ^= 0xFF  # its CRC no longer matches
    manifest.write_bytes(raw)
    damaged = run(str(tmp_path), exit_code=1)
    assert "queue-manifest is damaged" in damaged and "Traceback" not in damaged

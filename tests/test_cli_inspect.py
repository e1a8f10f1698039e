"""`stratalog inspect` reads a store, its WAL and its objects without changing them."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from enginekit import abandon, small_store_config
from stratalog.cli import cli
from stratalog.commands import register_all
from stratalog.engine.store import StreamStore


def run(*args: str) -> str:
    register_all(cli, bench=cli.commands["bench"], chaos=cli.commands["chaos"])  # type: ignore[arg-type]
    result = CliRunner().invoke(cli, ["inspect", *args], catch_exceptions=False, terminal_width=200)
    assert result.exit_code == 0, result.output
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
    from stratalog.engine.batch import NewRecord
    from stratalog.spark.write import StagingWriter, WriteMessage, commit_write

    store = StreamStore.open(tmp_path, config=small_store_config())
    store.create_stream("first")  # so the written stream's real id differs from its provisional one (0)
    writer = StagingWriter(store.object_store, "spark-staging/w/000000-")
    writer.add("orders", [NewRecord(b"x" * 10) for _ in range(7)])
    (staged,) = writer.finish()
    staged_view = run(str(tmp_path), "--object", staged.key, "--verify")
    assert "provisional object" in staged_view and "no metadata names this object" in staged_view
    commit_write(store, [WriteMessage(0, (staged,))])
    orders = store.open_stream("orders").stream_id
    key = store.metadata.ranges(orders, 0)[0].key
    store.close()
    out = run(str(tmp_path), "--object", key, "--verify")
    assert "format version 2" in out and "provisional object" in out and "ok" in out
    row = next(line for line in out.splitlines() if "ok" in line)
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    assert (cells[0], cells[1], cells[2]) == ("0", "0", "7"), "the index as the task wrote it"
    assert (cells[7], cells[8], cells[9]) == (str(orders), "0", "7"), "the placement metadata gives it"

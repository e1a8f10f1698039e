"""Reading a broker, without a JVM or a broker: where the store is, the seam, offsets of micro-batches."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from stratalog.engine.manifest import BlockRef, Manifest, StreamInfo
from stratalog.engine.objformat import BlockEntry
from stratalog.kafka.aborted_ranges import AbortedTxn
from stratalog.objects.local import LocalDirStore
from stratalog.objects.uri import without_credentials
from stratalog.spark.broker_plan import TailPartition, plan_broker_read, read_ranges
from stratalog.spark.broker_source import EARLIEST, LATEST, BrokerRead, ObjectsPartition, parse_starting, share
from stratalog.spark.kafka_client import DataLossError, PartitionEnds
from stratalog.spark.location import StoreLocationError, locate
from stratalog.spark.plan import OffsetRange, ReadPartition


def manifest_of(streams: dict[str, tuple[int, int]], block_rows: int = 100) -> Manifest:
    """A manifest holding ``name -> (start, end)`` per stream, in blocks of ``block_rows``."""
    manifest = Manifest(seq=7)
    for stream_id, (name, (start, end)) in enumerate(sorted(streams.items())):
        manifest.streams[stream_id] = StreamInfo(stream_id, name, start, end)
        manifest.blocks[stream_id] = [
            BlockRef(f"data/{stream_id}.slo", BlockEntry(stream_id, a, min(a + block_rows, end), a, 100,
                                                         min(a + block_rows, end) - a, 0, 0))
            for a in range(start - start % block_rows, end, block_rows)]
    return manifest


def cover(plan: list[ReadPartition | TailPartition]) -> dict[str, list[tuple[str, int, int]]]:
    """Per stream, the (where, start, end) pieces the plan reads, in offset order."""
    out: dict[str, list[tuple[str, int, int]]] = {}
    for part in plan:
        if isinstance(part, TailPartition):
            out.setdefault(f"{part.topic}/{part.partition}", []).append(("broker", part.start, part.end))
        else:
            for piece in part.slices:
                out.setdefault(piece.name, []).append(("objects", piece.start_offset, piece.end_offset))
    return {name: sorted(pieces, key=lambda p: p[1]) for name, pieces in out.items()}


# The seam: one row per case.

def test_uploaded_offsets_come_from_objects_and_the_rest_from_the_broker() -> None:
    plan = plan_broker_read(manifest_of({"t/0": (0, 300)}), {("t", 0): (50, 700)}, rows_max=250, bytes_max=1 << 30)
    assert cover(plan) == {"t/0": [("objects", 50, 300), ("broker", 300, 550), ("broker", 550, 700)]}


def test_a_range_the_manifest_covers_whole_is_read_from_objects_only() -> None:
    plan = plan_broker_read(manifest_of({"t/0": (0, 300)}), {("t", 0): (10, 200)}, rows_max=1000, bytes_max=1 << 30)
    assert cover(plan) == {"t/0": [("objects", 10, 200)]}


def test_a_partition_not_in_the_manifest_is_read_from_the_broker() -> None:
    plan = plan_broker_read(manifest_of({"t/0": (0, 300)}), {("t", 1): (0, 40)}, rows_max=1000, bytes_max=1 << 30)
    assert cover(plan) == {"t/1": [("broker", 0, 40)]}


def test_without_a_manifest_everything_is_read_from_the_broker() -> None:
    plan = plan_broker_read(None, {("t", 0): (5, 40), ("u", 2): (0, 3)}, rows_max=1000, bytes_max=1 << 30)
    assert cover(plan) == {"t/0": [("broker", 5, 40)], "u/2": [("broker", 0, 3)]}


def test_a_range_trimmed_before_it_was_read_is_data_loss() -> None:
    manifest = manifest_of({"t/0": (200, 300)})
    with pytest.raises(DataLossError, match="t/0: offsets 100 to 199"):
        plan_broker_read(manifest, {("t", 0): (100, 400)}, rows_max=1000, bytes_max=1 << 30)
    plan = plan_broker_read(manifest, {("t", 0): (100, 400)}, rows_max=1000, bytes_max=1 << 30,
                            fail_on_data_loss=False)
    assert cover(plan) == {"t/0": [("objects", 200, 300), ("broker", 300, 400)]}


def test_read_ranges_apply_pushed_filters_to_partition_ends() -> None:
    ends = {("t", 0): PartitionEnds(0, 100), ("t", 1): PartitionEnds(20, 30), ("u", 0): PartitionEnds(0, 0)}
    assert read_ranges(ends) == {("t", 0): (0, 100), ("t", 1): (20, 30)}
    assert read_ranges(ends, OffsetRange(25, 50)) == {("t", 0): (25, 50), ("t", 1): (25, 30)}
    assert read_ranges(ends, labels=frozenset({"t/1"})) == {("t", 1): (20, 30)}


# Where the store is.

def test_locate_takes_a_broker_address_in_either_option() -> None:
    assert locate({"path": "kafka://127.0.0.1:9092"}).bootstrap == "127.0.0.1:9092"
    both = locate({"bootstrap": "h1:1, h2:2", "kafka.security.protocol": "SASL_SSL"})
    assert (both.bootstrap, both.objects, both.kafka) == ("h1:1,h2:2", None, {"security.protocol": "SASL_SSL"})
    assert locate({"kafka.bootstrap.servers": "h:1"}).bootstrap == "h:1"


@pytest.mark.parametrize("options, message", [
    ({}, "needs option 'path'"),
    ({"path": "kafka://nohost"}, "expected HOST:PORT"),
    ({"path": "kafka://h:1", "bootstrap": "h:2"}, "give the broker once"),
    ({"path": "http://example.com/x"}, "scheme 'http'"),
])
def test_locate_says_what_it_expected(options: dict[str, str], message: str) -> None:
    with pytest.raises(StoreLocationError, match=message):
        locate(options)


def test_locate_tells_a_data_directory_from_an_object_directory(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    LocalDirStore(data_dir / "objects").put("manifest/00000000000000000001.snapshot.json", b"{}")
    assert locate({"path": str(data_dir)}).objects == str(data_dir / "objects")
    assert locate({"path": str(data_dir / "objects")}).objects == str(data_dir / "objects")
    elsewhere = tmp_path / "served-with-s3"
    elsewhere.mkdir()
    (elsewhere / "meta.sqlite").write_bytes(b"")
    with pytest.raises(StoreLocationError, match="objects are not under objects/"):
        locate({"path": str(elsewhere)})
    with pytest.raises(StoreLocationError, match="does not exist"):
        locate({"path": str(tmp_path / "missing")})
    with pytest.raises(StoreLocationError, match="holds no store"):
        locate({"path": str(tmp_path)})


def test_the_advertised_object_store_carries_no_credentials(tmp_path: Path) -> None:
    assert without_credentials(None, tmp_path) == (tmp_path.absolute() / "objects").as_uri()
    uri = "s3://bucket/pre?endpoint=http%3A%2F%2F127.0.0.1%3A8333&access_key=AK&secret_key=SK&region=r"
    assert without_credentials(uri, tmp_path) == "s3://bucket/pre?endpoint=http%3A%2F%2F127.0.0.1%3A8333&region=r"


# Micro-batches.

def test_share_splits_a_budget_in_proportion_to_backlog() -> None:
    backlog = {("t", 0): 900, ("t", 1): 100, ("t", 2): 0}
    taken = share(100, backlog)
    assert taken == {("t", 0): 90, ("t", 1): 10, ("t", 2): 0}
    assert share(7, {("t", 0): 5, ("t", 1): 5}) == {("t", 0): 4, ("t", 1): 3}
    assert share(10_000, backlog) == backlog
    assert all(share(n, backlog)[tp] <= backlog[tp] for n in range(0, 1001, 37) for tp in backlog)
    assert all(sum(share(n, backlog).values()) == min(n, 1000) for n in range(0, 1200, 37))


def test_starting_offsets_take_kafka_source_forms() -> None:
    assert parse_starting(None) == EARLIEST
    assert parse_starting("LATEST") == LATEST
    assert parse_starting('{"t": {"0": 42, "1": -2}}') == {"t": {"0": 42, "1": -2}}
    for bad in ("soonest", "[1]", '{"t": 3}', '{"t": {"x": 1}}'):
        with pytest.raises(ValueError, match="startingOffsets"):
            parse_starting(bad)


def test_plans_travel_to_tasks_by_pickle() -> None:
    plan = plan_broker_read(manifest_of({"t/0": (0, 10)}), {("t", 0): (0, 20)}, rows_max=100, bytes_max=1 << 30)
    assert pickle.loads(pickle.dumps(plan)) == plan


def test_an_object_read_with_aborted_transactions_travels_by_pickle() -> None:
    (part,) = plan_broker_read(manifest_of({"t/0": (0, 10)}), {("t", 0): (0, 10)}, rows_max=100, bytes_max=1 << 30)
    assert isinstance(part, ReadPartition)
    value = ObjectsPartition("file:///x", part, ((0, (AbortedTxn(9, 4, 2),)),))
    assert pickle.loads(pickle.dumps(value)) == value


@pytest.mark.parametrize("options, level", [
    ({}, "read_committed"),
    ({"isolationlevel": "READ_UNCOMMITTED"}, "read_uncommitted"),
    ({"kafka.isolation.level": "read_uncommitted"}, "read_uncommitted"),
    ({"isolationlevel": "read_committed", "kafka.isolation.level": "read_committed"}, "read_committed"),
])
def test_reads_are_read_committed_unless_the_isolation_level_says_otherwise(options: dict[str, str],
                                                                           level: str) -> None:
    options = {"path": "kafka://127.0.0.1:9092", **options}
    source = BrokerRead(locate(options), options)
    assert (source.isolation, source.committed) == (level, level == "read_committed")
    assert "isolation.level" not in source.kafka, "the consumer gets it from read_tail, the admin client never"


@pytest.mark.parametrize("options, message", [
    ({"isolationlevel": "committed"}, "must be read_committed or read_uncommitted, not 'committed'"),
    ({"isolationlevel": "read_committed", "kafka.isolation.level": "read_uncommitted"}, "give one"),
])
def test_an_isolation_level_that_is_not_one_is_refused(options: dict[str, str], message: str) -> None:
    options = {"path": "kafka://127.0.0.1:9092", **options}
    with pytest.raises(ValueError, match=message):
        BrokerRead(locate(options), options)


def test_pipeline_retention_against_a_broker_says_the_broker_applies_it(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from stratalog.cli import cli

    refused = CliRunner().invoke(cli, ["pipeline", "retention", "kafka://127.0.0.1:9092"])
    assert refused.exit_code == 2 and "applies retention itself" in refused.output
    missing = CliRunner().invoke(cli, ["pipeline", "retention", str(tmp_path / "nowhere")])
    assert missing.exit_code == 2 and "not a store's data directory" in missing.output

"""The driver's commit speaks the broker's version of StratalogCommitStaged (ApiVersions first): v1 with a
broker of today, v0 with an older one (one answer for the whole request), and says so when a broker serves
no version it knows."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from stratalog.chaos.broker_process import BrokerProcess, start_broker
from stratalog.engine.staging import STAGING_PREFIX, StagedObject
from stratalog.kafka import staged_commit
from stratalog.kafka.client import KafkaConnection
from stratalog.objects.uri import LOCAL_DIR_NAME, open_object_store
from stratalog.records import NewRecord
from stratalog.spark.broker_write import (
    BrokerWriteError,
    commit_through_broker,
    commit_version,
    negotiated_commit_version,
)
from stratalog.spark.write import StagingWriter

OLDER_BROKER = Path(__file__).with_name("v0_commit_broker")
KEY = staged_commit.API_KEY


@pytest.mark.parametrize(("served", "expected"), [
    ((0, 1), 1),
    ((0, 0), 0),     # a broker from before per-partition answers
    ((0, 7), 1),     # a newer broker: the highest this driver knows
])
def test_the_driver_sends_the_highest_version_both_know(served: tuple[int, int], expected: int) -> None:
    assert negotiated_commit_version({KEY: served, 18: (0, 3)}) == expected


@pytest.mark.parametrize(("served", "said"), [
    ({18: (0, 3)}, "does not serve StratalogCommitStaged"),
    ({KEY: (2, 3), 18: (0, 3)}, "upgrade stratalog where Spark runs"),
])
def test_a_broker_with_no_version_the_driver_knows_is_named(served: dict[int, tuple[int, int]], said: str) -> None:
    with pytest.raises(BrokerWriteError, match=said):
        negotiated_commit_version(served)


def staged(data_dir: Path, write: str, partitions: range) -> list[tuple[int, tuple[StagedObject, ...]]]:
    """One task's objects of 10 records per partition of topic "t", staged in the broker's object storage."""
    store = open_object_store((data_dir / LOCAL_DIR_NAME).absolute().as_uri(), data_dir)
    writer = StagingWriter(store, f"{STAGING_PREFIX}{write}/000000-", split=True)
    for p in partitions:
        writer.add(f"t/{p}", [NewRecord(b"%s:%d:%d" % (write.encode(), p, i)) for i in range(10)])
    return [(0, writer.finish())]


def commit_twice(bootstrap: str, data_dir: Path) -> tuple[tuple[bool, int], tuple[bool, int]]:
    """A micro-batch's commit and its replay: (committed, records) of each."""
    first = commit_through_broker(bootstrap, {}, staged(data_dir, "a", range(3)), ("versions", 0))
    again = commit_through_broker(bootstrap, {}, staged(data_dir, "b", range(3)), ("versions", 0))
    return (first.committed, first.records), (again.committed, again.records)


@contextmanager
def serving(data_dir: Path, launcher: tuple[str, ...] = ()) -> Iterator[BrokerProcess]:
    """A broker with topic "t" of 3 partitions, stopped on the way out."""
    broker = start_broker(data_dir, launcher=launcher)
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic("t", 3)])["t"].result(30)
        yield broker
        assert broker.stop() == 0
    finally:
        broker.process.kill()
        broker.close_output()


def test_a_broker_of_today_is_sent_v1(tmp_path: Path) -> None:
    with serving(tmp_path / "data") as broker:
        with KafkaConnection(broker.bootstrap, {}) as connection:
            assert commit_version(connection) == 1
        assert commit_twice(broker.bootstrap, broker.data_dir) == ((True, 30), (False, 0))


def test_an_older_broker_is_sent_v0_and_its_one_answer_counts_for_every_partition(tmp_path: Path) -> None:
    path = os.pathsep.join(filter(None, [str(OLDER_BROKER), os.environ.get("PYTHONPATH")]))
    with serving(tmp_path / "data", ("env", f"PYTHONPATH={path}")) as broker:
        with KafkaConnection(broker.bootstrap, {}) as connection:
            assert commit_version(connection) == 0
        assert commit_twice(broker.bootstrap, broker.data_dir) == ((True, 30), (False, 0))

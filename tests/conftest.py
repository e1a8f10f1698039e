"""Shared fixtures: a real S3 server (SeaweedFS's ``weed mini``) on 127.0.0.1 and a local SparkSession, each
started once per session; a disk whose free space the test sets; a fresh event loop for in-process brokers; and
the order in which ``make test``'s workers take the modules."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from diskkit import FakeDisk, fake_disk
from stratalog.chaos.cluster_process import S3Endpoint, running_seaweedfs

#: The longest modules, longest first (``pytest --durations``, summed per module, on this 2-core machine):
#: they go out to the workers before every other (schedulekit.py), so the run does not wait at its end for
#: a long one that started last. The first is the streaming kill tests' (two Spark drivers each), the second
#: names the unit of the modules that share the SparkSession (schedulekit.py).
#: Re-order when a module's time changes much.
LONGEST_FIRST = ("test_spark_broker_stream", "test_broker_spark", "test_fuzz", "test_chaos_cluster",
                 "test_queue_compaction", "test_bench_cluster", "test_broker_kill9", "test_cluster_faults",
                 "test_app_quixstreams", "test_app_faust", "test_app_quixstreams_eos", "test_native_twins",
                 "test_example_clickstream",
                 "test_bench_kafka", "test_engine_kill9", "test_bench_abuse", "test_bench_produce_path",
                 "test_engine_crash_states", "test_cluster_failover_brokers", "test_wal_crash_states",
                 "test_broker_conformance", "test_kafka_python_suite", "test_queue_faults")


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """``--dist loadscope``: whole modules in collection order, the Spark modules as one (schedulekit.py)."""
    if config.getvalue("dist") != "loadscope":
        return None
    from schedulekit import ModuleScheduling

    return ModuleScheduling(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest modules first (LONGEST_FIRST), then the other modules with a slow test, then the rest
    (the order is otherwise kept): ``make test``'s workers take whole modules in this order. Also checks
    that schedulekit's list of the Spark modules names exactly those of the collection that use Spark."""
    from schedulekit import SPARK_SESSION_MODULES

    functions = [item for item in items if isinstance(item, pytest.Function)]
    slow = {item.module.__name__ for item in functions if item.get_closest_marker("slow")}
    collected = {item.module.__name__ for item in functions}
    using_spark = {item.module.__name__ for item in functions if "spark" in item.fixturenames}
    if using_spark != SPARK_SESSION_MODULES & collected:
        raise pytest.UsageError(f"schedulekit.SPARK_SESSION_MODULES must name the modules that use the spark "
                                f"fixture: add {sorted(using_spark - SPARK_SESSION_MODULES)}, remove "
                                f"{sorted((SPARK_SESSION_MODULES & collected) - using_spark)}")

    def rank(item: pytest.Item) -> tuple[int, int]:
        if not isinstance(item, pytest.Function):
            return 2, 0
        name = item.module.__name__
        if name in LONGEST_FIRST:
            return 0, LONGEST_FIRST.index(name)
        return (1 if name in slow else 2), 0

    items.sort(key=rank)


#: How to reach the session's SeaweedFS S3 gateway (the harness's own type: one way to start it).
SeaweedS3 = S3Endpoint


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """A fresh event loop, current while the test runs (for tests that drive a Broker in-process)."""
    made = asyncio.new_event_loop()
    asyncio.set_event_loop(made)
    yield made
    made.close()
    asyncio.set_event_loop(None)


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> FakeDisk:
    """Every store's look at its free space sees this disk (free bytes set by the test)."""
    return fake_disk(monkeypatch)


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    """A real S3 server (``weed mini``) on 127.0.0.1 ports of its own, one bucket, for the session."""
    with running_seaweedfs(tmp_path_factory.mktemp("seaweedfs")) as server:
        yield server


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """One local[2] SparkSession for the whole run, with the stratalog format registered (needs Java 17).

    Started on first use only, so runs without Spark tests never pay the JVM start (about 8 s).
    """
    from sparkconf import TEST_JVM_CONF
    from stratalog.spark import local_session

    session = local_session("local[2]", app_name="stratalog-tests", extra_conf={
        **TEST_JVM_CONF,
        "spark.local.dir": str(tmp_path_factory.mktemp("spark-local")),
        "spark.sql.warehouse.dir": str(tmp_path_factory.mktemp("spark-warehouse")),
    })
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()

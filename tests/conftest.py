"""Shared fixtures: a real S3 server (SeaweedFS's ``weed mini``) on 127.0.0.1, started once per session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from stratalog.chaos.cluster_process import S3Endpoint, running_seaweedfs


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules with a slow test run first (the order is otherwise kept): ``make test``'s workers take
    whole modules in this order, so the long ones start at once and the run does not wait at its end for
    one that started last."""
    slow = {item.module.__name__ for item in items
            if isinstance(item, pytest.Function) and item.get_closest_marker("slow")}
    items.sort(key=lambda item: not (isinstance(item, pytest.Function) and item.module.__name__ in slow))


#: How to reach the session's SeaweedFS S3 gateway (the harness's own type: one way to start it).
SeaweedS3 = S3Endpoint


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
    from stratalog.spark import local_session

    session = local_session("local[2]", app_name="stratalog-tests", extra_conf={
        "spark.local.dir": str(tmp_path_factory.mktemp("spark-local")),
        "spark.sql.warehouse.dir": str(tmp_path_factory.mktemp("spark-warehouse")),
    })
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()

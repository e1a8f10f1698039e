"""How ``make test`` shares the modules among its workers (pytest-xdist, ``--dist loadscope``).

Each module is one unit of work, so its module-scoped servers start once; the units go out in collection
order (conftest.py puts the longest modules first), not xdist's default of most tests first, which sent
the one-test modules of a minute or more out last and left the run waiting on them at its end. The
modules that use the session's SparkSession are one unit: one worker starts one JVM for all of them,
where each worker used to start its own (8 s on a quiet machine, 15-35 s under the suite's load). All but
the streaming kill tests (one broker, then three): they run alone (about 4 minutes, two drivers of their
own each besides the session), or the one unit would take 11-12 minutes on one worker, longer than the
rest of the suite on the other two.
"""

from __future__ import annotations

from typing import Any

from xdist.scheduler import LoadScopeScheduling

#: The modules whose tests use the ``spark`` fixture (conftest.py checks the list against the collection).
SPARK_SESSION_MODULES = frozenset({
    "test_broker_security", "test_broker_spark", "test_spark_broker_read", "test_spark_broker_stream",
    "test_spark_broker_write", "test_spark_jobs", "test_spark_materialize", "test_spark_queue_source",
    "test_spark_broker_s3", "test_spark_source", "test_spark_compacted", "test_spark_cluster",
})
SPARK_UNIT = "tests (one SparkSession)"
#: Spark modules that are a unit of their own (a second SparkSession, on the worker that runs them).
SPARK_ALONE = frozenset({"test_spark_broker_stream"})


def module_name(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return path.rsplit("/", 1)[-1].removesuffix(".py")


class ModuleScheduling(LoadScopeScheduling):  # type: ignore[misc]  # xdist publishes no type information
    """Whole modules to workers in collection order; the Spark modules as one unit."""

    def __init__(self, config: Any, log: Any = None) -> None:
        config.option.loadscopereorder = False
        super().__init__(config, log)

    def _split_scope(self, nodeid: str) -> str:
        name = module_name(nodeid)
        if name in SPARK_SESSION_MODULES and name not in SPARK_ALONE:
            return SPARK_UNIT
        return nodeid.split("::", 1)[0]

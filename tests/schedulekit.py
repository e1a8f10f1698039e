"""How ``make test`` shares the modules among its workers (pytest-xdist, ``--dist loadscope``).

Each module is one unit of work, so its module-scoped servers start once; the units go out in collection
order (conftest.py puts the longest modules first), not xdist's default of most tests first, which sent
the one-test modules of a minute or more out last and left the run waiting on them at its end. The
modules that use the session's SparkSession are one unit: one worker starts one JVM for all of them,
where each worker used to start its own (8 s on a quiet machine, 15-35 s under the suite's load). The
streaming kill tests (test_spark_broker_stream: one broker, then three) are not among them: they run two
drivers of their own each, and check what the drivers did without Spark (sparkstreamkit.py), so their
module is a unit of its own (about 4 minutes) beside the Spark unit.
"""

from __future__ import annotations

from typing import Any

from xdist.scheduler import LoadScopeScheduling

#: The modules whose tests use the ``spark`` fixture (conftest.py checks the list against the collection).
SPARK_SESSION_MODULES = frozenset({
    "test_broker_security", "test_broker_spark", "test_spark_broker_read", "test_spark_broker_write",
    "test_spark_jobs", "test_spark_materialize", "test_spark_queue_source", "test_spark_broker_s3",
    "test_spark_source", "test_spark_compacted", "test_spark_cluster",
})
SPARK_UNIT = "tests (one SparkSession)"


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
        if name in SPARK_SESSION_MODULES:
            return SPARK_UNIT
        return nodeid.split("::", 1)[0]
